"""Activation memory of a training step, read off its traced jaxpr (`plan`'s activations term).

`activation_bytes(config, ...)` traces `jax.vjp` of the loss at 1 and 2 layers per stack for
each remat policy and extrapolates linearly (layers are identical; with remat, plus one layer's
un-rematerialised residuals for the recomputation). The residuals saved for the backward pass
(inputs excluded) are counted at the per-device microbatch: batch-led ones as activations
(divided by the tensor-parallel `model` axis when a dimension is a head / MLP / vocabulary
size), the rest (bf16 weight casts, bias tables) like the parameter shards. For an accelerator,
a residual computed from others through elementwise ops only is recomputed inside the backward
fusion (`_FUSION_PLANS`) and not counted, unless it reads a weight all-gathered by pure FSDP,
which XLA does not recompute from.
"""

from __future__ import annotations

import collections
import contextlib
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


@functools.lru_cache(maxsize=128)
def _saved_jaxpr(config: TransformerConfig, sequence_length: tuple[tuple[str, int], ...],
                 packed: bool) -> tuple[Any, list[Any], int]:
    """(jaxpr, its residual vars, number of parameter leaves) of ``jax.vjp`` of the loss: what
    the vjp keeps for the backward pass (inputs and scalars excluded), traced once and shared
    by every fusion plan."""
    model = make_model(config)
    lengths = dict(sequence_length)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in
             model.example_batch(_TRACE_BATCH, lengths, packed=packed).items()}
    params = nn.unbox(boxed_params(config, tuple(lengths)))
    rng = jax.random.key(1) if config.dropout_rate > 0 else None

    def saved(p: Any, b: Any) -> list[jax.Array]:
        _, vjp = jax.vjp(lambda q: model.loss_fn(q, b, rng)[0], p)
        return jax.tree.leaves(vjp)

    with _kernel_trace_target(config):
        jaxpr = jax.make_jaxpr(saved)(params, batch).jaxpr
    inputs = {id(v) for v in jaxpr.invars}
    out = list({id(v): v for v in jaxpr.outvars  # once each, in order
                if hasattr(v, "aval") and id(v) not in inputs and v.aval.shape}.values())
    return jaxpr, out, len(jax.tree.leaves(params))


def _kernel_trace_target(config: TransformerConfig) -> contextlib.AbstractContextManager[Any]:
    """The Hopper flash kernels trace as the sm_90 kernels they are: on a CPU they would run in
    Pallas' GPU interpreter, whose host callbacks cannot be traced under remat. (The other
    builds trace as the host would run them; their residuals are the same either way.)"""
    if config.attention_impl == "pallas" and config.flash_backend == "mosaic_gpu":
        from t5x_like.kernels import flash

        return flash.compile_target("gpu", "sm_90")
    return contextlib.nullcontext()


@functools.lru_cache(maxsize=256)
def _residuals(config: TransformerConfig, sequence_length: tuple[tuple[str, int], ...],
               packed: bool, fused: str = "", gathered: bool = False,
               kernel_operands: bool = False) -> tuple[Any, ...]:
    """Avals of what ``jax.vjp`` of the loss keeps for the backward pass (`_saved_jaxpr`);
    ``fused``: what is left after elementwise fusion under that plan (``_FUSION_PLANS``);
    ``gathered``: the weights reach the step through an FSDP all-gather; ``kernel_operands``:
    the flash kernels' q, k, v and o (`is_kernel_operand`) are stored as they are, not
    recomputed from their projections (XLA:TPU keeps a custom call's operands in its layout)."""
    jaxpr, out, num_params = _saved_jaxpr(config, sequence_length, packed)
    if fused:
        weights = jaxpr.invars[:num_params] if gathered else ()
        kept = [v for v in out if kernel_operands and is_kernel_operand(v.aval, config)]
        rest = [v for v in out if not any(v is k for k in kept)]
        out = kept + _FUSION_PLANS[fused](jaxpr, rest, {id(w) for w in weights})
    return tuple(v.aval for v in out)


def is_kernel_operand(aval: Any, config: TransformerConfig) -> bool:
    """A flash kernel's `[batch, length, heads, head_dim]` residual (q, k, v or o) of a trace
    of ``config`` with Pallas attention."""
    shape = getattr(aval, "shape", ())
    return (config.attention_impl == "pallas" and len(shape) == 4
            and shape[0] == _TRACE_BATCH and shape[2] in (config.num_heads, config.kv_heads)
            and shape[3] >= config.head_dim)


