"""atomic.build_dir / write_file: all or nothing, on real directories."""

import os
import subprocess
import sys

import pytest

from t5x_like.data import atomic


def test_build_dir_replaces_the_destination_only_on_success(tmp_path):
    dest = tmp_path / "corpus"
    dest.mkdir()
    (dest / "old.txt").write_text("old")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic.build_dir(dest) as tmp:
            (tmp / "new.txt").write_text("half")
            raise RuntimeError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]
    assert [p.name for p in dest.iterdir()] == ["old.txt"]

    with atomic.build_dir(dest) as tmp:
        assert tmp.parent == dest.parent and not any(tmp.iterdir())
        (tmp / "new.txt").write_text("whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]
    assert [p.name for p in dest.iterdir()] == ["new.txt"]


def test_build_dir_sweeps_leftovers_of_dead_builds_only(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = tmp_path / f".tmp-vocab-{dead}"
    live = tmp_path / f".tmp-vocab-{os.getppid()}"  # a concurrent build that is still running
    for d in (stale, live):
        d.mkdir()
    with atomic.build_dir(tmp_path / "vocab") as tmp:
        (tmp / "spm.model").write_bytes(b"x")
    assert not stale.exists() and live.exists()
    assert (tmp_path / "vocab" / "spm.model").read_bytes() == b"x"


def test_write_file_is_all_or_nothing(tmp_path):
    dest = tmp_path / "sub" / "clean.jsonl"
    with atomic.write_file(dest) as tmp:
        tmp.write_text("a\n")
    assert dest.read_text() == "a\n"
    with pytest.raises(ValueError):
        with atomic.write_file(dest) as tmp:
            tmp.write_text("b\n")
            raise ValueError("bad input")
    assert dest.read_text() == "a\n"
    assert [p.name for p in dest.parent.iterdir()] == ["clean.jsonl"]
