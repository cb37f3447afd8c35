"""`python -m t5x_like.data.prepare` on data dirs it cannot write or of the wrong shape: a
complete read-only dir is used as it is (nothing written, tasks read from it); anything else is
one `error:` line (exit 2) naming the path and what to do, never a traceback.

A directory is made read-only with `chmod -R a-w`, except for root, whom chmod does not stop:
there the command runs in a private mount namespace with the directory bind-mounted read-only
(`unshare -m`, as a read-only shared cache would be), or the test is skipped where that is not
possible.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from t5x_like.data import assets, corpus, downstream, prepare

REPO = Path(__file__).resolve().parents[2]
PREPARE = [sys.executable, "-m", "t5x_like.data.prepare", "--data_dir"]
_RO_MOUNT = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'

READ_TASKS = """
import itertools
from t5x_like.data import tasks
for task, vocabulary in (("c4like_span_corruption", "c4like_8k"), ("downstream_spam", "c4_32k")):
    ds = tasks.get_dataset(task, split="validation", batch_size=2, model_family="encoder_decoder",
                           sequence_length={"inputs": 64, "targets": 16}, vocabulary=vocabulary,
                           num_epochs=1)
    batch = next(iter(ds.as_numpy_iterator()))
    print(task, batch["encoder_input_tokens"].shape, int(batch["encoder_input_tokens"].max()))
