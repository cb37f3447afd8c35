"""Shared fixtures for trainer tests: a tiny real model config and subprocess helpers."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FAST_COMPILE

REPO = Path(__file__).resolve().parents[2]

#: A tiny encoder-decoder (real t5x_like.models code), fp32 for exact compares.
TINY_MODEL = dict(vocab_size=8192, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64,
                  num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0, dtype="float32",
                  mlp_activations=("gelu", "linear"), logits_via_embedding=False)
#: The same as gin bindings.
TINY_MODEL_BINDINGS = [f"TransformerConfig.{k} = {v!r}" for k, v in TINY_MODEL.items()]


def tiny_config(**changes):
    """TINY_MODEL as a TransformerConfig (for in-process tests)."""
    from t5x_like.models import TransformerConfig

    return TransformerConfig(**{**TINY_MODEL, **changes})


def sharded_plan(model, optimizer, init_batch, mesh_shape, preset):
    """(mesh, rules, ``train_state.sharded_state``) on the first prod(mesh_shape) devices."""
    import jax

    from t5x_like.train import partitioning, train_state

    mesh = partitioning.create_mesh(mesh_shape, devices=jax.devices()[: math.prod(mesh_shape)])
    rules = partitioning.logical_axis_rules(preset)
    return mesh, rules, train_state.sharded_state(model, optimizer, init_batch, mesh, rules)


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A persistent XLA compilation cache for this session's training subprocesses: the run's
    shared one (tests/conftest.py), else a fresh one."""
    return os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(tmp_path_factory.mktemp("jax_cache"))


def subprocess_env(devices: int, compile_cache: str | None = None) -> dict[str, str]:
    """Environment for a training subprocess with ``devices`` fake CPU devices."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}"
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # t5x_like's own default (t5x_like/runtime/tf_setup.py)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if compile_cache:
        env["JAX_COMPILATION_CACHE_DIR"] = compile_cache
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    return env


def train_cmd(model_dir: Path, *bindings: str, gin_files: tuple[str, ...] = ()) -> list[str]:
    """``python -m t5x_like.train`` with the tiny model and the given extra bindings."""
    cmd = [sys.executable, "-m", "t5x_like.train", f"--model_dir={model_dir}"]
    cmd += [f"--gin_file={f}" for f in gin_files]
    for b in [*TINY_MODEL_BINDINGS, *bindings]:
        cmd += ["--gin_bindings", b]
    return cmd


def run_train(model_dir: Path, *bindings: str, devices: int = 1, compile_cache: str | None = None,
              timeout: float = 240, gin_files: tuple[str, ...] = ("gin/runs/quickstart.gin",)
              ) -> subprocess.CompletedProcess:
    """Run a training subprocess to completion (cwd = repo root)."""
    return subprocess.run(
        train_cmd(model_dir, *bindings, gin_files=gin_files), cwd=REPO, capture_output=True,
        text=True, env=subprocess_env(devices, compile_cache), timeout=timeout,
    )
