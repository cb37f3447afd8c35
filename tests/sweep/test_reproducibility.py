"""Same seed, same numbers: a sweep cell gives bitwise the same pre-training losses and
downstream scores when it runs alone, beside another cell on the same cores (`--parallel`), from
a warm compilation cache, and killed (-9) mid-run then resumed by rerunning the sweep."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from t5x_like.sweep import runner

T2 = "gin/sweeps/t5_table2_architectures.gin"
ROW = "Encoder-decoder | Denoising"


MICRO = Path(__file__).resolve().parents[2] / "gin" / "sweeps" / "scales" / "micro.gin"


def _sweep(sweep_dir: Path, scale: Path, rows: str, parallel: int = 1,
           env: dict[str, str] | None = None) -> None:
    argv = [sys.executable, "-m", "t5x_like.sweep", f"--sweep={T2}", f"--scale={scale}",
            f"--rows={rows}", f"--parallel={parallel}", f"--sweep_dir={sweep_dir}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False,
                          env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _numbers(cell: Path) -> dict:
    """A cell's logged pre-training losses and its downstream results."""
    losses = sorted({r["step"]: r["loss"] for r in runner.read_metrics(str(cell / "pretrain"))
                     if r.get("split") == "train" and "loss" in r}.items())  # resumed: last
    results = json.loads((cell / "results.json").read_text())
    finetune = results["evaluation"]["finetune"]["runs"][0]["final_loss"]
    return {"losses": losses, "tasks": results["tasks"], "finetune_loss": finetune}


@pytest.fixture(scope="module")
def alone(tmp_path_factory) -> tuple[Path, Path]:
    """(scale file, sweep dir) of the reference: the micro scale with 20 steps and a checkpoint
    every 10 (so a run can be killed between checkpoints), one cell run alone."""
    root = tmp_path_factory.mktemp("reproducibility")
    scale = root / "micro_ckpt.gin"
    scale.write_text(f"include '{MICRO}'\n"
                     "train.num_train_steps = 20\ntrain.checkpoint_every = 10\n"
                     "train.keep_checkpoints = 2\ntrain.log_every = 5\n"
                     "sweep_scale.name = 'micro_ckpt'\n")
    _sweep(root / "alone", scale, ROW)
    return scale, root / "alone"


def _reference(alone_dir: Path) -> tuple[str, dict]:
    (cell,) = os.listdir(alone_dir / "cells")
    return cell, _numbers(alone_dir / "cells" / cell)


def test_same_seed_same_numbers_alone_in_parallel_and_warm(alone, tmp_path):
    scale, alone_dir = alone
    beside, warm = tmp_path / "beside", tmp_path / "warm"
    _sweep(beside, scale, f"{ROW},Enc-dec 6 layers | LM", 2)  # two cells share the two cores
    assert len(os.listdir(beside / "cells")) == 2
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(alone_dir / runner.XLA_CACHE),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    def steps() -> set[str]:
        return {f for f in os.listdir(alone_dir / runner.XLA_CACHE) if f.startswith("jit_step")}

    cached = steps()
    _sweep(warm, scale, ROW, 1, env)
    assert cached and steps() == cached  # the train steps came from the cache
    cell, reference = _reference(alone_dir)
    assert len(reference["losses"]) >= 3 and reference["tasks"]
    for other in (beside, warm):
        assert _numbers(other / "cells" / cell) == reference, other.name


def test_same_numbers_after_kill_9_and_resume_through_the_sweep(alone, tmp_path):
    """kill -9 the whole sweep once pre-training has a checkpoint (or later), rerun the same
    command: the cell finishes with the uninterrupted run's losses and scores."""
    import signal
    import time

    scale, alone_dir = alone
    killed = tmp_path / "killed"
    argv = [sys.executable, "-m", "t5x_like.sweep", f"--sweep={T2}", f"--scale={scale}",
            f"--rows={ROW}", f"--sweep_dir={killed}"]
    run = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    deadline = time.time() + 300
    while not list(killed.glob("cells/*/pretrain/checkpoints/*10*")) and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    cell, reference = _reference(alone_dir)
    assert os.listdir(killed / "cells") == [cell]
    assert not (killed / "cells" / cell / "results.json").exists()  # it was interrupted
    _sweep(killed, scale, ROW)
    assert _numbers(killed / "cells" / cell) == reference
