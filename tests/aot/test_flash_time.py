"""The flash kernels' latency model: loop trips from the kernels' own bounds, the HLO-to-kernel map
of an XLA dump, the fit, and the committed constants against the loan's data."""

from __future__ import annotations

import json
import pathlib

import pytest

from t5x_like.aot import flash_time

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kind,causal,lq,lk,bq,bk,segments,trips", [
    ("fwd", False, 512, 512, 128, 128, 1, 4),  # every k block
    ("dq", False, 512, 512, 128, 64, 2, 4),  # two segments: half of the 8 k blocks
    ("dkdv", False, 512, 512, 128, 64, 2, 2),  # half of the 4 q blocks
    ("dq", False, 128, 512, 128, 64, 2, 8),  # a q block holding both segments sees all keys
    ("fwd", True, 512, 512, 128, 128, 1, 2.5),  # causal: 1, 2, 3, 4 k blocks
    ("dkdv", True, 512, 512, 128, 128, 1, 2.5),  # causal: 4, 3, 2, 1 q blocks
    ("dq", True, 128, 128, 128, 64, 2, 2),  # the diagonal block reaches both k blocks
])
def test_loop_trips_follow_the_kernels_bounds(kind, causal, lq, lk, bq, bk, segments,
                                              trips) -> None:
    assert flash_time.loop_trips(kind, causal, lq, lk, bq, bk, segments) == trips


@pytest.mark.parametrize("kind,causal,lq,lk,bq,bk,segments,share", [
    ("fwd", False, 512, 512, 128, 128, 1, 0.0),  # unpacked: no segment test to skip
    ("dq", False, 512, 512, 128, 64, 2, 1.0),  # boundary at 256: every visited tile inside one
    ("dq", False, 512, 512, 128, 64, 3, 4 / 18),  # ids change at 171, 342: q blocks 1, 2 mix
    ("fwd", True, 512, 512, 128, 128, 2, 1.0),  # causal, 2 segments: 3 visited tiles, all inside
    ("dkdv", False, 384, 384, 128, 128, 2, 2 / 7),  # the middle block mixes: 2 of 7 clean
])
def test_one_segment_share_counts_tiles_inside_one_example(kind, causal, lq, lk, bq, bk,
                                                           segments, share) -> None:
    got = flash_time.one_segment_share(kind, causal, lq, lk, bq, bk, segments)
    assert got == pytest.approx(share)


def test_tiles_inside_one_example_issue_the_loop_without_its_segment_test() -> None:
    plain = flash_time.FlashKernel("k", "dq", "s", calls=12, ctas=6144, trips=4,
                                   loop_instructions=400, warps=8)
    # 400 = 260 common + a 100-instruction mask with segments | 40 without (a causal test)
    skips = flash_time.FlashKernel("k", "dq", "s", calls=12, ctas=6144, trips=4,
                                   loop_instructions=400, warps=8, segment_branch=100,
                                   one_segment_branch=40, one_segment_share=0.25)
    assert skips.issued_per_trip() == pytest.approx(260 + 0.75 * 100 + 0.25 * 40)
    assert skips.features()[1] == pytest.approx(plain.features()[1] * 345 / 400)


def test_loop_trips_need_whole_blocks() -> None:
    with pytest.raises(ValueError, match="not whole"):
        flash_time.loop_trips("fwd", False, 500, 512, 128, 128)


def test_fit_recovers_the_constants_it_was_made_with() -> None:
    truth = {"cycles_per_cta": 5000.0, "issue_multiple": 3.0}
    kernels = [flash_time.FlashKernel("k", "fwd", "s", calls=12, ctas=ctas, trips=trips,
                                      loop_instructions=loop, warps=8)
               for ctas, trips, loop in ((1536, 1, 900), (6144, 2, 700), (12288, 1, 500))]
    fitted = flash_time.fit(kernels, [k.ms(truth) for k in kernels])
    assert fitted == pytest.approx(truth, rel=1e-6)
    waves, issue = kernels[0].features()
    assert waves == pytest.approx(12 * 1536 / 132)
    assert issue == pytest.approx(waves * 900 * 8 / 4)


def _pallas_call(name: str, layer: int) -> str:
    """One layer's forward flash call as XLA:GPU prints it (grid (2, 4, 4), 8 warps), inside
    `flash._jitted`'s jit(forward) scope."""
    return (f'  %{name} = (bf16[2,512,4,64]{{3,2,1,0}}, f32[2,4,512]{{2,1,0}}) '
            'custom-call(%p0, %p0, %p0, %p1, %p1), custom_call_target="__gpu$xla.gpu.triton", '
            'metadata={op_name="jit(step)/jvp(EncoderDecoder)/encoder/'
            f'layers_{layer}/attention/jit(forward)/t5x_like_flash_fwd/pallas_call"}}, '
            'backend_config='
            '{debug = false, grid_x = 2 : i32, grid_y = 4 : i32, grid_z = 4 : i32, '
            'name = "t5x_like_flash_fwd", num_stages = 2 : i32, num_warps = 8 : i32}\n')


_HLO = ("HloModule jit_step\n\n"
        "ENTRY %main (p0: bf16[2,512,4,64], p1: s32[2,512]) -> bf16[2,512,4,64] {\n"
        "  %p0 = bf16[2,512,4,64]{3,2,1,0} parameter(0)\n"
        "  %p1 = s32[2,512]{1,0} parameter(1)\n"
        + _pallas_call("pallas_call.7", 0) + _pallas_call("pallas_call.9", 1)
        + "  %loop_add_fusion = bf16[2,512,4,64]{3,2,1,0} add(%p0, %p0)\n"
        "  ROOT %gte = bf16[2,512,4,64]{3,2,1,0} get-tuple-element(%pallas_call.9), index=0\n"
        "}\n")
