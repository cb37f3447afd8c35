"""A checkpoint that cannot be written stops the run in one line, exit 5, the last good step
intact and resumable. Real full filesystems: a size- or inode-limited tmpfs mounted in a private
mount namespace (``unshare -Urm``: no root needed, nothing leaks out)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from tests.train.conftest import REPO, subprocess_env, train_cmd

pytestmark = pytest.mark.slow

COMMON = ("train.sequence_length = {'inputs': 32, 'targets': 8}", "train.batch_size = 8",
          "train.log_every = 1", "train.eval_every = 0", "train.checkpoint_every = 5",
          "train.keep_checkpoints = 3", "train.num_train_steps = 15")


def _can_mount() -> str | None:
    """Why a private tmpfs cannot be mounted here (None when it can)."""
    try:
        probe = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs none /mnt"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unshare unavailable: {err}"
    return None if probe.returncode == 0 else f"no private mounts: {probe.stderr.strip()}"


@pytest.fixture(scope="module")
def namespace() -> None:
    reason = _can_mount()
    if reason:
        pytest.skip(f"needs a tmpfs in a user+mount namespace ({reason})")


def _run_in_namespace(script: str, tmp_path: Path, compile_cache: str) -> None:
    """Run a bash ``script`` in a fresh user+mount namespace ($MNT is tmp_path/mnt, empty)."""
    (tmp_path / "mnt").mkdir()
    env = subprocess_env(1, compile_cache) | {"MNT": str(tmp_path / "mnt")}
    done = subprocess.run(["unshare", "-Urm", "bash", "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _train(model_dir: Path, out: Path, *bindings: str) -> str:
    """Shell line: train into ``model_dir``, stdout/stderr/exit status to ``out``.{out,err,rc}."""
    cmd = " ".join(shlex.quote(c) for c in train_cmd(model_dir, *COMMON, *bindings,
                                                       gin_files=("gin/runs/quickstart.gin",)))
    return f"{cmd} > {out}.out 2> {out}.err; echo $? > {out}.rc"


def _result(out: Path) -> tuple[int, str, str]:
    return (int(Path(f"{out}.rc").read_text()), Path(f"{out}.out").read_text(),
            Path(f"{out}.err").read_text())


def test_full_disk_stops_the_run_at_the_unsaved_step_and_it_resumes(
        namespace, tmp_path, compile_cache) -> None:
    # 45 MB hold one step (a 3.5 MB train state, a ~27 MB tf.data iterator state) but not two.
    first, second = tmp_path / "first", tmp_path / "second"
    script = "\n".join([
        'mount -t tmpfs -o size=45m tmpfs "$MNT" || exit 1',
        _train(tmp_path / "mnt/run", first),
        f'ls "$MNT/run/checkpoints" > {tmp_path}/steps',
        'mount -o remount,size=300m "$MNT" || exit 1',  # the user frees space
        _train(tmp_path / "mnt/run", second),
        f'ls "$MNT/run/checkpoints" > {tmp_path}/steps_after',
    ])
    _run_in_namespace(script, tmp_path, compile_cache)
    rc, out, err = _result(first)
    assert rc == 5, out[-2000:] + err[-2000:]
    assert "error: checkpoint step 10 not saved: No space left on device" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "checkpoint step 5 saved in" in out and "checkpoint step 10 saved" not in out
    assert "step 11/15" not in out  # stopped at the unsaved step: no work it could not keep
    assert (tmp_path / "steps").read_text().split() == ["5"]
    rc, out, err = _result(second)
    assert rc == 0, out[-2000:] + err[-2000:]
    assert "restored step 5" in out and "checkpoint step 15 saved in" in out
    assert "15" in (tmp_path / "steps_after").read_text().split()


def test_a_write_that_fails_in_orbax_is_reported_once(namespace, tmp_path, compile_cache) -> None:
    """Out of inodes: the byte check passes, orbax's background write fails for real."""
    out = tmp_path / "run"
    script = "\n".join([
        'mount -t tmpfs -o size=100m,nr_inodes=14 tmpfs "$MNT" || exit 1',
        _train(tmp_path / "mnt/run", out, "train.checkpoint_data_iterator = False"),
        f'ls -a "$MNT/run/checkpoints" > {tmp_path}/steps',
    ])
    _run_in_namespace(script, tmp_path, compile_cache)
    rc, stdout, err = _result(out)
    assert rc == 5, stdout[-2000:] + err[-2000:]
    assert "error: checkpoint step 5 not saved: No space left on device" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "saved in" not in stdout
    assert set((tmp_path / "steps").read_text().split()) == {".", ".."}  # tmp dir removed


def test_a_full_disk_while_logging_metrics_is_one_line(namespace, tmp_path, compile_cache) -> None:
    """No save is due; metrics.jsonl is what cannot be written: one line naming it, exit 5."""
    out = tmp_path / "run"
    script = "\n".join([
        'mount -t tmpfs -o size=16k tmpfs "$MNT" || exit 1',
        _train(tmp_path / "mnt/run", out, "train.checkpoint_every = 1000",
               "train.num_train_steps = 200", "train.tensorboard = False"),
    ])
    _run_in_namespace(script, tmp_path, compile_cache)
    rc, stdout, err = _result(out)
    assert rc == 5, stdout[-2000:] + err[-2000:]
    assert "error: [Errno 28] No space left on device: " in err, err
    assert f"{tmp_path / 'mnt/run/metrics.jsonl'}'; the run stopped" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
