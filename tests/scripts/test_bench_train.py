"""scripts/bench_train.py end to end on the tiny model: one round of every worker (matmul peak,
ours, PyTorch), the traced profile, the report built from them, and a --resume that has nothing
left to run. Times nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_one_round_on_the_tiny_model_writes_ratio_and_profile(tmp_path) -> None:
    argv = [sys.executable, str(REPO / "scripts" / "bench_train.py"), "--models", "tiny",
            "--rounds", "1", "--steps", "1", "--batch", "4", "--out_dir", str(tmp_path)]
    subprocess.run([*argv, "--profile"], check=True, capture_output=True, text=True,
                   timeout=600)
    workers = (tmp_path / "train_rounds.jsonl").read_text().splitlines()
    assert sorted(json.loads(w)["side"] for w in workers) == ["ours", "peak", "torch"]
    # --resume with every worker already measured runs none of them and reports the same.
    first = json.loads((tmp_path / "train.json").read_text())
    md = (tmp_path / "train.md").read_text()
    out = subprocess.run([*argv, "--resume"], check=True, capture_output=True, text=True,
                         timeout=600).stdout
    assert '"side"' not in out
    assert (tmp_path / "train_rounds.jsonl").read_text().splitlines() == workers
    assert json.loads((tmp_path / "train.json").read_text())["models"] == first["models"]
    report = first
    tiny = report["models"]["tiny"]
    assert tiny["batch"] == 4 and tiny["lengths"] == {"inputs": 64, "targets": 64}
    ours, theirs = tiny["step_s"]["median"], tiny["torch"]["step_s"]["median"]
    assert ours > 0 and theirs > 0
    assert abs(tiny["ratio_torch_over_ours"]["median"] - theirs / ours) < 1e-9
    assert report["peak_gflops"]["median"] > 0 and 0 < tiny["fraction_of_peak"]
    profile = report["profiles"][0]
    regions = {key.split(" | ")[0] for key in profile["thunk_s"]}
    assert {"forward", "backward", "optimizer"} <= regions
    assert any("matmul" in key for key in profile["thunk_s"])
    assert 0 < profile["busy_s"] <= profile["thunk_sum_s"] + 1e-9
    assert "| tiny | 4 | 64/64 |" in md and "Where the step's time goes: tiny" in md