_SEQUENCE = "".join(
    f"{i:03d}: kCustomKernel   [source           | next=00{i + 1} (1)    ] {kernel} grid: "
    f"{grid} threads: [{threads}, 1, 1]  shared_memory: 0 bytes\n"
    for i, kernel, grid, threads in ((1, "loop_add_fusion", "[8, 1, 1]", 128),
                                     (2, "t5x_like_flash_fwd__1", "[2, 4, 4]", 256),
                                     (3, "t5x_like_flash_fwd__1", "[2, 4, 4]", 256)))
_METADATA = "".join(
    f'thunk_metadata {{\n  thunk_info {{\n    profile_annotation: "{op}"\n    thunk_id: {i}\n'
    f'  }}\n  thunk_kind: "kCustomKernel"\n}}\n'
    for i, op in ((1, "loop_add_fusion"), (2, "pallas_call.7"), (3, "pallas_call.9")))


def test_step_kernels_read_an_xla_dump(tmp_path) -> None:
    (tmp_path / "module_0001.jit_step.thunk_sequence.txt").write_text(_SEQUENCE)
    (tmp_path / "module_0001.jit_step.thunk_metadata.txt").write_text(_METADATA)
    assert flash_time.hlo_kernel_names(str(tmp_path)) == {
        "loop_add_fusion": "loop_add_fusion", "pallas_call.7": "t5x_like_flash_fwd__1",
        "pallas_call.9": "t5x_like_flash_fwd__1"}
    report = {"t5x_like_flash_fwd__1": {"loop_instructions": 800, "threads": 256,
                                        "mask_branches": [200, 0]}}
    (k,) = flash_time.step_kernels(_HLO, str(tmp_path), report, "sm_90", segments=2)
    # two layers' calls of one kernel at one site; q blocks of 512 / 4, k blocks of sm_90's
    # forward default (128): two of the four k blocks share a segment with each q block
    assert (k.kernel, k.kind, k.calls, k.ctas, k.trips, k.loop_instructions, k.warps) == (
        "t5x_like_flash_fwd__1", "fwd", 2, 32, 2, 800, 8)
    assert k.site.endswith("encoder/layers_*/attention")  # the jit(forward) scope dropped
    # two segments on 128-blocks: every visited tile lies inside one, none takes the mask
    assert (k.one_segment_share, k.issued_per_trip()) == (1.0, 600)
    model = {"predicted_ms": 10.0, "by_kind_ms": {"attention": 1.0},
             "model_flops": 1e12, "device": {"peak_bf16_flops": 1e15}}
    summary = flash_time.step_summary([k], model, 2)
    assert summary["predicted_ms"] == pytest.approx(9.0 + k.ms())
    assert summary["mfu"] == pytest.approx(1e12 / (summary["predicted_ms"] / 1e3) / 1e15)
    assert "fwd__1" in flash_time.format_summary(summary)
    assert "600 issued" in flash_time.format_summary(summary)


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_flash_step_model", ROOT / "scripts" / "bench_flash_step_model.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_committed_constants_are_the_fit_on_the_loan() -> None:
    """`H100_FIT` is what `scripts/bench_flash_step_model.py` fits on the committed data: the
    loan's kernels and their measured times, kept in the report's `loan` section."""
    bench = _bench()
    loan = json.loads((ROOT / "benchmarks/flash_step_model.json").read_text())["loan"]
    measured = loan["measured_ms"]
    kernels = [flash_time.FlashKernel(**k) for k in loan["kernels"]]
    assert len(kernels) == 9 and all(k.kernel in measured for k in kernels)
    fitted = [k for k in kernels if bench.in_fit(k)]
    assert len(fitted) == 7  # the two T5-table dQ kernels are out
    fit = flash_time.fit(fitted, [measured[k.kernel] for k in fitted])
    assert fit == pytest.approx(flash_time.H100_FIT, rel=2e-3)


def test_the_committed_report_is_its_json_rendered() -> None:
    bench = _bench()
    result = json.loads((ROOT / "benchmarks/flash_step_model.json").read_text())
    assert (ROOT / "benchmarks/flash_step_model.md").read_text() == bench.markdown(result)
    assert result["fit"] == pytest.approx(flash_time.H100_FIT, rel=2e-3)


def test_a_later_loans_profile_checks_each_current_kernel() -> None:
    bench = _bench()
    result = json.loads((ROOT / "benchmarks/flash_step_model.json").read_text())
    now = {"flash_model": {"kernels": result["now"]["kernels"]},
           "step_model": {"predicted_ms": 100.0, "by_kind_ms": {"attention": 10.0}}}
    check = {"name": "a later loan", "profile": {"kernel_ms_per_step": 50.0, "top": [
        {"kernel": "t5x_like_flash_fwd", "ms_per_step": 2.0},
        {"kernel": "nvjet_gemm", "ms_per_step": 9.0}]}}
    out = bench.build(result["loan"], now, check)
    assert out["fit"] == result["fit"]  # the fit reads the loan section, not the later profile
    rows = {k["kernel"]: k for k in out["check"]["kernels"]}
    assert len(rows) == 9 and rows["t5x_like_flash_fwd"]["measured_ms"] == 2.0
    assert sum(k["measured_ms"] is None for k in rows.values()) == 8
    fwd = rows["t5x_like_flash_fwd"]
    text = bench.markdown(out)
    assert "Checked against a later loan** (a later loan; 50.0 ms" in text
    assert f"| {fwd['predicted_ms']:.2f} | 2.00 | {2.0 / fwd['predicted_ms']:.2f} |" in text
