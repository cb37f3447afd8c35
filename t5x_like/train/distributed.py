"""Multi-process start-up: ``jax.distributed.initialize()`` when launched as several processes.

Explicit flags win; otherwise TPU pods and SLURM are detected from the environment (JAX's own
cluster detection fills in the coordinator). A single process never initialises the runtime.
"""

from __future__ import annotations

import os

import jax

_SLURM_VARS = ("SLURM_JOB_ID", "SLURM_NTASKS")


def detect_cluster() -> str | None:
    """'slurm' / 'tpu' when running under a multi-process launcher, else None."""
    if all(v in os.environ for v in _SLURM_VARS) and int(os.environ["SLURM_NTASKS"]) > 1:
        return "slurm"
    if os.environ.get("TPU_WORKER_HOSTNAMES", "").count(",") >= 1:
        return "tpu"
    if os.environ.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return "tpu"
    return None


def enable_cpu_collectives() -> None:
    """Cross-process collectives on CPU need gloo (the default CPU client has none)."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> bool:
    """Initialise ``jax.distributed`` if this is a multi-process run; returns whether it did."""
    explicit = coordinator_address is not None or (num_processes or 1) > 1
    cluster = detect_cluster()
    if not explicit and cluster is None:
        return False
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if "cpu" in platforms.split(",") or platforms == "cpu":
        enable_cpu_collectives()
    if explicit:
        jax.distributed.initialize(
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
        )
    else:
        jax.distributed.initialize()
    return True
