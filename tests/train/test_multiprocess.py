"""Two real processes on localhost (jax.distributed, 4 fake CPU devices each) train together."""

from __future__ import annotations

import contextlib
import math
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.train.conftest import REPO, subprocess_env, train_cmd

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _train_cmd(model_dir, *bindings: str, gin_files=("gin/runs/quickstart.gin",)) -> list[str]:
    """The tiny model, 8 examples of 32/8 tokens a step, logging every step, no evaluation."""
    return train_cmd(model_dir, "train.sequence_length = {'inputs': 32, 'targets': 8}",
                     "train.batch_size = 8", "train.log_every = 1", "train.eval_every = 0",
                     *bindings, gin_files=gin_files)


@contextlib.contextmanager
def _two_processes(cmd, env: dict[str, str]) -> Iterator[list[subprocess.Popen]]:
    """Processes 0 and 1 of `cmd(jax.distributed flags)` on localhost; killed if still alive."""
    port = _free_port()
    procs = [subprocess.Popen(cmd([f"--coordinator_address=localhost:{port}", "--num_processes=2",
                                   f"--process_id={pid}"]), cwd=REPO, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for pid in range(2)]
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def _outputs(procs: list[subprocess.Popen], timeout: float) -> list[str]:
    """Each process's output; all must exit 0."""
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-4000:]
    return outs


def test_sigterm_to_one_process_of_the_fsdp_tp_preset_stops_both_at_the_agreed_step(
        tmp_path, compile_cache) -> None:
    """gin/sharding/fsdp_tp.gin on 2 processes x 4 devices, started by
    scripts/slurm/launch_manual.sh: mesh (1, 2, 4) (the model axis stays inside a process),
    tensor_parallel_2d rules. Process 1 alone gets SIGTERM: processes agree on a signal every
    `train.signal_check_every` steps (not every step: the all-gather would wait for the step in
    flight), so both save the same step, jointly, and exit 0."""
    model_dir = tmp_path / "fsdp_tp"
    train_args = _train_cmd(
        model_dir, "train.num_train_steps = 100000", "train.checkpoint_every = 100000",
        "train.signal_check_every = 4", "TransformerConfig.num_heads = 4",  # model=4 divides it
        gin_files=("gin/runs/quickstart.gin", "gin/sharding/fsdp_tp.gin"),
    )[3:]  # drop `python -m t5x_like.train`: the launcher adds it
    env = subprocess_env(4, compile_cache)
    env["PYTHON"] = sys.executable
    launcher = ["bash", str(REPO / "scripts/slurm/launch_manual.sh")]
    metrics = model_dir / "metrics.jsonl"
    with _two_processes(lambda flags: [*launcher, *flags, "--", *train_args], env) as procs:
        deadline = time.time() + 300
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
            assert time.time() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGTERM)  # process 0 is not signalled
        outs = _outputs(procs, timeout=180)
    assert "mesh(data=1, fsdp=2, model=4) on 8x cpu; 2 process(es)" in outs[0]
    losses = re.findall(r"step \d+/100000 \| loss ([0-9.]+)", outs[0])  # process 0 logs
    assert len(losses) >= 2 and all(math.isfinite(float(x)) and float(x) > 0 for x in losses)
    saved = sorted(int(p.name) for p in (model_dir / "checkpoints").iterdir()
                   if p.name.isdigit())
    assert len(saved) == 1 and saved[0] % 4 == 0 and saved[0] >= 4, saved  # one, written jointly
    assert f"signal to another process: saved step {saved[0]}; exiting" in outs[0]
    assert {p.name for p in (model_dir / "data_state" / str(saved[0])).iterdir()} == {
        "process_0", "process_1"}
