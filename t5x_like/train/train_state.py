"""The train state: its shapes and shardings, and its creation directly into them.

The train state is a plain dict ``{'step': int32[], 'params': ..., 'opt_state': ...}`` (fp32
params and optimizer state). `sharded_state` describes it without allocating anything (what the
trainer, the AOT compiler and the planner start from); `create_state` / `state_with_params`
build it on the mesh, each shard on its own device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from t5x_like.train import partitioning as P
from t5x_like.train.optimizers import Optimizer


@dataclasses.dataclass
class ShardedState:
    """Abstract state (ShapeDtypeStructs with shardings) and the pieces needed to build it."""

    abstract: Any
    shardings: Any
    logical_params: Any
    init_fn: Callable[[jax.Array], Any]


def sharded_state(
    model: Any,
    optimizer: Optimizer,
    init_batch: Mapping[str, jax.Array],
    mesh: jax.sharding.Mesh,
    rules: P.LogicalRules,
) -> ShardedState:
    """Shapes and shardings of the train state, without allocating it."""

    def boxed_params(rng: jax.Array) -> Any:
        return model.init_variables(rng, dict(init_batch))["params"]

    # The key is abstract and made outside the mesh context: an eager op inside
    # `jax.set_mesh` over compile-only devices (deviceless AOT, `t5x_like.aot`) fails.
    key = jax.eval_shape(jax.random.key, 0)
    with P.partitioning_context(mesh, rules):
        abstract_boxed = jax.eval_shape(boxed_params, key)
    logical, param_sh = P.param_shardings(abstract_boxed, mesh, rules)
    abstract_params = nn.unbox(abstract_boxed)
    abstract_opt = jax.eval_shape(optimizer.tx.init, abstract_params)
    opt_sh = P.derived_state_shardings(abstract_opt, abstract_params, logical, mesh, rules)
    replicated = NamedSharding(mesh, PartitionSpec())
    shardings = {"step": replicated, "params": param_sh, "opt_state": opt_sh}
    abstract_state = {
        "step": jax.ShapeDtypeStruct((), jnp.int32),
        "params": abstract_params,
        "opt_state": abstract_opt,
    }
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state, shardings
    )

    def init_fn(rng: jax.Array) -> Any:
        return _fresh_state(nn.unbox(boxed_params(rng)), optimizer)

    return ShardedState(abstract=abstract, shardings=shardings, logical_params=logical,
                        init_fn=init_fn)


def _fresh_state(params: Any, optimizer: Optimizer) -> Any:
    """Step 0 around ``params`` with a fresh optimizer state."""
    return {"step": jnp.zeros((), jnp.int32), "params": params,
            "opt_state": optimizer.tx.init(params)}


def create_state(plan: ShardedState, rng: jax.Array, mesh: jax.sharding.Mesh,
                 rules: P.LogicalRules) -> Any:
    """Initialise the state directly into its shardings (no full copy on any one device)."""
    init = P.jit_sharded(plan.init_fn, mesh, rules, in_shardings=None,
                         out_shardings=plan.shardings)
    return init(rng)


def state_with_params(plan: ShardedState, params: Any, optimizer: Optimizer,
                      mesh: jax.sharding.Mesh, rules: P.LogicalRules) -> Any:
    """A step-0 state around given (e.g. pre-trained) params with a fresh optimizer state."""
    fn = P.jit_sharded(lambda p: _fresh_state(p, optimizer), mesh, rules,
                       in_shardings=(plan.shardings["params"],), out_shardings=plan.shardings)
    return fn(params)
