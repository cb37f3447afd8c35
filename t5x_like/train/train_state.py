"""The train state: its shapes and shardings, and its creation directly into them.

The train state is a `TrainState` record (``step`` int32[], fp32 ``params`` and optimizer state);
a checkpoint stores it as the dict ``{'step', 'params', 'opt_state'}`` (`TrainState.as_dict`).
`sharded_state` describes it without allocating anything (what the trainer, the AOT compiler and
the planner start from); `create_state` / `state_with_params` build it on the mesh, each shard on
its own device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from t5x_like.train import partitioning
from t5x_like.train.optimizers import Optimizer


@flax.struct.dataclass
class TrainState:
    """The train state, a pytree: arrays, ShapeDtypeStructs (abstract) or shardings as leaves.

    The fields are in the order a dict's sorted keys flatten in, so the jitted step takes its
    leaves in the same order as it did when the state was a dict.
    """

    opt_state: Any  # the optax state of `params`
    params: Any  # fp32 parameter tree (the model's names)
    step: Any  # int32[]: optimizer steps taken

    def as_dict(self) -> dict[str, Any]:
        """The tree a checkpoint stores: ``{'step', 'params', 'opt_state'}``."""
        return {"step": self.step, "params": self.params, "opt_state": self.opt_state}

    @classmethod
    def from_dict(cls, tree: Mapping[str, Any]) -> TrainState:
        """The state of a checkpoint's tree (`as_dict`'s inverse)."""
        return cls(opt_state=tree["opt_state"], params=tree["params"], step=tree["step"])


@dataclasses.dataclass
class ShardedState:
    """Abstract state (ShapeDtypeStructs with shardings) and the pieces needed to build it."""

    abstract: TrainState
    shardings: TrainState
    logical_params: Any
    init_fn: Callable[[jax.Array], TrainState]


def sharded_state(model: Any, optimizer: Optimizer, init_batch: Mapping[str, jax.Array],
                  mesh: jax.sharding.Mesh, rules: partitioning.LogicalRules) -> ShardedState:
    """Shapes and shardings of the train state, without allocating it."""

    def boxed_params(rng: jax.Array) -> Any:
        return model.init_variables(rng, dict(init_batch))["params"]

    # The key is abstract and made outside the mesh context: an eager op inside
    # `jax.set_mesh` over compile-only devices (deviceless AOT, `t5x_like.aot`) fails.
    key = jax.eval_shape(jax.random.key, 0)
    with partitioning.partitioning_context(mesh, rules):
        abstract_boxed = jax.eval_shape(boxed_params, key)
    logical, param_sh = partitioning.param_shardings(abstract_boxed, mesh, rules)
    abstract_params = nn.unbox(abstract_boxed)
    abstract_opt = jax.eval_shape(optimizer.tx.init, abstract_params)
    opt_sh = partitioning.derived_state_shardings(abstract_opt, abstract_params, logical, mesh,
                                                  rules)
    replicated = NamedSharding(mesh, PartitionSpec())
    shardings = TrainState(opt_state=opt_sh, params=param_sh, step=replicated)
    abstract_state = TrainState(opt_state=abstract_opt, params=abstract_params,
                                step=jax.ShapeDtypeStruct((), jnp.int32))
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            abstract_state, shardings)

    return ShardedState(abstract=abstract, shardings=shardings, logical_params=logical,
                        init_fn=lambda rng: _fresh_state(nn.unbox(boxed_params(rng)), optimizer))


def _fresh_state(params: Any, optimizer: Optimizer) -> TrainState:
    """Step 0 around ``params`` with a fresh optimizer state."""
    step = jnp.zeros((), jnp.int32)
    return TrainState(opt_state=optimizer.tx.init(params), params=params, step=step)


def create_state(plan: ShardedState, rng: jax.Array, mesh: jax.sharding.Mesh,
                 rules: partitioning.LogicalRules) -> TrainState:
    """Initialise the state directly into its shardings (no full copy on any one device)."""
    return partitioning.jit_sharded(plan.init_fn, mesh, rules, in_shardings=None,
                                    out_shardings=plan.shardings)(rng)


def state_with_params(plan: ShardedState, params: Any, optimizer: Optimizer,
                      mesh: jax.sharding.Mesh, rules: partitioning.LogicalRules) -> TrainState:
    """A step-0 state around given (e.g. pre-trained) params with a fresh optimizer state."""
    return partitioning.jit_sharded(lambda p: _fresh_state(p, optimizer), mesh, rules,
                                    in_shardings=(plan.shardings.params,),
                                    out_shardings=plan.shardings)(params)
