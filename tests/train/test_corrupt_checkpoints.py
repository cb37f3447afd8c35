"""Corrupt or partial checkpoints on disk (real orbax files, truncated or missing metadata):
training falls back to the newest readable step with a warning, moving the bad one aside;
nothing readable, or an explicit bad step, is one clear error (exit 2); infer names a --step."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from t5x_like import infer
from tests.train.conftest import run_train

pytestmark = pytest.mark.slow

COMMON = (
    "train.sequence_length = {'inputs': 32, 'targets': 8}",
    "train.batch_size = 8",
    "train.log_every = 5",
    "train.eval_every = 0",
    "train.checkpoint_every = 5",
    "train.keep_checkpoints = 2",
)


def _corrupt(step_dir: Path, how: str) -> None:
    if how == "truncated":  # every large data file (which arrays share a file varies by run)
        for p in (step_dir / "state").rglob("*"):
            if p.is_file() and p.stat().st_size > 10_000 and p.parent.name == "d":
                os.truncate(p, 100)
    else:
        (step_dir / "state" / "_METADATA").unlink()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, compile_cache) -> Path:
    """A tiny run with checkpoints at steps 5 and 10."""
    model_dir = tmp_path_factory.mktemp("ckpt") / "run"
    done = run_train(model_dir, *COMMON, "train.num_train_steps = 10",
                     compile_cache=compile_cache)
    assert done.returncode == 0, done.stderr[-3000:]
    return model_dir


def _copy(trained: Path, tmp_path: Path) -> Path:
    model_dir = tmp_path / "run"
    shutil.copytree(trained, model_dir)
    return model_dir


@pytest.mark.parametrize("how", ["truncated", "no_metadata"])
def test_resume_falls_back_to_the_newest_readable_step(trained, tmp_path, compile_cache, how):
    model_dir = _copy(trained, tmp_path)
    _corrupt(model_dir / "checkpoints" / "10", how)
    done = run_train(model_dir, *COMMON, "train.num_train_steps = 15",
                     compile_cache=compile_cache)
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stdout + done.stderr
    assert "checkpoints/10 is unreadable" in log
    assert "restored step 5 " in log
    assert (model_dir / "checkpoints" / "10.unreadable").is_dir()
    # Retention (keep 2) kept the readable history: 10 was saved afresh, then 15.
    steps = sorted(int(p.name) for p in (model_dir / "checkpoints").iterdir()
                   if p.name.isdigit())
    assert steps == [10, 15]
    # One line about the bad step, not orbax's abandoned-read tracebacks.
    assert "Event loop is closed" not in log and "Exception ignored" not in log
    assert "Traceback" not in log


def test_no_readable_checkpoint_and_an_explicit_bad_step_are_clear_errors(
        trained, tmp_path, compile_cache):
    model_dir = _copy(trained, tmp_path)
    _corrupt(model_dir / "checkpoints" / "10", "truncated")
    done = run_train(model_dir, *COMMON, "train.num_train_steps = 15",
                     "train.restore_step = 10", compile_cache=compile_cache)
    assert done.returncode == 2
    error = done.stderr[done.stderr.index("error: "):].splitlines()
    assert "checkpoints/10 is unreadable: OUT_OF_RANGE" in error[0], done.stderr[-2000:]
    assert "other complete checkpoints: [5]" in error[1]
    assert len(error) == 2
    _corrupt(model_dir / "checkpoints" / "5", "no_metadata")
    done = run_train(model_dir, *COMMON, "train.num_train_steps = 15",
                     compile_cache=compile_cache)
    assert done.returncode == 2
    assert "no complete checkpoint is readable" in done.stderr
    assert "Traceback" not in done.stderr
    # Nothing was moved aside or written when no step could be restored.
    assert sorted(p.name for p in (model_dir / "checkpoints").iterdir()) == ["10", "5"]


@pytest.mark.parametrize("how", ["truncated", "no_metadata"])
def test_infer_names_a_readable_step(trained, tmp_path, capsys, how):
    model_dir = _copy(trained, tmp_path)
    _corrupt(model_dir / "checkpoints" / "10", how)
    inputs = tmp_path / "in.txt"
    inputs.write_text("hello\n", encoding="utf-8")
    argv = [f"--checkpoint={model_dir}", f"--input_file={inputs}",
            f"--output_file={tmp_path / 'out.jsonl'}"]
    assert infer.main(argv) == 2
    err = capsys.readouterr().err
    assert "is unreadable" in err and "steps [5] (pass --step=N)" in err
    assert "mismatching" not in err
    assert infer.main([*argv, "--step=5"]) == 0
