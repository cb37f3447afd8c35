"""Atomic writes for everything the data layer builds under the data dir.

A build (the corpus, the downstream suite, a vocabulary, a cleaned file, a fetched asset) is
written next to its destination under a temporary name and renamed into place in one step, so
a reader never sees half of it and a killed build leaves nothing a freshness check accepts.
Each build records its own fingerprint inside what it writes (`stats.json`, `manifest.json`,
`meta.json`); this module does the renaming and `read_record` checks such a record.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _sweep(dest: Path) -> None:
    """Remove temporary siblings of `dest` left by builds whose process is gone."""
    for stale in dest.parent.glob(f".tmp-{dest.name}-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def build_dir(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary directory beside `dest`; on success it replaces `dest`.

    On an exception the temporary directory is removed and `dest` is left as it was. If a
    concurrent build renamed its own directory into place first, that one is kept (builds of
    the same fingerprint write the same content) and ours is discarded.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _sweep(dest)
    tmp = dest.parent / f".tmp-{dest.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(dest, ignore_errors=True)
    try:
        os.replace(tmp, dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not dest.is_dir():  # not a concurrent build that won the rename: a real failure
            raise


@contextlib.contextmanager
def write_file(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `dest` to write; on success it replaces `dest`, on an
    exception it is removed and `dest` is left as it was."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def read_record(path: Path, fingerprint: str) -> dict | None:
    """The JSON record of a build (`stats.json`, `manifest.json`) if it has `fingerprint` and
    every file it lists (`files`: path relative to it -> size) is intact; else None."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if record.get("fingerprint") != fingerprint:
        return None
    for rel, size in record.get("files", {}).items():
        p = path.parent / rel
        if not p.is_file() or p.stat().st_size != size:
            return None
    return record
