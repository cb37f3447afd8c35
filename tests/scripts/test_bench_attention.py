"""scripts/bench_attention.py in its CPU smoke mode: every implementation is checked against the
float32 reference, timed in interleaved rounds with a per-round ratio to ours, and --resume
skips the shapes already in attention.jsonl. Times nothing."""

from __future__ import annotations

import json

from tests.scripts import load_script


def _bench():
    return load_script("bench_attention")


def test_smoke_rows_errors_ratios_and_resume(tmp_path) -> None:
    bench = _bench()
    argv = ["--smoke", "--lengths", "48", "--t5", "yes", "--rounds", "2", "--out-dir",
            str(tmp_path), "--label", "smoke"]
    rows = bench.main(argv)
    assert [(r["impl"], r["causal"]) for r in rows] == [
        ("pallas", False), ("xla", False), ("pallas", True), ("xla", True)]
    for row in rows:
        assert "error" not in row, row
        assert row["label"] == "smoke" and row["t5_bias"]
        # bf16 inputs: both implementations land within bf16 rounding of the fp32 reference
        assert all(0 < row[f"err_{g}"] < 2e-2 for g in ("o", "dq", "dk", "dv")), row
        assert len(row["fwd_bwd_ms_rounds"]) == 2 and row["fwd_bwd_ms"] > 0
    xla = rows[1]
    ratios = [a / b for a, b in zip(xla["fwd_bwd_ms_rounds"], rows[0]["fwd_bwd_ms_rounds"],
                                    strict=True)]
    assert abs(xla["speedup_fwd_bwd"] - sorted(ratios)[0] / 2 - sorted(ratios)[1] / 2) < 1e-9
    md = (tmp_path / "attention.md").read_text()
    assert "| xla | 48 | 2 | 2 | 32 | True | True |" in md and "NOT a benchmark" in md
    # A resumed run measures nothing new and reports the same rows.
    log = (tmp_path / "attention.jsonl").read_text()
    again = bench.main([*argv, "--resume"])
    assert (tmp_path / "attention.jsonl").read_text() == log
    assert json.dumps(again, sort_keys=True) == json.dumps(rows, sort_keys=True)


def test_hopper_implementation_runs_the_mosaic_gpu_kernels() -> None:
    """`pallas_hopper` (timed on sm_90 leases) is our kernel with its Mosaic GPU kernels: here in
    the GPU interpreter, its output and gradients within bf16 rounding of the fp32 reference."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    bench = _bench()
    rng = np.random.default_rng(0)
    q, k, v, do = (jnp.asarray(rng.standard_normal((1, 130, 2, 64)), jnp.bfloat16)
                   for _ in range(4))
    table = jnp.asarray(rng.standard_normal((32, 2)), jnp.float32)
    attn = bench.make_impl("pallas_hopper", True, 130, 0.125, None, (None, None))
    out, grads = jax.jit(bench._fwd_bwd(attn))(q, k, v, table, do)
    errors = bench.reference_errors(out, grads[:3], (q, k, v, do), table, causal=True,
                                    sm_scale=0.125)
    assert all(0 < e < 2e-2 for e in errors.values()), errors
