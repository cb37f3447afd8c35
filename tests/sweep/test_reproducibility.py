"""Same seed, same numbers: a sweep cell gives bitwise the same pre-training losses and
downstream scores when it runs alone, beside another cell on the same cores (`--parallel`), from
a warm compilation cache, and killed (-9) mid-run then resumed by rerunning the sweep."""

import json
import os
import subprocess
import sys
from pathlib import Path

from t5x_like.sweep import runner

T2 = "gin/sweeps/t5_table2_architectures.gin"
ROW = "Encoder-decoder | Denoising"


def _sweep(sweep_dir: Path, rows: str, parallel: int, env: dict[str, str] | None = None) -> None:
    argv = [sys.executable, "-m", "t5x_like.sweep", f"--sweep={T2}", "--scale=micro",
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


def test_same_seed_same_numbers_alone_in_parallel_and_warm(tmp_path):
    alone, beside, warm = tmp_path / "alone", tmp_path / "beside", tmp_path / "warm"
    _sweep(alone, ROW, 1)
    _sweep(beside, f"{ROW},Language model | LM", 2)  # two cells share the two cores
    assert len(os.listdir(beside / "cells")) == 2
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(alone / runner.XLA_CACHE),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    def steps() -> set[str]:
        return {f for f in os.listdir(alone / runner.XLA_CACHE) if f.startswith("jit_step")}

    cached = steps()
    _sweep(warm, ROW, 1, env)
    assert cached and steps() == cached  # the train steps came from the cache
    (cell,) = os.listdir(alone / "cells")
    reference = _numbers(alone / "cells" / cell)
    assert len(reference["losses"]) >= 3 and reference["tasks"]
    for other in (beside, warm):
        assert _numbers(other / "cells" / cell) == reference, other.name


def test_same_numbers_after_kill_9_and_resume_through_the_sweep(tmp_path):
    """kill -9 the whole sweep once pre-training has a checkpoint (or later), rerun the same
    command: the cell finishes with the uninterrupted run's losses and scores."""
    import signal
    import time

    scale = tmp_path / "micro_ckpt.gin"
    micro = Path(__file__).resolve().parents[2] / "gin" / "sweeps" / "scales" / "micro.gin"
    scale.write_text(f"include '{micro}'\n"
                     "train.num_train_steps = 40\ntrain.checkpoint_every = 10\n"
                     "train.keep_checkpoints = 5\ntrain.log_every = 5\n"
                     "sweep_scale.name = 'micro_ckpt'\n")
    argv = [sys.executable, "-m", "t5x_like.sweep", f"--sweep={T2}", f"--scale={scale}",
            f"--rows={ROW}"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    proc = subprocess.run([*argv, f"--sweep_dir={whole}"], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = subprocess.Popen([*argv, f"--sweep_dir={killed}"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while not list(killed.glob("cells/*/pretrain/checkpoints/*10*")) and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    (cell,) = os.listdir(killed / "cells")
    assert not (killed / "cells" / cell / "results.json").exists()  # it was interrupted
    proc = subprocess.run([*argv, f"--sweep_dir={killed}"], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _numbers(killed / "cells" / cell) == _numbers(whole / "cells" / cell)
