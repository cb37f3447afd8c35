"""Multi-process start-up: ``jax.distributed.initialize()`` when launched as several processes.

Explicit flags win; otherwise SLURM (inside an ``srun`` step), TPU pods on GKE and multislice
are detected from the environment, and ``T5X_LIKE_DISTRIBUTED=1`` asks for JAX's own detection
(what ``scripts/tpu/tpu.sh`` sets on Cloud TPU VMs, whose topology lives in the GCE metadata
server rather than in environment variables). JAX then fills in coordinator, process count and
id. A single process never initialises the runtime.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import jax

#: What ``srun`` sets for every task (JAX's SlurmCluster needs all of them).
_SLURM_VARS = ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_STEP_NODELIST", "SLURM_PROCID",
               "SLURM_LOCALID")
FORCE_VAR = "T5X_LIKE_DISTRIBUTED"


def detect_cluster(env: Mapping[str, str] | None = None) -> str | None:
    """'slurm' / 'tpu' / 'auto' when running under a multi-process launcher, else None.

    ``env`` defaults to ``os.environ`` (pass a dict to test). A one-task SLURM step is a single
    process (None); 'auto' is the explicit ``T5X_LIKE_DISTRIBUTED=1`` opt-in.
    """
    env = os.environ if env is None else env
    if all(v in env for v in _SLURM_VARS) and int(env["SLURM_NTASKS"]) > 1:
        return "slurm"
    hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES", "")
    if hosts.count(",") >= 1 or env.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return "tpu"
    if env.get(FORCE_VAR, "").lower() in ("1", "true", "yes"):
        return "auto"
    return None


def launch_mode(coordinator_address: str | None = None, num_processes: int | None = None,
                env: Mapping[str, str] | None = None) -> str | None:
    """How ``initialize`` starts the runtime: 'explicit' (flags), a ``detect_cluster`` kind, or
    None (single process, nothing to do)."""
    if coordinator_address is not None or (num_processes or 1) > 1:
        return "explicit"
    return detect_cluster(env)


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
    """Initialise ``jax.distributed`` if this is a multi-process run; returns whether it did."""
    mode = launch_mode(coordinator_address, num_processes)
    if mode is None:
        return False
    if "cpu" in os.environ.get("JAX_PLATFORMS", "").split(","):
        # Cross-process collectives on CPU need gloo (the default CPU client has none).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if mode == "explicit":
        jax.distributed.initialize(coordinator_address=coordinator_address,
                                   num_processes=num_processes, process_id=process_id)
    else:
        jax.distributed.initialize()
    return True
