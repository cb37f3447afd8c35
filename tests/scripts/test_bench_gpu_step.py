"""scripts/bench_gpu_step.py: the lease benchmark's CPU smoke run end to end (both workers,
interleaved rounds, the profile, the report, a --resume with nothing left to run) and its trace
reduction on a GPU-shaped trace. Times nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
B = load_script("bench_gpu_step")  # puts scripts/ on sys.path for its siblings
P = load_script("gpu_profile")
W = load_script("gpu_step_workers")


def test_smoke_run_interleaves_both_sides_and_resumes_with_nothing_to_do(tmp_path) -> None:
    argv = [sys.executable, str(REPO / "scripts" / "bench_gpu_step.py"), "--smoke",
            "--torch_modes", "eager", "--out_dir", str(tmp_path)]
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=900)
    rows = [json.loads(x) for x in (tmp_path / "gpu_step_rounds.jsonl").read_text().splitlines()]
    timed = sorted((r["name"], r["round"]) for r in rows if r["kind"] == "time")
    names = ("tiny:8:xla", "tiny:8:xla:cublas", "torch:tiny:8:eager")
    assert timed == sorted((n, i) for n in names for i in (0, 1))
    assert all(r["step_s"] > 0 for r in rows if r["kind"] == "time")
    assert sum(r["kind"] == "peak" for r in rows) == 2
    report = json.loads((tmp_path / "gpu_step.json").read_text())
    ours = {r["round"]: r["step_s"] for r in rows if r["kind"] == "time"
            and r["name"] == "tiny:8:xla"}
    theirs = {r["round"]: r["step_s"] for r in rows if r["kind"] == "time"
              and r["name"] == "torch:tiny:8:eager"}
    ratio = report["variants"]["tiny:8:xla"]["vs_eager"]
    assert sorted([ratio["min"], ratio["max"]]) == sorted(theirs[i] / ours[i] for i in (0, 1))
    profile = report["profiles"]["tiny:8:xla"]["profile"]
    assert profile["kernel_ms_per_step"] > 0 and profile["top"]
    assert {"forward", "backward"} <= set(profile["by_region_ms"])
    assert (tmp_path / "bundle.tar").exists()  # the optimised HLO, for --render --hlo_tar
    md = (tmp_path / "gpu_step.md").read_text()
    assert "| tiny | 8 | xla | cublas |" in md and "Where the step's time goes" in md
    out = subprocess.run([*argv, "--resume"], check=True, capture_output=True, text=True,
                         timeout=300).stdout
    assert '"kind": "time"' not in out
    again = json.loads((tmp_path / "gpu_step.json").read_text())
    assert again["variants"] == report["variants"]
    assert again["profiles"]["tiny:8:xla"]["profile"] == profile


def test_variants_ready_after_the_rounds_began_get_catch_up_rounds(tmp_path) -> None:
    """--ready_by 0: the rounds start before anything has compiled, so every variant is timed in
    catch-up rounds (numbered after --rounds), interleaved, until each has --rounds timings."""
    argv = [sys.executable, str(REPO / "scripts" / "bench_gpu_step.py"), "--smoke", "--torch",
            "", "--profile", "", "--ready_by", "0", "--out_dir", str(tmp_path)]
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=900)
    rows = [json.loads(x) for x in (tmp_path / "gpu_step_rounds.jsonl").read_text().splitlines()]
    timed = [(r["name"], r["round"]) for r in rows if r["kind"] == "time"]
    for name in ("tiny:8:xla", "tiny:8:xla:cublas"):
        assert sum(n == name for n, _ in timed) >= 2
    assert min(rnd for _, rnd in timed) >= 2  # nothing was ready in rounds 0 and 1


BWD = 'op_name="jit(step)/transpose(jvp(M))/encoder/layers_0/mlp/mul"'
FWD = 'op_name="jit(step)/jvp(M)/encoder/layers_0/pre_mlp_layer_norm/reduce_sum"'
HLO = f"""HloModule jit_step
ENTRY %main (p0: bf16[8,64]) -> bf16[8,64] {{
  %p0 = bf16[8,64]{{1,0}} parameter(0), metadata={{op_name="x"}}
  %loop_add_fusion.11 = bf16[8,64]{{1,0}} fusion(%p0), kind=kLoop, calls=%f, metadata={{{BWD}}}
  ROOT %input_reduce_fusion.3 = f32[8]{{0}} fusion(%p0), kind=kInput, metadata={{{FWD}}}
}}
"""


def _trace() -> list[dict]:
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7,
             "args": {"name": "Stream #7(Compute)"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 9, "args": {"name": "XLA Ops"}}]
    kernels = []
    for step in range(2):  # two steps; CUDA-graph kernels carry the command buffer as hlo_op
        t = 1000.0 * step
        kernels += [
            {"ph": "X", "pid": 1, "tid": 7, "ts": t, "dur": 100.0,
             "name": "loop_add_multiply_fusion_11", "args": {"hlo_op": "command_buffer_1"}},
            {"ph": "X", "pid": 1, "tid": 7, "ts": t + 100, "dur": 50.0,
             "name": "input_reduce_fusion_3", "args": {"hlo_op": "input_reduce_fusion.3"}},
            {"ph": "X", "pid": 1, "tid": 7, "ts": t + 200, "dur": 300.0,
             "name": "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16",
             "args": {"hlo_op": "command_buffer_1"}},
            {"ph": "X", "pid": 1, "tid": 7, "ts": t + 500, "dur": 200.0,
             "name": "nvjet_sm90_tst_128x160_64x5_2x1_v_bz_NNT", "args": {}},
            # derived lines and host events are not kernels
            {"ph": "X", "pid": 1, "tid": 9, "ts": t, "dur": 700.0, "name": "fusion.1"},
            {"ph": "X", "pid": 2, "tid": 1, "ts": t, "dur": 900.0, "name": "PjitFunction"}]
    return meta + kernels


def test_a_gpu_trace_reduces_to_kernels_by_kind_and_region() -> None:
    hlo = HLO.replace("loop_add_fusion.11", "loop_add_multiply_fusion.11")
    red = P.reduce_trace(_trace(), P.hlo_index(hlo), steps=2, wall_s=0.0008)
    assert red["kernels_per_step"] == 4
    assert abs(red["kernel_ms_per_step"] - 0.65) < 1e-9
    assert abs(red["busy_ms_per_step"] - 0.65) < 1e-9
    assert red["by_kind_ms"] == pytest.approx({"attention (cuDNN)": 0.3, "gemm (cuBLAS)": 0.2,
                                 "elementwise fusion": 0.1, "reduction fusion": 0.05})
    rows = {r["kernel"]: r for r in red["top"]}
    assert rows["loop_add_multiply_fusion_11"]["region"] == "backward"
    assert rows["loop_add_multiply_fusion_11"]["hlo_op"] == "loop_add_multiply_fusion.11"
    assert rows["input_reduce_fusion_3"]["region"] == "forward"
    assert not rows["nvjet_sm90_tst_128x160_64x5_2x1_v_bz_NNT"]["matched"]


def test_reclassify_moves_rows_between_kinds_and_keeps_the_total() -> None:
    red = P.reduce_trace(_trace(), {}, steps=2, wall_s=0.0008)
    for r in red["top"]:  # as an older rule labelled them
        red["by_kind_ms"][r["kind"]] -= r["ms_per_step"]
        r["kind"] = "other"
    red["by_kind_ms"]["other"] = 0.65
    hlo = HLO.replace("loop_add_fusion.11", "loop_add_multiply_fusion.11")
    fixed = P.reclassify(red, hlo)
    assert fixed["by_kind_ms"]["attention (cuDNN)"] == pytest.approx(0.3)
    assert abs(sum(fixed["by_kind_ms"].values()) - 0.65) < 1e-9
    assert fixed["top_by_region_ms"]["backward"] == pytest.approx(0.1)


def test_variant_names_are_checked() -> None:
    v = B.parse_variant("base:128:cudnn:cublas")
    assert (v["model"], v["batch"], v["attention"], v["options"]) == (
        "t5_1_1_base", 128, "cudnn", "cublas")
    assert B.parse_variant("base:128:pallas_hopper")["attention"] == "pallas_hopper"
    assert W.OPTIMIZER_OPTIONS[B.parse_variant("base:128:cudnn:multi_tensor")["options"]] == {
        "multi_tensor": True}
    cfg = B.bench_train.model_config("tiny", "bfloat16", "pallas_hopper")
    assert (cfg.attention_impl, cfg.flash_backend) == ("pallas", "mosaic_gpu")
    for bad in ("base:128", "huge:8:xla", "base:8:flash", "base:8:xla:turbo"):
        try:
            B.parse_variant(bad)
        except ValueError as err:
            assert bad in str(err)
        else:
            raise AssertionError(bad)
    assert [t["mode"] for t in B.parse_torch("small:32")] == ["eager", "compile"]


def test_the_committed_h100_report_rebuilds_byte_identically(tmp_path) -> None:
    """benchmarks/h100/gpu_step.md is what --render makes of the lease's JSON and HLO (the
    profiles reclassified, the step model calibrated against them)."""
    h100 = REPO / "benchmarks" / "h100"
    (tmp_path / "gpu_step.json").write_text((h100 / "gpu_step.json").read_text())
    B.render(tmp_path, str(h100 / "raw" / "gpu_step_hlo.tar"))
    assert (tmp_path / "gpu_step.md").read_text() == (h100 / "gpu_step.md").read_text()
    cal = json.loads((tmp_path / "gpu_step.json").read_text())["profiles"]["base:128:cudnn"]
    gemm = cal["step_model"]["by_kind"]["gemm"]
    assert 0.8 < gemm["ratio"] < 1.25  # GEMMs run at their roofline on the H100
