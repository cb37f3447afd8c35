"""One run per model directory: an advisory lock on ``model_dir/.lock``, held while training.

Two runs writing one model dir interleave ``metrics.jsonl`` rows, overwrite each other's
``config.gin`` and race on checkpoints, and both exit 0. The trainer's first process therefore
takes an exclusive ``flock`` on ``model_dir/.lock`` before it writes anything, and writes who
holds it (host, pid, start time, command) into the file for the error the next run prints.

The kernel drops a ``flock`` when its holder dies, ``kill -9`` included, so a crashed run never
leaves the directory locked; on NFS (v4, or v3 with lockd) Linux maps ``flock`` onto the server's
byte-range locks, which the server releases when the client's lease expires. Filesystems that
cannot lock at all (some FUSE mounts) and object-store URLs (``gs://``) get one warning and no
lock. The file itself is never deleted: unlinking a lock file lets a third run lock a new inode
while a second still holds the old one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from typing import Any

LOCK_NAME = ".lock"


class ModelDirBusyError(RuntimeError):
    """Another live run holds the model directory."""


def _holder_text(info: dict[str, Any]) -> str:
    """'pid 123 on host h since 2026-01-01 12:00:00 UTC (python -m t5x_like.train ...)'."""
    if not info:
        return "another process (it has not written its details yet)"
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info.get("started", 0)))
    command = " ".join(info.get("argv", []))
    if len(command) > 160:
        command = command[:157] + "..."
    return (f"pid {info.get('pid')} on host {info.get('host')} since {since}"
            + (f" ({command})" if command else ""))


class ModelDirLock:
    """Exclusive ownership of ``model_dir`` for one run (a context manager).

    ``acquire`` raises ModelDirBusyError naming the holder when another run has the lock.
    """

    def __init__(self, model_dir: str, *, warn: Any = None) -> None:
        self.model_dir = model_dir
        self.path = os.path.join(model_dir, LOCK_NAME)
        self._fd: int | None = None
        self._warn = warn or (lambda msg: print(msg, file=sys.stderr, flush=True))

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if "://" in self.model_dir:
            self._warn(f"[t5x_like.train] WARNING: {self.model_dir} cannot be locked (object "
                       "store): make sure no other run uses it")
            return
        os.makedirs(self.model_dir, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ModelDirBusyError(
                    f"train.model_dir={self.model_dir} is in use by another run: "
                    f"{_holder_text(read_holder(self.path))}. Wait for it to end, stop it, or "
                    "choose another --model_dir") from None
            self._warn(f"[t5x_like.train] WARNING: cannot lock {self.path} ({err.strerror}; the "
                       "filesystem has no locks): make sure no other run uses this model dir")
            return
        info = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
                "argv": ["python", *sys.orig_argv[1:]]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (the file stays, see the module docstring)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> ModelDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def read_holder(path: str) -> dict[str, Any]:
    """The holder's details from a lock file ({} when empty or unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}
