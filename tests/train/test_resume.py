"""Real training subprocesses: kill -9 + resume equals an uninterrupted run, SIGTERM saves,
NaN stops naming the step, a checkpoint of another config is refused naming the parameters."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.train.conftest import REPO, run_train, subprocess_env, train_cmd

pytestmark = pytest.mark.slow

COMMON = (
    "train.sequence_length = {'inputs': 32, 'targets': 8}",
    "train.batch_size = 8",
    "train.log_every = 1",
    "train.eval_every = 0",
    "train.keep_checkpoints = 3",
)


def _losses(model_dir: Path) -> dict[int, float]:
    """The last logged train loss per step (a resumed run re-logs the steps it redoes)."""
    out: dict[int, float] = {}
    path = model_dir / "metrics.jsonl"
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["split"] == "train":
            out[row["step"]] = row["loss"]
    return out


def _steps(model_dir: Path) -> list[int]:
    d = model_dir / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.exists() else []


def _start(model_dir: Path, *bindings: str, cache: str) -> subprocess.Popen:
    return subprocess.Popen(train_cmd(model_dir, *COMMON, *bindings,
                                      gin_files=("gin/runs/quickstart.gin",)),
                            cwd=REPO, env=subprocess_env(1, cache), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait_for_step(proc: subprocess.Popen, model_dir: Path, step: int, timeout: float) -> None:
    deadline = time.time() + timeout
    while max(_losses(model_dir), default=0) < step:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.time() < deadline, "training did not reach the step in time"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, compile_cache) -> Path:
    """An uninterrupted 6-step run (checkpoints every 2 steps)."""
    model_dir = tmp_path_factory.mktemp("ref")
    out = run_train(model_dir, *COMMON, "train.num_train_steps = 6", "train.checkpoint_every = 2",
                    compile_cache=compile_cache)
    assert out.returncode == 0, out.stderr[-3000:]
    model_dir.with_suffix(".stderr").write_text(out.stderr)
    return model_dir


def test_uninterrupted_run_writes_model_dir(reference: Path) -> None:
    losses = _losses(reference)
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert _steps(reference) == [2, 4, 6]
    config = (reference / "config.gin").read_text()
    assert "train.batch_size = 8" in config and "TransformerConfig.emb_dim = 32" in config
    assert any(p.name.startswith("events.out.tfevents") for p in reference.iterdir())
    assert (reference / "data_state" / "6" / "process_0").exists()


def test_a_healthy_run_prints_nothing_to_stderr(reference: Path) -> None:
    # No TensorFlow start-up lines (absl banner, "Could not find cuda drivers", cuInit), no
    # "did not fully read the dataset being cached" (the run stops inside an epoch), no orbax
    # metadata warnings: a user reads any of them as a failure.
    assert reference.with_suffix(".stderr").read_text() == ""


def test_sigkill_then_resume_matches_uninterrupted_run(reference, tmp_path, compile_cache) -> None:
    model_dir = tmp_path / "killed"
    # Same run but longer; killed right after its first complete checkpoint (step 2 or 4).
    proc = _start(model_dir, "train.num_train_steps = 1000", "train.checkpoint_every = 2",
                  cache=compile_cache)
    try:
        _wait_for_step(proc, model_dir, 3, timeout=240)
        deadline = time.time() + 120
        while not _steps(model_dir) and time.time() < deadline:
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    complete = _steps(model_dir)
    assert complete and max(complete) < 6
    out = run_train(model_dir, *COMMON, "train.num_train_steps = 6", "train.checkpoint_every = 2",
                    compile_cache=compile_cache)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"restored step {max(complete)}" in out.stdout
    ref, got = _losses(reference), _losses(model_dir)
    for step in range(max(complete) + 1, 7):
        assert got[step] == pytest.approx(ref[step], rel=1e-5, abs=1e-6), step
    # metrics.jsonl was rewound to the checkpoint: each train step is logged once, in order.
    rows = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_saves_a_checkpoint_and_exits_cleanly(tmp_path, compile_cache,
                                                                sig) -> None:
    model_dir = tmp_path / "preempted"
    proc = _start(model_dir, "train.num_train_steps = 1000", "train.checkpoint_every = 1000",
                  cache=compile_cache)
    _wait_for_step(proc, model_dir, 2, timeout=240)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    saved = _steps(model_dir)
    assert len(saved) == 1 and saved[0] >= 2
    assert f"{sig.name}: saved step {saved[0]}" in out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out


def test_nan_loss_stops_naming_the_step_and_keeps_last_checkpoint(tmp_path, compile_cache) -> None:
    model_dir = tmp_path / "nan"
    # A huge learning rate blows the weights up after step 1, so step 2's loss is not finite.
    out = run_train(model_dir, *COMMON, "train.num_train_steps = 5", "train.checkpoint_every = 1",
                    "rsqrt_schedule.base_learning_rate = 1e36", compile_cache=compile_cache)
    assert out.returncode == 3, out.stderr[-3000:]
    assert "non-finite loss at step 2" in out.stderr
    assert "Last good checkpoint: step 1" in out.stderr
    assert _steps(model_dir) == [1]


def test_checkpoint_of_another_config_is_refused_naming_params(reference, tmp_path) -> None:
    model_dir = tmp_path / "other"
    shutil.copytree(reference, model_dir)
    out = run_train(model_dir, *COMMON, "train.num_train_steps = 8",
                    "TransformerConfig.mlp_dim = 48")
    assert out.returncode != 0
    assert "does not match the model config" in out.stderr
    assert "encoder/layers_0/mlp/wi_0/kernel: checkpoint shape (32, 64) != model shape (32, 48)" \
        in out.stderr
    assert _steps(model_dir) == [2, 4, 6]


def test_finetune_initialises_from_pretrained_checkpoint(reference, tmp_path,
                                                         compile_cache) -> None:
    model_dir = tmp_path / "finetune"
    out = run_train(model_dir, *COMMON, "train.num_train_steps = 1", "train.checkpoint_every = 1",
                    f"train.init_params_path = '{reference}'",
                    "train.task = 'c4like_iid_replace_spans'", compile_cache=compile_cache)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"initialised params from {reference}" in out.stdout
    # Pre-trained weights: the first fine-tuning loss is well below the from-scratch one.
    assert _losses(model_dir)[1] < _losses(reference)[1] - 0.5
    assert _steps(model_dir) == [1]
