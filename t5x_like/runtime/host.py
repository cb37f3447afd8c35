"""What machine ran a measurement: CPU model, core count, vector ISA and feature-flag hash.

XLA:CPU compiles for the features of the host it runs on, so the same code and seed can round
differently on two machines. Benchmarks and sweep cells record `describe()` beside their
numbers, so results from different hosts are never compared unknowingly.
"""

from __future__ import annotations

import hashlib
import os
import platform


def _cpuinfo() -> dict[str, str]:
    """The first processor's `key: value` lines of /proc/cpuinfo ({} where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            text = f.read().split("\n\n", 1)[0]
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in text.splitlines()
                                              if ":" in ln)}


def describe() -> str:
    """E.g. 'AMD EPYC, 2 CPUs, AVX-512, flags 3f2a91c0': the CPU's model name, the cores this
    process sees, its widest vector ISA and the first 8 hex digits of a SHA-1 of all its feature
    flags (equal hashes: the same instruction set for XLA to compile for)."""
    info = _cpuinfo()
    name = info.get("model name") or platform.processor() or platform.machine()
    flags = sorted(info.get("flags", "").split())
    parts = [name, f"{os.cpu_count()} CPUs"]
    isas = [label for flag, label in (("avx512f", "AVX-512"), ("avx2", "AVX2")) if flag in flags]
    parts += isas[:1]  # the widest
    if flags:
        parts.append("flags " + hashlib.sha1(" ".join(flags).encode()).hexdigest()[:8])
    return ", ".join(parts)
