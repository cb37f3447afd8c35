"""`scripts/bench_flash_instructions.py`: the tile counting behind its per-tile prediction."""

from __future__ import annotations

import importlib.util
import pathlib

SCRIPT = pathlib.Path(__file__).parents[2] / "scripts" / "bench_flash_instructions.py"
spec = importlib.util.spec_from_file_location("bench_flash_instructions", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_window_share_falls_with_length() -> None:
    # At 512 tokens (128 x 64 tiles, T5's buckets, saturated beyond offset 90) 6 of 8 k blocks
    # are near the diagonal; at 8192 only the band around it: about (2 x 91 + 192) / 64 of 128.
    near = bench.window_share(512, 128, 64, True)
    far = bench.window_share(8192, 128, 64, True)
    assert 0.7 < near < 0.8 and 0.04 < far < 0.05
    assert bench.window_share(8192, 128, 64, False) > far  # fewer tiles, the same band below


def test_markdown_names_the_device_and_says_it_is_not_a_timing() -> None:
    r = {"arch": "sm_90", "head_dim": 64, "jax": "0.10.2", "ptxas": "V12.9", "kernels": {
        "triton/rel": {"bwd_dq": {"total": 1121, "loop": 448, "whole_loop": 4502,
                                  "store_block": 25, "row_sum_block": 49}}},
        "dq_per_tile": [{"backend": "triton", "length": 512, "mask": "causal", "tile": [128, 64],
                         "stored_share": 0.9, "t5_per_tile": 512, "plain_per_tile": 294,
                         "t5_over_plain": 1.74}]}
    md = bench.markdown(r)
    assert "sm_90" in md and "not timings" in md
    assert "| triton/rel | bwd_dq | 1,121 | 448 | 4,502 |" in md
    assert "| triton | 512 | causal | 128x64 | 90% | 512 | 294 | 1.74 |" in md
