"""scripts/bench_noise_floor.py at the micro scale: real cells, real extra fine-tunes."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROWS = "table2:Enc-dec 6 layers | Denoising,table2:Enc-dec 6 layers | LM"


def _run(tmp_path: Path) -> dict:
    argv = [sys.executable, str(ROOT / "scripts" / "bench_noise_floor.py"), "--scale=micro",
            "--seeds=2", "--parallel=2", f"--rows={ROWS}", f"--sweep_dir={tmp_path / 'sweep'}",
            f"--out={tmp_path / 'noise'}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((tmp_path / "noise.json").read_text())


def test_noise_floor_separates_fine_tuning_seeds_and_resumes(tmp_path):
    data = _run(tmp_path)
    assert data["seeds"] == 2 and list(data["rows"]) == ROWS.split(",")
    for name, row in data["rows"].items():
        sweep, finetune = row["sweep_seeds"], row["finetune_seeds"]
        assert len(sweep["suite"]["values"]) == len(finetune["suite"]["values"]) == 2, name
        # both sets start from the sweep's own seed-0 cell
        assert sweep["suite"]["values"][0] == finetune["suite"]["values"][0]
        a, b = sweep["suite"]["std"], finetune["suite"]["std"]
        assert abs(row["pretrain_seed_std"]["suite"] ** 2 - max(0.0, a * a - b * b)) < 1e-6
        assert row["test_sample_std"]["suite"] > 0
        t = row["seconds_per_cell"]
        assert row["timed_cells"] == 2 and t["pretrain_steps"] > 0 and t["scoring"] > 0
        parts = t["pretrain_steps"] + t["pretrain_rest"] + t["finetune"] + t["scoring"]
        assert abs(parts + t["evaluate_rest"] - t["total"]) < 1.0
        # the extra fine-tune really ran with seed 1 on the seed-0 checkpoint
        cell = tmp_path / "sweep" / "cells" / row["cells"][0]
        config = (cell / "eval_ft1" / "finetune" / "downstream_spam" / "config.gin").read_text()
        assert "train.seed = 1" in config
        assert str(cell / "pretrain") in config
    d = data["difference"]
    assert d["ci"][0] <= d["ci"][1] and d["rows"] == ROWS.split(",")
    md = (tmp_path / "noise.md").read_text()
    assert "std, fine-tuning seeds" in md and data["machine"] in md
    assert "Where a cell's time goes" in md and "cells run 2 at a time" in md
    # a rerun reuses every finished cell and fine-tune
    logs = sorted((tmp_path / "sweep" / "cells").glob("*/*.log"))
    before = {p: p.stat().st_size for p in logs}
    again = _run(tmp_path)
    assert {p: p.stat().st_size for p in logs} == before
    assert again["rows"] == data["rows"]
