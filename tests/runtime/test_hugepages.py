"""Huge pages for XLA:CPU's buffers: when the tunable is added, the re-exec, and its effect."""

import os
import subprocess
import sys

import pytest

from t5x_like.runtime import hugepages


def test_hugepage_env_adds_the_tunable_only_where_it_helps():
    add = hugepages.hugepage_env
    assert add({}, mode="madvise", supported=True)["GLIBC_TUNABLES"] == hugepages.TUNABLE
    kept = add({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, mode="madvise", supported=True)
    assert kept["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{hugepages.TUNABLE}"
    for env, mode, supported in [
        ({}, "always", True),  # the kernel already uses huge pages for large mappings
        ({}, "never", True),
        ({}, "", True),  # no THP (not Linux, or no sysfs)
        ({}, "madvise", False),  # glibc older than 2.35, or not glibc
        ({"T5X_LIKE_HUGEPAGES": "0"}, "madvise", True),  # the user's opt-out
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", True),  # the user's choice
    ]:
        assert add(env, mode=mode, supported=supported) == env


def test_thp_mode_reads_the_bracketed_choice(tmp_path):
    path = tmp_path / "enabled"
    path.write_text("always [madvise] never\n")
    assert hugepages.thp_mode(str(path)) == "madvise"
    assert hugepages.thp_mode(str(tmp_path / "missing")) is None


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "T5X_LIKE_HUGEPAGES")}
    return {**env, **extra}


def test_reexec_sets_the_tunable_once_and_keeps_the_command():
    code = ("import os, sys; from t5x_like.runtime.hugepages import reexec_with_hugepages; "
            "print('start', flush=True); reexec_with_hugepages(); "
            "print(os.environ.get('GLIBC_TUNABLES'), sys.argv[1:])")
    out = subprocess.run([sys.executable, "-c", code, "--flag=1"], env=_child_env(),
                         capture_output=True, text=True, check=True).stdout.splitlines()
    expected = hugepages.hugepage_env({}).get("GLIBC_TUNABLES")
    assert out[-1] == f"{expected} ['--flag=1']"
    assert out.count("start") == (2 if expected else 1)  # re-executed once, or not at all
    out = subprocess.run([sys.executable, "-c", code], env=_child_env(T5X_LIKE_HUGEPAGES="0"),
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["start", "None []"]


@pytest.mark.skipif(hugepages.hugepage_env({}) == {},
                    reason="transparent huge pages are not in madvise mode here, or glibc < 2.35")
def test_the_tunable_cuts_page_faults_of_xla_buffers():
    """What the trainer gains: a jitted function whose 64 MB output XLA:CPU allocates afresh on
    each of 20 calls takes far fewer page faults with the tunable (4 KiB -> 2 MiB pages)."""
    code = ("import resource, jax, jax.numpy as jnp\n"
            "x = jnp.ones(16 * 2**20, jnp.float32)\n"
            "f = jax.jit(lambda x: x + 1.0)\n"
            "f(x).block_until_ready()\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "for _ in range(20):\n"
            "    f(x).block_until_ready()\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n")

    def faults(env: dict[str, str]) -> int:
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True)
        return int(run.stdout.strip().splitlines()[-1])

    plain = faults(_child_env())
    huge = faults(hugepages.hugepage_env(_child_env()))
    assert plain > 20 * 15_000  # about every 4 KiB page of every output, every call
    assert huge * 10 < plain
