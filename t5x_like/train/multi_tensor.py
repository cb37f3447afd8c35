"""Per-parameter optimizer math on stacks of same-shaped parameters: fewer, larger kernels.

A T5 has hundreds of parameters but only a handful of shapes (T5.1.1-base: 282 arrays, 7
shapes). Adafactor applied leaf by leaf compiles to about ten small kernels per parameter
(3,052 for the T5.1.1-base step compiled for an H100; its "optimizer / other" kernels took
6.3-6.8 ms on the loan); on stacks `[n, *shape]` the same math runs as a few kernels per shape
(816 in all). `by_shape(tx)` does that for any transformation that works
per leaf (state leaves mirroring the parameters, plus shared scalars such as step counts: every
optax transformation our optimizers chain); its state is `tx`'s own, so checkpoints and their
sharding are unchanged. `global_norm` sums squares the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

_KEY = "x"  # the one leaf of the single-parameter trees a stack is traced as


def shape_groups(leaves: Sequence[Any]) -> list[list[int]]:
    """Indices of `leaves` with equal shape and dtype, in first-seen order."""
    groups: dict[tuple, list[int]] = {}
    for i, leaf in enumerate(leaves):
        groups.setdefault((tuple(jnp.shape(leaf)), jnp.result_type(leaf)), []).append(i)
    return list(groups.values())


def _stack(leaves: Sequence[jax.Array], idx: list[int]) -> jax.Array:
    return jnp.stack([leaves[i] for i in idx])


def global_norm(tree: Any) -> jax.Array:
    """`optax.global_norm`: sqrt of the sum of squares of every leaf, one reduction per shape."""
    leaves = jax.tree.leaves(tree)
    total = sum(jnp.sum(jnp.square(_stack(leaves, g).astype(jnp.float32)))
                for g in shape_groups(leaves))
    return jnp.sqrt(jnp.asarray(total, jnp.float32))


def _param_leaf_map(state: Any, params: Any) -> list[int | None]:
    """For each leaf of `state`, the index of the parameter it belongs to (its path ends with
    that parameter's path, the longest such: a subtree of the state mirrors the parameters), or
    None (a shared leaf: a step count, a schedule's state)."""
    param_paths = [tuple(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    owner: list[int | None] = []
    for path, _ in jax.tree_util.tree_flatten_with_path(state)[0]:
        path = tuple(path)
        matches = [(len(p), i) for i, p in enumerate(param_paths)
                   if p and len(path) >= len(p) and path[-len(p):] == p]
        owner.append(max(matches)[1] if matches else None)
    return owner


def by_shape(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """`tx`, applied to stacks of same-shaped parameters under `jax.vmap` (so every per-leaf
    statistic — factored moments, block RMS — stays per parameter). State: `tx.init`'s."""

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        if params is None:
            raise ValueError("by_shape(tx) needs params (its groups are the parameters' shapes)")
        g_leaves, treedef = jax.tree.flatten(updates)
        p_leaves = treedef.flatten_up_to(params)
        s_leaves, s_def = jax.tree.flatten(state)
        owner = _param_leaf_map(state, params)
        new_updates: list[Any] = [None] * len(g_leaves)
        new_state: list[Any] = [None] * len(s_leaves)
        for group in shape_groups(p_leaves):
            # The single-parameter state of this shape: which of its leaves are per parameter.
            one = {_KEY: jax.ShapeDtypeStruct(jnp.shape(p_leaves[group[0]]),
                                              jnp.result_type(p_leaves[group[0]]))}
            one_state = jax.eval_shape(tx.init, one)
            one_leaves, one_def = jax.tree.flatten(one_state)
            one_owner = _param_leaf_map(one_state, one)
            # A per-parameter leaf of the one-leaf state is the j-th per-parameter leaf kind
            # (v_row, v_col, ...): match kinds to the full state's leaves in order.
            kinds = [k for k, o in enumerate(one_owner) if o is not None]
            shared = [k for k, o in enumerate(one_owner) if o is None]
            per_param = {p: [s for s, o in enumerate(owner) if o == p] for p in group}
            full_shared = [s for s, o in enumerate(owner) if o is None]
            if any(len(per_param[p]) != len(kinds) for p in group) or \
                    len(full_shared) != len(shared):
                raise ValueError("by_shape: the transformation's state does not mirror the "
                                 "parameters leaf by leaf")
            stacked = [jnp.stack([s_leaves[per_param[p][j]] for p in group])
                       for j in range(len(kinds))]
            shared_vals = [s_leaves[s] for s in full_shared]

            def one_update(g, p, per, shared_vals=shared_vals, kinds=kinds, shared=shared,
                           one_leaves=one_leaves, one_def=one_def):
                leaves = list(one_leaves)
                for k, v in zip(kinds, per, strict=True):
                    leaves[k] = v
                for k, v in zip(shared, shared_vals, strict=True):
                    leaves[k] = v
                u, s = tx.update({_KEY: g}, jax.tree.unflatten(one_def, leaves), {_KEY: p})
                s_out = jax.tree.leaves(s)
                return u[_KEY], [s_out[k] for k in kinds], [s_out[k] for k in shared]

            u, per_out, shared_out = jax.vmap(one_update, out_axes=(0, 0, None))(
                _stack(g_leaves, group), _stack(p_leaves, group), stacked)
            for n, p in enumerate(group):
                new_updates[p] = u[n]
                for j, s in enumerate(per_param[p]):
                    new_state[s] = per_out[j][n]
            for s, v in zip(full_shared, shared_out, strict=True):
                new_state[s] = v
        if not g_leaves:  # nothing to update: the shared state still advances
            return tx.update(updates, state, params)
        return jax.tree.unflatten(treedef, new_updates), jax.tree.unflatten(s_def, new_state)

    return optax.GradientTransformation(tx.init, update)
