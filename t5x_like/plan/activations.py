"""Activation memory of a training step, read off its traced jaxpr (`plan`'s activations term).

`activation_bytes(config, ...)` traces `jax.vjp` of the loss at 1 and 2 layers per stack
(`config.layer_stacks()`) for each remat policy and extrapolates linearly (`_extrapolate`); the
residuals saved for the backward pass are counted at the per-device microbatch, batch-led ones
as activations, the rest (weight casts, bias tables) like the parameter shards. With
`compiler='accelerator'`, residuals XLA recomputes inside the backward fusion (elementwise-only
chains, `_FUSION_PLANS`) are not counted.
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5x_like.models import TransformerConfig, make_model
from t5x_like.models.config import REMAT_POLICIES

#: Per-device batch the residuals are traced at (they are linear in it; 2 keeps batch-led
#: arrays recognisable by their leading dimension).
_TRACE_BATCH = 2


@functools.lru_cache(maxsize=256)
def _residuals(config: TransformerConfig, sequence_length: tuple[tuple[str, int], ...],
               packed: bool, fused: str = "", gathered: bool = False) -> tuple[Any, ...]:
    """Avals of what ``jax.vjp`` of the loss keeps for the backward pass (inputs excluded);
    ``fused``: what is left after elementwise fusion under that plan (``_FUSION_PLANS``);
    ``gathered``: the weights are split over ``fsdp`` (pure FSDP), so each reaches the step
    through a collective."""
    model = make_model(config)
    lengths = dict(sequence_length)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in
             model.example_batch(_TRACE_BATCH, lengths, packed=packed).items()}
    small = model.example_batch(1, {k: 8 for k in lengths})
    params = jax.eval_shape(
        lambda r: nn.unbox(model.init_variables(r, small)["params"]), jax.random.key(0))
    rng = jax.random.key(1) if config.dropout_rate > 0 else None

    def saved(p: Any, b: Any) -> list[jax.Array]:
        _, vjp = jax.vjp(lambda q: model.loss_fn(q, b, rng)[0], p)
        return jax.tree.leaves(vjp)

    jaxpr = jax.make_jaxpr(saved)(params, batch).jaxpr
    inputs = {id(v) for v in jaxpr.invars}
    seen: set[int] = set()
    out = []
    for v in jaxpr.outvars:
        if not hasattr(v, "aval") or id(v) in inputs or id(v) in seen or not v.aval.shape:
            continue
        seen.add(id(v))
        out.append(v)
    if fused:
        weights = jaxpr.invars[: len(jax.tree.leaves(params))] if gathered else ()
        out = _FUSION_PLANS[fused](jaxpr, out, {id(w) for w in weights})
    return tuple(v.aval for v in out)


#: Primitives XLA fuses into their consumers (elementwise, broadcasts, layout changes): a
#: residual computed from others through only these is recomputed in the backward fusion
#: instead of being kept in memory.
_ELEMENTWISE = frozenset((
    "abs", "add", "and", "broadcast_in_dim", "ceil", "clamp", "convert_element_type", "copy",
    "copy_p", "cos", "div", "eq", "erf", "exp", "exp2", "expand_dims", "floor", "ge", "gt",
    "integer_pow", "iota", "is_finite", "le", "log", "log1p", "logistic", "lt", "max", "min",
    "mul", "ne", "neg", "not", "or", "pow", "reshape", "rem", "round", "rsqrt", "select_n",
    "sign", "sin", "sqrt", "square", "squeeze", "stop_gradient", "sub", "tanh", "transpose",
    "xor",
))


def _nbytes(aval: Any) -> int:
    return math.prod(aval.shape) * jnp.dtype(aval.dtype).itemsize


def _is_elementwise(eqn: Any) -> bool:
    if eqn.primitive.name in _ELEMENTWISE:
        return True
    inner = eqn.params.get("jaxpr")  # a nested jit of elementwise ops only (jnp.where, ...)
    inner = getattr(inner, "jaxpr", inner)
    return (eqn.primitive.name in ("jit", "pjit") and inner is not None
            and all(_is_elementwise(e) for e in inner.eqns))


def _roots(v: Any, producer: Mapping[int, Any], done: Callable[[int], bool],
           gathered: frozenset[int] | set[int]) -> dict[int, Any] | None:
    """The roots ``v`` is recomputed from: the nearest values upstream through elementwise ops
    only that are not elementwise outputs (matmul / reduction / gather outputs), by id; values
    whose id is ``done`` (inputs, already stored) are not walked. None when the chain reads a
    ``gathered`` weight (XLA stores such a residual)."""
    found: dict[int, Any] = {}
    stack, seen = [v], set()
    while stack:
        x = stack.pop()
        if not hasattr(x, "aval") or id(x) in seen:  # literals
            continue
        seen.add(id(x))
        if id(x) in gathered and x is not v:
            return None
        if done(id(x)):
            continue
        eqn = producer.get(id(x))
        if eqn is None or not _is_elementwise(eqn):
            found[id(x)] = x
        else:
            stack.extend(eqn.invars)
    return found


def _fusion_roots_in_order(jaxpr: Any, residuals: Sequence[Any],
                           gathered: frozenset[int] | set[int] = frozenset()) -> list[Any]:
    """What an accelerator compiler keeps of ``residuals``: each residual is either stored or
    recomputed inside a backward fusion from its *roots*: the nearest values upstream through
    elementwise ops only that are matmul / reduction / gather outputs (stored then), values
    already stored, or the step's inputs (in memory anyway).

    ``gathered``: ids of weight inputs that arrive through an all-gather (FSDP). XLA does not
    recompute a chain that reads a collective's output (a norm's ``x * rsqrt(var) * scale``
    with an all-gathered ``scale``): such a residual is stored (XLA:TPU, T5 on v5e-16: twice the
    residual-stream copies of data parallel).

    Residuals are visited in program order; one is recomputed when the roots it would add
    cost less than itself, so a softmax's f32 exponentials, probabilities and bf16 copy all
    hang off one stored score matrix, a mask off the segment ids, and the residual stream is
    stored once per layer (chains of shared roots, which `_fusion_roots_shared` over-counts).
    """
    order = {id(o): i for i, e in enumerate(jaxpr.eqns) for o in e.outvars}
    producer = {id(o): e for e in jaxpr.eqns for o in e.outvars}
    free = {id(v) for v in (*jaxpr.invars, *jaxpr.constvars)}
    stored: dict[int, Any] = {}
    for v in sorted(residuals, key=lambda r: order.get(id(r), -1)):
        if id(v) in stored or id(v) in free:
            continue
        # Roots not yet stored; None when the chain reads a gathered weight.
        roots = _roots(v, producer, lambda i: i in free or i in stored, gathered)
        if (roots is not None and id(v) not in roots
                and sum(_nbytes(r.aval) for r in roots.values()) < _nbytes(v.aval)):
            stored.update(roots)
        else:
            stored[id(v)] = v
    return [v for v in stored.values() if v.aval.shape]


def _fusion_roots_shared(jaxpr: Any, residuals: Sequence[Any],
                         gathered: frozenset[int] | set[int] = frozenset()) -> list[Any]:
    """Like `_fusion_roots_in_order`, deciding over all residuals at once: every residual is
    recomputed from its roots (matmul / reduction / gather outputs upstream through elementwise
    ops; the step's inputs are free) unless the roots only it needs cost more than it does, or
    it reads a ``gathered`` weight. Stores a softmax's score matrix once for its masked copy,
    exponentials and probabilities (which visiting in order keeps separately when they are
    separate residuals)."""
    producer = {id(o): e for e in jaxpr.eqns for o in e.outvars}
    inputs = {id(v) for v in (*jaxpr.invars, *jaxpr.constvars)}
    by_id = {id(v): v for v in residuals}
    walked = {k: _roots(v, producer, inputs.__contains__, gathered) for k, v in by_id.items()}
    # None: stored, as XLA does not recompute from a collective's output.
    need = {k: {k: by_id[k]} if rs is None else rs for k, rs in walked.items()}
    kept = {k for k, rs in need.items() if rs.keys() == {k}}
    count = collections.Counter(r for k, rs in need.items() if k not in kept for r in rs)
    for k in sorted(set(need) - kept, key=lambda k: -_nbytes(by_id[k].aval)):
        own = sum(_nbytes(r.aval) for rk, r in need[k].items()
                  if count[rk] == 1 and rk not in kept)
        if own > _nbytes(by_id[k].aval):
            kept.add(k)
            for rk in need[k]:
                count[rk] -= 1
    stored = {k: by_id[k] for k in kept}
    for rs in (need[k] for k in need if k not in kept):
        stored.update((rk, r) for rk, r in rs.items() if count[rk] > 0)
    return [v for v in stored.values() if v.aval.shape]


#: Fusion plans `_residuals(..., fused=...)` can model; `activation_bytes` takes the cheaper.
_FUSION_PLANS = {"in_order": _fusion_roots_in_order, "shared": _fusion_roots_shared}


@functools.lru_cache(maxsize=32)
def boxed_params(config: TransformerConfig, features: tuple[str, ...]) -> Any:
    """Abstract boxed parameters (``jax.eval_shape`` of the init: nothing is allocated)."""
    model = make_model(config)
    small = model.example_batch(1, {k: 8 for k in features})
    return jax.eval_shape(lambda r: model.init_variables(r, small)["params"], jax.random.key(0))


def _residual_bytes(avals: Sequence[Any], *, batch_scale: float, model_axis: int, tp: bool,
                    tp_sizes: set[int], param_ratio: float,
                    true_size: Mapping[int, int] | None = None) -> float:
    """Per-device bytes of residuals traced at ``_TRACE_BATCH`` (see module docstring).
    ``true_size``: traced dimension -> the config's (a trace with a widened ``head_dim``)."""
    total = 0.0
    true_size = true_size or {}
    for a in avals:
        dims = [true_size.get(d, d) for d in a.shape]
        nbytes = math.prod(dims) * jnp.dtype(a.dtype).itemsize
        if len(a.shape) >= 2 and a.shape[0] == _TRACE_BATCH:
            split = [true_size.get(d, d) for d in a.shape[1:] if d in tp_sizes
                     ] if tp and model_axis > 1 else []
            if split:  # GSPMD pads an uneven split: each device holds ceil(d / m) of d
                nbytes *= math.ceil(split[0] / model_axis) / split[0]
            total += nbytes * batch_scale
        else:
            total += nbytes * param_ratio
    return total


def activation_bytes(config: TransformerConfig, *, per_device_batch: int,
                     sequence_length: Mapping[str, int], model_axis: int = 1, tp: bool = False,
                     param_ratio: float = 1.0, packed: bool = True,
                     fused: bool = True, gathered: bool = False) -> dict[str, float]:
    """Saved-activation bytes per device for every remat policy, ``{policy: bytes}``.

    Traced with 1-2 layers per stack (cached per config) and extrapolated to the config's
    layer counts; with remat, one layer's un-rematerialised residuals are added for the
    recomputation. ``param_ratio``: per-device / global parameter bytes (for weight casts).
    ``fused``: count what an accelerator compiler keeps after elementwise fusion (the cheaper
    of the ``_FUSION_PLANS``; XLA:TPU), not every residual of the jaxpr (XLA:CPU).
    ``gathered``: the weights are split over ``fsdp`` with no ``model`` axis (pure FSDP), so
    elementwise chains that read one are stored, not recomputed.
    """
    # Dimensions the TP rules shard; an `embed`-sized one never counts (activation_embed is
    # replicated). When heads x head_dim == emb_dim (T5: 12 x 64 = 768) the two are told apart
    # by tracing with head_dim + 2 (even, for RoPE) and counting each traced dimension at its
    # true size.
    trace_config, true_size = config, {}
    if tp and model_axis > 1 and config.emb_dim in (config.num_heads * config.head_dim,
                                                    config.kv_heads * config.head_dim):
        wide = config.head_dim + 2
        trace_config = config.replace(head_dim=wide)
        true_size = {wide: config.head_dim, config.num_heads * wide: config.num_heads
                     * config.head_dim, config.kv_heads * wide: config.kv_heads * config.head_dim}
    joined = {trace_config.num_heads * trace_config.head_dim,
              trace_config.kv_heads * trace_config.head_dim}
    tp_sizes = {config.num_heads, config.kv_heads, config.mlp_dim, config.vocab_size,
                *joined} - {config.emb_dim}
    # One layer per stack ("base"), then each stack with a second layer.
    base = dict.fromkeys(config.layer_stacks(), 1)
    variants = {"base": base, **{stack: {**base, stack: 2} for stack in base}}
    lengths = tuple(sorted((k, int(v)) for k, v in sequence_length.items()))
    plans = tuple(_FUSION_PLANS) if fused else ("",)
    best: dict[str, float] = {}
    for plan_name in plans:
        measured: dict[str, dict[str, float]] = {}
        for policy in REMAT_POLICIES:
            per: dict[str, float] = {}
            for name, depths in variants.items():
                cfg = trace_config.with_layer_stacks(depths).replace(remat_policy=policy,
                                                                     scan_layers=False)
                per[name] = _residual_bytes(
                    _residuals(cfg, lengths, packed, plan_name, gathered and bool(plan_name)),
                    batch_scale=per_device_batch / _TRACE_BATCH, model_axis=model_axis,
                    tp=tp, tp_sizes=tp_sizes, param_ratio=param_ratio, true_size=true_size)
            measured[policy] = per
        for policy, total in _extrapolate(config, measured).items():
            best[policy] = min(best.get(policy, math.inf), total)  # the cheaper fusion plan
    return best


def _extrapolate(config: TransformerConfig,
                 measured: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """{policy: bytes} for the config's layer counts from the 1-2 layer traces (`measured`:
    policy -> {'base': one layer per stack, stack: that stack with two}; + one layer's
    un-rematerialised residuals for the recomputation under remat)."""
    out: dict[str, float] = {}
    for policy, per in measured.items():
        base = per["base"]
        total = base
        for stack, depth in config.layer_stacks().items():
            total += (depth - 1) * (per[stack] - base)
        if policy != "none":
            none = measured["none"]
            total += max(none[k] - none["base"] for k in none if k != "base")
        out[policy] = max(total, 0.0)
    return out
