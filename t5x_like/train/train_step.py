"""The jitted train / eval step factories over the train state (`train_state.py`).

Gradient accumulation loops over ``num_microbatches`` slices of the
batch inside the jitted step (``lax.scan``); each microbatch's gradient is weighted by its share
of the batch's loss tokens, so the update equals the full-batch one (the loss is a per-token mean).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from t5x_like.train import partitioning
from t5x_like.train.optimizers import Optimizer
from t5x_like.train.train_state import ShardedState, TrainState

NONFINITE_POLICIES = ("stop", "skip")
#: Model metrics that are counts (summed over microbatches); all others are token-weighted means.
_SUM_METRICS = ("num_tokens",)


def _split_microbatches(batch: Mapping[str, jax.Array], n: int) -> dict[str, jax.Array]:
    """[B, ...] -> [n, B/n, ...] with microbatch i = rows i, i+n, ... (spread over all shards)."""

    def split(x: jax.Array) -> jax.Array:
        if x.shape[0] % n:
            raise ValueError(f"batch size {x.shape[0]} not divisible by num_microbatches={n}")
        y = x.reshape(x.shape[0] // n, n, *x.shape[1:])
        return jnp.swapaxes(y, 0, 1)

    return {k: split(v) for k, v in batch.items()}


def make_train_step(model: Any, optimizer: Optimizer, *, num_microbatches: int = 1,
                    on_nonfinite: str = "stop"
                    ) -> Callable[[TrainState, Mapping[str, jax.Array], jax.Array],
                                  tuple[TrainState, dict[str, jax.Array]]]:
    """``step(state, batch, rng) -> (state, metrics)`` (un-jitted; see ``jit_train_step``).

    ``on_nonfinite='skip'`` leaves params/optimizer state unchanged when the loss or gradient
    norm is NaN/inf (the step counter still advances); ``'stop'`` applies it (the host loop stops).
    """
    if on_nonfinite not in NONFINITE_POLICIES:
        raise ValueError(f"on_nonfinite={on_nonfinite!r}; choose one of {NONFINITE_POLICIES}")
    grad_fn = jax.value_and_grad(model.loss_fn, has_aux=True)

    def one(params: Any, mb: Mapping[str, jax.Array], rng: jax.Array,
            total: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
        (loss, metrics), grads = grad_fn(params, dict(mb), rng)
        weight = jnp.sum(mb["decoder_loss_weights"].astype(jnp.float32)) / total
        grads = jax.tree.map(lambda g: g * weight, grads)
        out = {k: jnp.asarray(v, jnp.float32) for k, v in {**metrics, "loss": loss}.items()}
        return grads, {k: v if k in _SUM_METRICS else v * weight for k, v in out.items()}

    def step(state: TrainState, batch: Mapping[str, jax.Array], rng: jax.Array
             ) -> tuple[TrainState, dict]:
        params = state.params
        rng = jax.random.fold_in(rng, state.step)
        total = jnp.maximum(jnp.sum(batch["decoder_loss_weights"].astype(jnp.float32)), 1.0)
        if num_microbatches <= 1:
            grads, metrics = one(params, batch, rng, total)
        else:
            mbs = _split_microbatches(batch, num_microbatches)
            zeros = jax.tree.map(jnp.zeros_like, params)
            first = jax.tree.map(lambda x: x[0], mbs)
            _, m_shape = jax.eval_shape(one, params, first, rng, total)
            m_zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), m_shape)

            def body(carry: Any, xs: Any) -> tuple[Any, None]:
                g_acc, m_acc = carry
                i, mb = xs
                g, m = one(params, mb, jax.random.fold_in(rng, i), total)
                return (jax.tree.map(jnp.add, g_acc, g), jax.tree.map(jnp.add, m_acc, m)), None

            (grads, metrics), _ = jax.lax.scan(
                body, (zeros, m_zeros), (jnp.arange(num_microbatches), mbs))
        grad_norm = optimizer.global_norm(grads)
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
        updates, new_opt = optimizer.tx.update(grads, state.opt_state, params)
        new_params = optax.apply_updates(params, updates)
        if on_nonfinite == "skip":
            new_params, new_opt = jax.tree.map(lambda new, old: jnp.where(finite, new, old),
                                               (new_params, new_opt), (params, state.opt_state))
        metrics = dict(
            metrics, grad_norm=grad_norm,
            learning_rate=jnp.asarray(optimizer.schedule(state.step), jnp.float32),
            finite=finite.astype(jnp.float32), param_norm=optimizer.global_norm(new_params))
        return TrainState(opt_state=new_opt, params=new_params, step=state.step + 1), metrics

    return step


def jit_train_step(step: Callable[..., Any], plan: ShardedState, mesh: jax.sharding.Mesh,
                   rules: partitioning.LogicalRules) -> Callable[..., Any]:
    """Jit the train step with the state's shardings (donated) and batch-sharded inputs."""
    replicated = NamedSharding(mesh, PartitionSpec())
    return partitioning.jit_sharded(
        step, mesh, rules, donate_argnums=(0,),
        in_shardings=(plan.shardings, partitioning.batch_sharding(mesh, rules), replicated),
        out_shardings=(plan.shardings, replicated))


def make_eval_step(model: Any) -> Callable[[Any, Mapping[str, jax.Array]], dict[str, jax.Array]]:
    """``eval(params, batch) -> {'loss_sum', 'accuracy_sum', 'num_tokens'}`` (token sums)."""

    def evaluate(params: Any, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        loss, metrics = model.loss_fn(params, dict(batch), None)
        tokens = jnp.sum(batch["decoder_loss_weights"].astype(jnp.float32))
        out = {"loss_sum": jnp.asarray(loss, jnp.float32) * tokens, "num_tokens": tokens}
        for name in ("cross_entropy", "accuracy"):
            if name in metrics:
                out[f"{name}_sum"] = jnp.asarray(metrics[name], jnp.float32) * tokens
        return out

    return evaluate


def jit_eval_step(fn: Callable[..., Any], plan: ShardedState, mesh: jax.sharding.Mesh,
                  rules: partitioning.LogicalRules) -> Callable[..., Any]:
    """Jit the eval step (params sharded like the train state, batch sharded)."""
    return partitioning.jit_sharded(
        fn, mesh, rules, out_shardings=NamedSharding(mesh, PartitionSpec()),
        in_shardings=(plan.shardings.params, partitioning.batch_sharding(mesh, rules)))
