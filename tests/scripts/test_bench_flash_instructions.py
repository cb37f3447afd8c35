"""`scripts/bench_flash_instructions.py`: the tile counting behind its per-tile prediction."""

from __future__ import annotations

import importlib.util
import pathlib

SCRIPT = pathlib.Path(__file__).parents[2] / "scripts" / "bench_flash_instructions.py"
spec = importlib.util.spec_from_file_location("bench_flash_instructions", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_thresholds_inside_tiles_near_and_far_from_the_diagonal() -> None:
    # One 64 x 64 tile spans offsets -63..63: every threshold of T5's bidirectional runs within
    # that band (31 run starts, from -90; those inside (-63, 63]) and none beyond it.
    tiles, inside = bench.thresholds_inside(64, 64, 64, True)
    assert tiles == 1 and 20 <= inside <= 30
    # Far from the diagonal (length 8192) most tiles hold no threshold.
    tiles, far = bench.thresholds_inside(8192, 128, 64, True)
    assert tiles == 64 * 128 and far < 1.0
    # Causal: only tiles on or below the diagonal, and only one side's thresholds.
    tiles, causal = bench.thresholds_inside(512, 128, 64, False)
    assert tiles == sum(min(8, (q0 + 127) // 64 + 1) for q0 in range(0, 512, 128))
    assert 0 < causal < inside


def test_markdown_names_the_device_and_says_it_is_not_a_timing() -> None:
    r = {"arch": "sm_90", "head_dim": 64, "jax": "0.10.2", "ptxas": "V12.9", "kernels": {
        "triton/rel": {"bwd_dq": {"total": 5644, "loop": 901, "threshold": 140}}},
        "dq_per_tile": [{"backend": "triton", "length": 512, "mask": "causal", "tile": [128, 64],
                         "tiles": 20, "thresholds_inside": 3.5, "t5_per_tile": 1391,
                         "plain_per_tile": 629, "t5_over_plain": 2.21}]}
    md = bench.markdown(r)
    assert "sm_90" in md and "not timings" in md
    assert "| triton/rel | bwd_dq | 5,644 | 901 | 140 |" in md
    assert "| triton | 512 | causal | 128x64 | 20 | 3.5 | 1,391 | 629 | 2.21 |" in md
