"""One run per model dir: a second process is refused naming the first; a `kill -9`'d holder
leaves nothing stuck; two real trainings into one directory never mix their records."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from t5x_like.train.model_dir_lock import LOCK_NAME, ModelDirBusyError, ModelDirLock
from tests.train.conftest import REPO, run_train, subprocess_env, train_cmd

_HOLD = ("import sys, time; from t5x_like.train.model_dir_lock import ModelDirLock; "
         "ModelDirLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(600)")


def _holder(model_dir: Path) -> subprocess.Popen:
    """Another process holding ``model_dir``'s lock (returns once it holds it)."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(model_dir)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, env=subprocess_env(1))
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_holder_is_refused_naming_the_first_until_it_is_killed(tmp_path) -> None:
    holder = _holder(tmp_path / "run")
    try:
        with pytest.raises(ModelDirBusyError) as err:
            ModelDirLock(str(tmp_path / "run")).acquire()
        message = str(err.value)
        assert f"pid {holder.pid} on host {socket.gethostname()}" in message
        assert "model_dir_lock import ModelDirLock" in message  # its command line
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with ModelDirLock(str(tmp_path / "run")) as lock:  # kill -9 left nothing stuck
        assert lock.held
        assert json.loads((tmp_path / "run" / LOCK_NAME).read_text())["pid"] == os.getpid()
        with pytest.raises(ModelDirBusyError):  # one process, two opens: still exclusive
            ModelDirLock(str(tmp_path / "run")).acquire()
    assert (tmp_path / "run" / LOCK_NAME).exists()  # never unlinked (see the module docstring)
    ModelDirLock(str(tmp_path / "run")).acquire()  # released on exit


@pytest.mark.slow
def test_two_trainings_into_one_model_dir(tmp_path, compile_cache) -> None:
    """The second run exits 2 naming the first before it builds anything (no mesh, no model
    state, no step); the first's records are its own."""
    model_dir = tmp_path / "run"
    common = ("train.sequence_length = {'inputs': 32, 'targets': 8}", "train.batch_size = 8",
              "train.log_every = 1", "train.eval_every = 0", "train.checkpoint_every = 1000")
    first = subprocess.Popen(
        train_cmd(model_dir, *common, "train.num_train_steps = 100000",
                  gin_files=("gin/runs/quickstart.gin",)),
        cwd=REPO, env=subprocess_env(1, compile_cache), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 180
        while not (model_dir / "metrics.jsonl").exists():  # training: the lock is taken
            assert first.poll() is None and time.time() < deadline
            time.sleep(0.2)
        second = run_train(model_dir, *common, "train.num_train_steps = 5", "train.seed = 1",
                           compile_cache=compile_cache)
        assert second.returncode == 2, second.stderr[-3000:]
        output = second.stdout + second.stderr
        assert "mesh(" not in output and "step 1/" not in output  # stopped before the Trainer
        assert f"is in use by another run: pid {first.pid} on host" in second.stderr
        assert "Traceback" not in second.stderr
        assert first.poll() is None  # the first run goes on
    finally:
        first.send_signal(signal.SIGTERM)
        out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out[-3000:]
    assert "mesh(" in out  # the line the second run must not reach
    rows = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if r["split"] == "train"]
    assert steps == list(range(1, len(steps) + 1))  # each step once: one run's rows
    assert "train.num_train_steps = 100000" in (model_dir / "config.gin").read_text()
