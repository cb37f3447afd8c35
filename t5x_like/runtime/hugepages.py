"""Transparent huge pages for XLA:CPU's buffers (Linux with glibc).

XLA:CPU mallocs every step's temporary buffers and frees them after the step. glibc serves
large blocks from fresh `mmap`s, so each step faults in all of them again, 4 KiB at a time,
the kernel zeroing each page: T5-small's step (batch 2) takes ~290k faults, 1.1 GB, and 0.55 s
of system time. With `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (glibc >= 2.35) malloc asks for
2 MiB transparent huge pages instead: ~35x fewer faults, T5-small's step ~5% faster and the
tiny sweep model's ~30% (its 67 MB logits dominate; benchmarks/train.md).

glibc reads the variable only when a process starts. `python -m t5x_like.train` and
`python -m t5x_like.evaluate` therefore call `reexec_with_hugepages()` first: where it helps
(Linux, glibc >= 2.35, THP in `madvise` mode, the tunable not already set) it re-executes the
same command once with the variable added. `T5X_LIKE_HUGEPAGES=0` turns that off; the sweep
runner sets the variable for its children directly (`hugepage_env`).
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

TUNABLE = "glibc.malloc.hugetlb=1"
THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode(path: str = THP_MODE_FILE) -> str | None:
    """The kernel's THP mode (`always`, `madvise` or `never`), None when unknown."""
    try:
        with open(path, encoding="ascii") as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def glibc_supports_hugetlb() -> bool:
    """glibc >= 2.35, the first with the `glibc.malloc.hugetlb` tunable."""
    name, version = platform.libc_ver()
    parts = [int(p) for p in version.split(".") if p.isdigit()]
    return name == "glibc" and len(parts) >= 2 and (parts[0], parts[1]) >= (2, 35)


def hugepage_env(env: Mapping[str, str], *, mode: str | None = None,
                 supported: bool | None = None) -> dict[str, str]:
    """`env` with the tunable added to `GLIBC_TUNABLES` where it helps: THP in `madvise` mode
    (in `always` the kernel already backs large mappings with huge pages, in `never` it cannot),
    a glibc that knows it, and `T5X_LIKE_HUGEPAGES` not `0`. Other tunables are kept.
    `mode` and `supported` default to this machine's (`thp_mode()`, `glibc_supports_hugetlb()`).
    """
    out = dict(env)
    mode = thp_mode() if mode is None else mode
    supported = glibc_supports_hugetlb() if supported is None else supported
    current = out.get("GLIBC_TUNABLES", "")
    if (out.get("T5X_LIKE_HUGEPAGES") == "0" or mode != "madvise" or not supported
            or "glibc.malloc.hugetlb" in current):
        return out
    out["GLIBC_TUNABLES"] = f"{current}:{TUNABLE}" if current else TUNABLE
    return out


def reexec_with_hugepages() -> None:
    """Re-execute this command (`sys.orig_argv`) with the tunable set, when `hugepage_env`
    adds it; otherwise return. Call it first thing in a `__main__`, never from library code."""
    env = hugepage_env(os.environ)
    if env.get("GLIBC_TUNABLES") == os.environ.get("GLIBC_TUNABLES"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
