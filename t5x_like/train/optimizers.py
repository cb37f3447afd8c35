"""Optimizers and learning-rate schedules (optax), all gin-configurable.

T5's recipe is the default: Adafactor (decay 0.8, update clipping 1.0, factored second moments,
no momentum, updates scaled by the parameter RMS) with ``lr = base / sqrt(max(step, warmup))``.
AdamW uses linear warm-up then cosine or linear decay. Optional global-norm gradient clipping
runs before either. Optimizer state is kept in float32, like the parameters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import gin
import jax
import jax.numpy as jnp
import optax

from t5x_like.gin_utils import ConfigError
from t5x_like.train import multi_tensor as multi_tensor_lib

Schedule = Callable[[jax.Array | int], jax.Array]


@gin.configurable
def rsqrt_schedule(base_learning_rate: float = 1.0, warmup_steps: int = 10_000) -> Schedule:
    """T5: ``base / sqrt(max(step, warmup_steps))`` (constant during warm-up, then rsqrt decay)."""

    def schedule(step: jax.Array | int) -> jax.Array:
        s = jnp.maximum(jnp.asarray(step, jnp.float32), float(warmup_steps))
        return base_learning_rate * jax.lax.rsqrt(s)

    return schedule


@gin.configurable
def warmup_cosine_schedule(
    peak_learning_rate: float = 1e-3,
    warmup_steps: int = 1_000,
    total_steps: int = 100_000,
    end_learning_rate: float = 0.0,
) -> Schedule:
    """Linear warm-up from 0 to ``peak`` over ``warmup_steps``, cosine decay to ``end`` at total."""
    return optax.warmup_cosine_decay_schedule(
        0.0, peak_learning_rate, warmup_steps, max(total_steps, warmup_steps + 1), end_learning_rate
    )


@gin.configurable
def warmup_linear_schedule(
    peak_learning_rate: float = 1e-3,
    warmup_steps: int = 1_000,
    total_steps: int = 100_000,
    end_learning_rate: float = 0.0,
) -> Schedule:
    """Linear warm-up from 0 to ``peak``, then linear decay to ``end`` at ``total_steps``."""
    warmup = optax.linear_schedule(0.0, peak_learning_rate, max(warmup_steps, 1))
    decay = optax.linear_schedule(peak_learning_rate, end_learning_rate,
                                  max(total_steps - warmup_steps, 1))
    return optax.join_schedules([warmup, decay], [warmup_steps])


@gin.configurable
def constant_schedule(learning_rate: float = 1e-3) -> Schedule:
    """A constant learning rate (fine-tuning: T5 used 1e-3 with Adafactor)."""
    return lambda step: jnp.asarray(learning_rate, jnp.float32)


@gin.configurable
def adafactor(
    schedule: Schedule,
    decay_rate: float = 0.8,
    clipping_threshold: float | None = 1.0,
    factored: bool = True,
    multiply_by_parameter_scale: bool = True,
    min_dim_size_to_factor: int = 128,
    momentum: float | None = None,
) -> optax.GradientTransformation:
    """Adafactor as in T5 (no momentum, factored second moments, update clipping)."""
    return optax.adafactor(
        learning_rate=schedule, min_dim_size_to_factor=min_dim_size_to_factor,
        decay_rate=decay_rate, multiply_by_parameter_scale=multiply_by_parameter_scale,
        clipping_threshold=clipping_threshold, momentum=momentum, factored=factored)


@gin.configurable
def adamw(
    schedule: Schedule,
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.1,
) -> optax.GradientTransformation:
    """AdamW; weight decay only on matrices (not layer-norm scales or other vectors)."""
    return optax.adamw(learning_rate=schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                       mask=lambda params: jax.tree.map(lambda p: p.ndim > 1, params),
                       mu_dtype=jnp.float32)


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """The optax transformation, its schedule (for logging the learning rate) and the global L2
    norm the train step logs and checks: with `multi_tensor`, one reduction per shape that shares
    the optimizer's stacks (apart, the stacks cost more than the kernels they save)."""

    tx: optax.GradientTransformation
    schedule: Schedule
    global_norm: Callable[[Any], jax.Array] = optax.global_norm


OPTIMIZERS: dict[str, Callable[..., optax.GradientTransformation]] = {
    "adafactor": adafactor, "adamw": adamw}


@gin.configurable
def create_optimizer(
    name: str = "adafactor",
    schedule: Schedule | None = None,
    grad_clip_norm: float | None = None,
    multi_tensor: bool = False,
) -> Optimizer:
    """``name`` in {'adafactor', 'adamw'}; ``schedule`` defaults to T5's rsqrt with 10k warm-up.

    ``grad_clip_norm``: clip gradients to this global L2 norm first (None: no clipping; T5's
    Adafactor relies on its own update clipping instead). ``multi_tensor``: run the optimizer
    on stacks of same-shaped parameters (`multi_tensor.by_shape`: the same per-parameter math
    and state, a quarter of the kernels on a GPU, but the stacks are copies the memory planner
    does not count, and the update is equal only to float rounding). Opt-in until a loan
    measures it.
    """
    if name not in OPTIMIZERS:
        raise ConfigError(f"create_optimizer.name={name!r}; choose one of {sorted(OPTIMIZERS)}")
    sched = schedule if schedule is not None else rsqrt_schedule()
    tx = OPTIMIZERS[name](sched)
    if multi_tensor:
        tx = multi_tensor_lib.by_shape(tx)
    if grad_clip_norm is not None:
        tx = optax.chain(optax.clip_by_global_norm(grad_clip_norm), tx)
    norm = multi_tensor_lib.global_norm if multi_tensor else optax.global_norm
    return Optimizer(tx=tx, schedule=sched, global_norm=norm)