#: Primitives XLA fuses into their consumers (elementwise, broadcasts, layout changes): a
#: residual computed through only these is recomputed in the backward fusion, not stored.
_ELEMENTWISE = frozenset((
    "abs", "add", "and", "broadcast_in_dim", "ceil", "clamp", "convert_element_type", "copy",
    "copy_p", "cos", "div", "eq", "erf", "exp", "exp2", "expand_dims", "floor", "ge", "gt",
    "integer_pow", "iota", "is_finite", "le", "log", "log1p", "logistic", "lt", "max", "min",
    "mul", "ne", "neg", "not", "or", "pow", "reshape", "rem", "round", "rsqrt", "select_n",
    "sign", "sin", "sqrt", "square", "squeeze", "stop_gradient", "sub", "tanh", "transpose", "xor",
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
    """What an accelerator compiler keeps of ``residuals``: each is stored, or recomputed inside
    a backward fusion from its ``_roots`` (values already stored and the step's inputs are free)
    unless it reads a ``gathered`` weight input (ids): XLA does not recompute from an FSDP
    all-gather's output (XLA:TPU stores a norm's ``x * rsqrt(var) * scale``: T5 on v5e-16 keeps
    twice the residual-stream copies of data parallel).

    Visited in program order, a residual is recomputed when the roots it would add cost less
    than itself: a softmax's f32 exponentials, probabilities and bf16 copy hang off one stored
    score matrix, a mask off the segment ids, and the residual stream is stored once per layer
    (chains of shared roots, which `_fusion_roots_shared` over-counts).
    """
    order = {id(o): i for i, e in enumerate(jaxpr.eqns) for o in e.outvars}
    producer = {id(o): e for e in jaxpr.eqns for o in e.outvars}
    free = {id(v) for v in (*jaxpr.invars, *jaxpr.constvars)}
    stored: dict[int, Any] = {}
    for v in sorted(residuals, key=lambda r: order.get(id(r), -1)):
        if id(v) in stored or id(v) in free:
            continue
        roots = _roots(v, producer, lambda i: i in free or i in stored, gathered)
        if (roots is not None and id(v) not in roots
                and sum(_nbytes(r.aval) for r in roots.values()) < _nbytes(v.aval)):
            stored.update(roots)
        else:
            stored[id(v)] = v
    return [v for v in stored.values() if v.aval.shape]


def _fusion_roots_shared(jaxpr: Any, residuals: Sequence[Any],
                         gathered: frozenset[int] | set[int] = frozenset()) -> list[Any]:
    """Like `_fusion_roots_in_order`, deciding over all residuals at once: each is recomputed
    from its roots unless the roots only it needs cost more than it does, or it reads a
    ``gathered`` weight. Stores a softmax's score matrix once for its masked copy, exponentials
    and probabilities (kept separately by visiting in order when they are separate residuals)."""
    producer = {id(o): e for e in jaxpr.eqns for o in e.outvars}
    inputs = {id(v) for v in (*jaxpr.invars, *jaxpr.constvars)}
    by_id = {id(v): v for v in residuals}
    walked = {k: _roots(v, producer, inputs.__contains__, gathered) for k, v in by_id.items()}
    need = {k: {k: by_id[k]} if rs is None else rs for k, rs in walked.items()}
    kept = {k for k, rs in need.items() if rs.keys() == {k}}
    count = collections.Counter(r for k, rs in need.items() if k not in kept for r in rs)
    # largest first; ties in program order (`need` keeps the residuals' order), not id order
    for k in sorted((k for k in need if k not in kept), key=lambda k: -_nbytes(by_id[k].aval)):
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


def activation_bytes(config: TransformerConfig, *, per_device_batch: int,
                     sequence_length: Mapping[str, int], model_axis: int = 1,
                     param_ratio: float = 1.0, packed: bool = True,
                     fused: bool = True, gathered: bool = False,
                     lanes: int = 0) -> dict[str, float]:
    """Saved-activation bytes per device for every remat policy, ``{policy: bytes}`` (traces
    cached per config; see the module docstring).

    ``model_axis``: the tensor-parallel axis heads / MLP / vocabulary are split over (1: none).
    ``param_ratio``: per-device / global parameter bytes (for weight casts). ``fused``: count
    what XLA:TPU keeps after elementwise fusion (the cheaper of the ``_FUSION_PLANS``), not
    every residual (XLA:CPU). ``gathered``: the weights are split over ``fsdp`` with no ``model``
    axis (pure FSDP; with a ``model`` axis too, XLA:TPU recomputes the chains that read them
    all the same: T5 fsdp_tp on v5e-16). ``lanes``: with Pallas attention, the flash kernels'
    `[batch, length, heads, head_dim]` residuals count with head_dim padded to that many lanes
    (XLA:TPU: 128; its layout of a custom call's operand keeps head_dim minor; 0: unpadded).
    """
    # Dimensions the TP rules shard; an `embed`-sized one never counts (activation_embed is
    # replicated). When heads x head_dim == emb_dim (T5: 12 x 64 = 768) the two are told apart
    # by tracing with head_dim + 2 (even, for RoPE) and counting each traced dimension at its
    # true size (`true_size`: traced -> the config's).
    trace_config, true_size = config, {}
    heads = (config.num_heads, config.kv_heads)
    if model_axis > 1 and config.emb_dim in (n * config.head_dim for n in heads):
        trace_config = config.replace(head_dim=config.head_dim + 2)
        true_size = {n * trace_config.head_dim: n * config.head_dim for n in (1, *heads)}
    tp_sizes = {*heads, config.mlp_dim, config.vocab_size,
                *(n * trace_config.head_dim for n in heads)} - {config.emb_dim}
    batch_scale = per_device_batch / _TRACE_BATCH
    lengths = tuple(sorted((k, int(v)) for k, v in sequence_length.items()))

    def traced(plan_name: str, policy: str, depths: Mapping[str, int]) -> float:
        """Per-device bytes of the residuals of one trace (see the module docstring)."""
        cfg = trace_config.with_layer_stacks(depths).replace(remat_policy=policy,
                                                             scan_layers=False)
        total = 0.0
        for a in _residuals(cfg, lengths, packed, plan_name, gathered and bool(plan_name),
                            lanes > 0):
            nbytes = math.prod(true_size.get(d, d) for d in a.shape) * jnp.dtype(a.dtype).itemsize
            minor = true_size.get(a.shape[-1], a.shape[-1]) if a.shape else 0
            if lanes and is_kernel_operand(a, cfg) and minor < lanes:
                nbytes *= lanes / minor  # a flash kernel's q, k, v or o in TPU lanes
            if len(a.shape) >= 2 and a.shape[0] == _TRACE_BATCH:
                split = next((true_size.get(d, d) for d in a.shape[1:] if d in tp_sizes), None)
                if split:  # GSPMD pads an uneven split: each device holds ceil(d / m) of d
                    nbytes *= math.ceil(split / model_axis) / split
                total += nbytes * batch_scale
            else:
                total += nbytes * param_ratio
        return total

    # Plan "" counts every residual (XLA:CPU); with fusion, the cheaper plan's count.
    estimates = [_extrapolate(config, functools.partial(traced, plan_name))
                 for plan_name in (tuple(_FUSION_PLANS) if fused else ("",))]
    return {policy: min(e[policy] for e in estimates) for policy in REMAT_POLICIES}


def _extrapolate(config: TransformerConfig,
                 measure: Callable[[str, Mapping[str, int]], float]) -> dict[str, float]:
    """{policy: bytes} at the config's layer counts from ``measure(policy, layers per stack)``
    of 1-2 layer traces: one layer per stack ('base'), then each stack with a second; under
    remat, + one layer's un-rematerialised residuals for the recomputation."""
    base = dict.fromkeys(config.layer_stacks(), 1)
    measured = {policy: {"base": measure(policy, base),
                         **{stack: measure(policy, {**base, stack: 2}) for stack in base}}
                for policy in REMAT_POLICIES}
    none = measured["none"]
    recompute = max(none[k] - none["base"] for k in none if k != "base")
    out: dict[str, float] = {}
    for policy, per in measured.items():
        total = per["base"]
        for stack, depth in config.layer_stacks().items():
            total += (depth - 1) * (per[stack] - per["base"])
        if policy != "none":
            total += recompute
        out[policy] = max(total, 0.0)
    return out