"""


def _ro_prefix(path: Path) -> list[str]:
    """Run a command with `path` bind-mounted read-only, in a mount namespace of its own (gone
    when the command exits: nothing to undo)."""
    return ["unshare", "-m", "sh", "-c", _RO_MOUNT, str(path)]


@functools.cache
def _ro_mount_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = Path(tempfile.mkdtemp())
    try:
        cmd = [*_ro_prefix(probe), "sh", "-c", 'touch "$0/x" 2>/dev/null && exit 3 || exit 0',
               str(probe)]
        return subprocess.run(cmd, capture_output=True, check=False).returncode == 0
    finally:
        shutil.rmtree(probe)


def _chmod_tree(root: Path, writable: bool) -> None:
    for p in [root, *root.rglob("*")]:
        mode = p.stat().st_mode
        p.chmod(mode | 0o200 if writable else mode & ~0o222)


@contextlib.contextmanager
def read_only(root: Path) -> Iterator[list[str]]:
    """Make `root` read-only for the commands run inside; yields the prefix to run them with."""
    if os.geteuid() != 0:
        _chmod_tree(root, writable=False)
        try:
            yield []
        finally:
            _chmod_tree(root, writable=True)
    elif _ro_mount_works():
        yield _ro_prefix(root)
    else:
        pytest.skip("running as root, whom chmod does not stop from writing, and no read-only "
                    "bind mount is possible here (needs `unshare -m` and CAP_SYS_ADMIN)")


def _run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, **(env or {})})


def _listing(root: Path) -> dict[str, tuple[bool, int, int]]:
    """Every entry under `root` (itself included): is it a dir, its size and mtime."""
    return {str(p.relative_to(root)): (p.is_dir(), p.stat().st_size, p.stat().st_mtime_ns)
            for p in [root, *root.rglob("*")]}


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def _copy(data_dir: Path, dest: Path, *skip: str) -> Path:
    """A copy of the prepared data dir without its lock file and the top-level entries `skip`."""
    shutil.copytree(data_dir, dest, ignore=lambda d, names: [
        n for n in names if n == prepare.LOCK_NAME or (Path(d) == data_dir and n in skip)])
    return dest


@pytest.fixture(scope="module")
def complete_copy(data_dir, tmp_path_factory) -> Path:
    """A complete data dir (~60 MB) that the tests only read."""
    return _copy(data_dir, tmp_path_factory.mktemp("complete") / "data")


def test_complete_data_dir_is_only_read(complete_copy):
    before = _listing(complete_copy)
    done = prepare.prepare(complete_copy, log=lambda *a: None)
    assert set(done.values()) == {"cached", "up to date"}
    assert _listing(complete_copy) == before  # not even the lock file


def test_complete_read_only_data_dir_is_usable(complete_copy):
    before = _listing(complete_copy)
    with read_only(complete_copy) as prefix:
        proc = _run([*prefix, *PREPARE, str(complete_copy)])
    assert proc.returncode == 0, proc.stderr
    assert "downstream suite: up to date" in proc.stdout
    assert _listing(complete_copy) == before


def test_tasks_read_a_read_only_data_dir(complete_copy):
    before = _listing(complete_copy)
    with read_only(complete_copy) as prefix:
        proc = _run([*prefix, sys.executable, "-c", READ_TASKS],
                    env={assets.DATA_DIR_ENV: str(complete_copy)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "c4like_span_corruption (2, 64)" in proc.stdout
    assert "downstream_spam (2, 64)" in proc.stdout
    assert _listing(complete_copy) == before


def test_incomplete_read_only_data_dir_says_what_is_missing_and_where_to_build(data_dir,
                                                                               tmp_path):
    d = _copy(data_dir, tmp_path / "data", "downstream")
    before = _listing(d)
    with read_only(d) as prefix:
        line = _one_error_line(_run([*prefix, *PREPARE, str(d)]))
    assert f"data dir {d} is incomplete (missing or stale: downstream suite)" in line
    assert "cannot be written" in line
    assert "--data_dir DIR" in line and assets.DATA_DIR_ENV in line
    assert _listing(d) == before


def test_new_data_dir_under_a_read_only_parent(tmp_path):
    parent = tmp_path / "shared"
    parent.mkdir()
    with read_only(parent) as prefix:
        line = _one_error_line(_run([*prefix, *PREPARE, str(parent / "cache" / "t5x")]))
    assert f"data dir {parent / 'cache' / 't5x'} does not exist and cannot be written" in line
    assert f"cannot create {parent / 'cache'}" in line and "--data_dir DIR" in line
    assert not any(parent.iterdir())


def test_unbuilt_downstream_cache_in_a_read_only_dir_names_the_fix(data_dir, tmp_path):
    d = _copy(data_dir, tmp_path / "data", "downstream")
    code = ("from t5x_like.data import downstream\n"
            "downstream.load_examples('downstream_spam', 'test')")
    with read_only(d) as prefix:
        proc = _run([*prefix, sys.executable, "-c", code], env={assets.DATA_DIR_ENV: str(d)})
    assert proc.returncode == 1
    assert (f"FileNotFoundError: the downstream suite is not built under "
            f"{downstream.downstream_dir(d)} and cannot be built there") in proc.stderr


@pytest.mark.parametrize("where", ["", "downloads", "c4like", "c4like/1.0.0", "vocab/c4like_8k",
                                   "downstream", "../parent_file"])
def test_a_file_where_a_directory_belongs(tmp_path, where):
    d = tmp_path / "data"
    if where == "../parent_file":
        bad, d = tmp_path / "parent_file", tmp_path / "parent_file" / "data"
    else:
        bad = d / where if where else d
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_text("not a directory")
    before = _listing(tmp_path)
    line = _one_error_line(_run([*PREPARE, str(d)]))
    assert line.startswith(f"error: {bad.resolve()} is a file where a directory is expected")
    assert _listing(tmp_path) == before


def test_a_failed_write_is_one_line_and_leaves_nothing(data_dir, tmp_path, monkeypatch, capsys):
    d = _copy(data_dir, tmp_path / "data", "c4like", "vocab", "downstream")
    tmp = d / "c4like" / ".tmp-1.0.0-1"

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))

    monkeypatch.setattr(corpus, "build_corpus", full_disk)
    assert prepare.main(["--data_dir", str(d)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err]
    assert err.startswith(f"error: cannot write {tmp}: No space left on device; free some space")
    assert sorted(p.name for p in d.iterdir()) == [prepare.LOCK_NAME, "downloads"]


def test_tensorflow_write_errors_become_os_errors(tmp_path):
    import tensorflow as tf

    path = tmp_path / "train.tfrecord-00000-of-00016"
    with pytest.raises(OSError) as e, corpus._tf_errors_as_os_errors():
        raise tf.errors.ResourceExhaustedError(None, None, f"{path}; No space left on device")
    assert (e.value.errno, e.value.filename) == (errno.ENOSPC, str(path))
