"""The one attention entry point: masks and biases built once per stack, three implementations.

A stack describes who may attend to whom with a `MaskSpec` (segment ids, causal flag, prefix
mask, the T5 relative-bias table) built once by `make_mask_spec`; for the dense implementations
the spec also carries the dense mask `[B, 1, Lq, Lk]` and bias `[B|1, H, Lq, Lk]`, computed once
and shared by every layer. `attend(q, k, v, spec, impl=...)` then dispatches:

- `xla`: einsum reference with an fp32 softmax (and attention-probability dropout);
- `cudnn`: `jax.nn.dot_product_attention` (cuDNN flash attention on GPU, XLA elsewhere);
- `pallas`: `t5x_like.kernels.flash_attention` (module `kernels/flash.py`), fed the small
  inputs (segment ids, prefix mask, bias table), never dense masks; under a multi-device mesh
  inside `jax.shard_map` (`_attend_pallas`).

Allowed(q, k) = kv segment != 0 AND same segment (when query segments are given)
AND (not causal OR k_index <= q_index OR (prefix[q] AND prefix[k])).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from t5x_like.kernels.masks import attention_mask
from t5x_like.models.config import NEG_INF, TransformerConfig
from t5x_like.models.layers import (
    BATCH_LENGTH_EMBED,
    apply_rope,
    attention_kernel_init,
    constrain,
    make_dense,
    relative_bias,
)

HEAD_AXES = ("activation_batch", "activation_length", "activation_heads", "activation_kv")


@flax.struct.dataclass
class MaskSpec:
    """Who may attend to whom, for one stack.

    Arrays: `q_segment_ids [B, Lq]`, `kv_segment_ids [B, Lk]` (0 = padding), `prefix_mask
    [B, Lq]` bool, `q_index [B|1, Lq]`, `k_index [B|1, Lk]` (absolute positions, used by the
    causal rule and the relative bias), `rel_table [heads, buckets]`; `dense_mask
    [B, 1, Lq, Lk]` and `dense_bias [B|1, heads, Lq, Lk]` are filled for the dense impls.
    """

    q_segment_ids: jax.Array | None
    kv_segment_ids: jax.Array | None
    prefix_mask: jax.Array | None
    q_index: jax.Array
    k_index: jax.Array
    rel_table: jax.Array | None
    dense_mask: jax.Array | None = None
    dense_bias: jax.Array | None = None
    causal: bool = flax.struct.field(pytree_node=False, default=False)
    rel_bidirectional: bool = flax.struct.field(pytree_node=False, default=True)
    rel_max_distance: int = flax.struct.field(pytree_node=False, default=128)
    is_aligned: bool = flax.struct.field(pytree_node=False, default=True)


def make_mask_spec(
    *,
    q_segment_ids: jax.Array | None,
    kv_segment_ids: jax.Array | None,
    causal: bool = False,
    prefix_mask: jax.Array | None = None,
    q_index: jax.Array | None = None,
    k_index: jax.Array | None = None,
    q_length: int | None = None,
    kv_length: int | None = None,
    rel_table: jax.Array | None = None,
    rel_bidirectional: bool = True,
    rel_max_distance: int = 128,
    impl: str = "xla",
) -> MaskSpec:
    """Builds the spec for one stack; dense mask/bias are materialised unless `impl='pallas'`.

    Without `q_index`/`k_index` the queries and keys are positions `0..L-1` of the same
    sequence (`is_aligned`), which is what the flash kernel assumes; decoding passes the cache
    index as `q_index`.
    """
    is_aligned = q_index is None and k_index is None
    if q_index is None:
        lq = q_length if q_length is not None else q_segment_ids.shape[1]
        q_index = jnp.arange(lq, dtype=jnp.int32)[None]
    if k_index is None:
        lk = kv_length if kv_length is not None else kv_segment_ids.shape[1]
        k_index = jnp.arange(lk, dtype=jnp.int32)[None]
    spec = MaskSpec(q_segment_ids, kv_segment_ids, prefix_mask, q_index, k_index, rel_table,
                    causal=causal, rel_bidirectional=rel_bidirectional,
                    rel_max_distance=rel_max_distance, is_aligned=is_aligned)
    if impl == "pallas" and is_aligned:
        return spec
    bias = None if rel_table is None else relative_bias(  # [B|1, heads, Lq, Lk] fp32
        rel_table.astype(jnp.float32), q_index, k_index, bidirectional=rel_bidirectional,
        max_distance=rel_max_distance)
    return spec.replace(dense_mask=dense_mask(spec), dense_bias=bias)


def dense_mask(spec: MaskSpec) -> jax.Array | None:
    """Boolean `[B, 1, Lq, Lk]` (True = may attend), or None when everything is allowed.

    The kernels' rule (`kernels.masks.attention_mask`) at the spec's absolute positions.
    """
    q_segment_ids = spec.q_segment_ids if spec.kv_segment_ids is not None else None
    allowed = attention_mask(
        spec.q_index, spec.k_index, causal=spec.causal, q_segment_ids=q_segment_ids,
        kv_segment_ids=spec.kv_segment_ids, q_prefix=spec.prefix_mask,
        k_prefix=spec.prefix_mask)
    return None if allowed is None else allowed[:, None]


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    spec: MaskSpec,
    *,
    impl: str = "xla",
    scale: float = 1.0,
    float32_logits: bool = True,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    flash_backend: str = "auto",
) -> jax.Array:
    """softmax(scale · q kᵀ + bias, masked) v.

    `q: [batch, q_length, heads, head_dim]`, `k, v: [batch, kv_length, kv_heads, head_dim]`
    with heads % kv_heads == 0 (MHA/GQA/MQA). Returns `[batch, q_length, heads, head_dim]`.
    Attention-probability dropout exists only in the XLA reference; a training step with
    dropout therefore runs `xla` whatever `impl` says. `flash_backend` picks the build of the
    flash kernel `impl='pallas'` runs (`kernels.flash.BACKENDS`).
    """
    if dropout_rate > 0.0 and dropout_rng is not None and impl != "xla":
        _warn_once(f"attention dropout is only in the xla implementation; {impl} -> xla")
        impl = "xla"
    if not spec.is_aligned:
        impl = "xla"  # decoding one query against a cache: memory-bound, no kernel needed
    if impl == "xla":
        return _attend_xla(q, k, v, spec, scale, float32_logits, dropout_rate, dropout_rng)
    if impl == "cudnn":
        return _attend_cudnn(q, k, v, spec, scale)
    if impl == "pallas":
        return _attend_pallas(q, k, v, spec, scale, flash_backend)
    raise ValueError(f"unknown attention impl {impl!r}")


def add_bias(logits: jax.Array, bias: jax.Array) -> jax.Array:
    """`logits [B, H, Lq, Lk] + bias [B|1, H, Lq, Lk]`.

    A bias shared by the batch (the unpacked relative bias) gets its gradient, the batch sum
    of the logits' gradient, as a contraction with ones. Autodiff's `reduce_sum` over the
    leading axis runs ~30x slower on XLA:CPU, and XLA fuses the sums of every layer into one
    reduction that keeps all their `[B, H, Lq, Lk]` gradients alive until the end.
    """
    if bias.shape[0] == logits.shape[0]:
        return logits + bias
    return _add_batch_shared_bias(logits, bias)


@jax.custom_vjp
def _add_batch_shared_bias(logits: jax.Array, bias: jax.Array) -> jax.Array:
    return logits + bias


def _add_batch_shared_bias_bwd(_, g):
    ones = jnp.ones((g.shape[0],), g.dtype)
    dbias = jax.lax.dot_general(ones, g, (((0,), (0,)), ((), ())))
    return g, dbias[None]


_add_batch_shared_bias.defvjp(lambda logits, bias: (logits + bias, None),
                              _add_batch_shared_bias_bwd)


def _attend_xla(q, k, v, spec, scale, float32_logits, dropout_rate, dropout_rng):
    b, lq, h, d = q.shape
    hkv = k.shape[2]
    qg = q.reshape(b, lq, hkv, h // hkv, d)
    if float32_logits:
        qg, k = qg.astype(jnp.float32), k.astype(jnp.float32)
    logits = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k) * scale
    logits = logits.reshape(b, h, lq, k.shape[1]).astype(jnp.float32)
    if spec.dense_bias is not None:
        logits = add_bias(logits, spec.dense_bias)
    if spec.dense_mask is not None:
        logits = jnp.where(spec.dense_mask, logits, NEG_INF)
    probs = jax.nn.softmax(logits, axis=-1)
    if dropout_rate > 0.0 and dropout_rng is not None:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
        probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    probs = probs.astype(v.dtype).reshape(b, hkv, h // hkv, lq, k.shape[1])
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs, v)
    return out.reshape(b, lq, h, d)


def _attend_cudnn(q, k, v, spec, scale):
    use_cudnn = jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16)
    bias = None if spec.dense_bias is None else spec.dense_bias.astype(q.dtype)
    return jax.nn.dot_product_attention(
        q, k.astype(q.dtype), v.astype(q.dtype), bias=bias, mask=spec.dense_mask, scale=scale,
        implementation="cudnn" if use_cudnn else None)


@dataclasses.dataclass(frozen=True)
class PallasShards:
    """How `_attend_pallas` splits the flash kernel over the active mesh.

    Batch over `batch_axes`, heads over `head_axes` (K/V heads first repeated `kv_repeat` times
    so they split with their query heads), everything else replicated. `dropped` names the
    mesh axes the logical rules asked for but a dimension was not divisible by.
    """

    batch_axes: tuple[str, ...]
    head_axes: tuple[str, ...]
    kv_repeat: int
    dropped: tuple[str, ...]


def _divisible_prefix(axes: tuple[str, ...], size: int, sizes: dict[str, int]):
    """Longest prefix of `axes` whose mesh-size product divides `size`, and the rest."""
    n = 0
    while n < len(axes) and size % math.prod(sizes[a] for a in axes[: n + 1]) == 0:
        n += 1
    return axes[:n], axes[n:]


def pallas_shards(mesh, batch: int, heads: int, kv_heads: int) -> PallasShards | None:
    """The split of a `[batch, L, heads, D]` flash call over `mesh` (None: call it directly).

    Axes come from the logical rules: `activation_batch` for the batch, `activation_heads` for
    the heads, as the model's activation constraints use them. A dimension not divisible by
    its axes keeps the longest divisible prefix of them; the rest compute it redundantly.
    GQA/MQA: when `kv_heads` is not divisible by the head axes, K/V heads are repeated to
    lcm(kv_heads, head shards), which divides `heads`, so every shard holds the K/V heads of
    its own query heads. None when no mesh is active, it has one device, or all its axes are
    already manual (inside another shard_map).
    """
    if mesh.empty:
        return None
    manual = set(mesh.manual_axes)
    sizes = {a: s for a, s in zip(mesh.axis_names, mesh.axis_sizes, strict=True)
             if a not in manual}
    if math.prod(sizes.values()) <= 1:
        return None
    spec = nn.logical_to_mesh_axes(HEAD_AXES)

    def free(entry) -> tuple[str, ...]:
        """The non-manual mesh axes of a rule's entry (None, one axis or a tuple of them)."""
        return tuple(a for a in ((entry,) if isinstance(entry, str) else entry or ()) if a in sizes)

    batch_axes, dropped_b = _divisible_prefix(free(spec[0]), batch, sizes)
    head_axes, dropped_h = _divisible_prefix(free(spec[2]), heads, sizes)
    shards = math.prod(sizes[a] for a in head_axes)
    kv_repeat = 1 if kv_heads % shards == 0 else math.lcm(kv_heads, shards) // kv_heads
    return PallasShards(batch_axes, head_axes, kv_repeat, dropped_b + dropped_h)


def _attend_pallas(q, k, v, spec, scale, backend="auto"):
    """The flash kernel, inside `jax.shard_map` whenever a multi-device mesh is active.

    Pallas kernels (Mosaic on TPU, Triton on GPU) are custom calls XLA cannot partition, so
    each device runs the kernel on its own batch/head shard: q/k/v `[B, L, H, D]` split as
    `PallasShards` says, the rel table `[buckets, H]` by heads, segment ids and the prefix
    mask `[B, L]` by batch. Gradients flow through shard_map (replicated inputs' cotangents
    are summed over the axes they are replicated on).
    """
    from t5x_like.kernels import flash_attention

    k, v = k.astype(q.dtype), v.astype(q.dtype)
    named = {"q_segment_ids": spec.q_segment_ids, "kv_segment_ids": spec.kv_segment_ids,
             "prefix_mask": spec.prefix_mask,
             "rel_bias": None if spec.rel_table is None else spec.rel_table.T.astype(jnp.float32)}
    named = {key: val for key, val in named.items() if val is not None}

    def call(q, k, v, named):
        return flash_attention(
            q, k, v, causal=spec.causal, rel_bidirectional=spec.rel_bidirectional,
            rel_max_distance=spec.rel_max_distance, sm_scale=scale, backend=backend, **named)

    mesh = jax.sharding.get_abstract_mesh()
    plan = pallas_shards(mesh, q.shape[0], q.shape[2], k.shape[2])
    if plan is None:
        return call(q, k, v, named)
    if plan.dropped:
        _warn_once(f"pallas attention: mesh axes {plan.dropped} do not divide batch "
                   f"{q.shape[0]} / heads {q.shape[2]}; computed redundantly over them")
    if plan.kv_repeat > 1:
        k, v = (jnp.repeat(x, plan.kv_repeat, axis=2) for x in (k, v))
    b, h = plan.batch_axes or None, plan.head_axes or None
    qkv = PartitionSpec(b, None, h, None)
    side = {key: PartitionSpec(None, h) if key == "rel_bias" else PartitionSpec(b, None)
            for key in named}
    sharded = jax.shard_map(
        call, mesh=mesh, in_specs=(qkv, qkv, qkv, side), out_specs=qkv,
        axis_names=set(mesh.axis_names) - set(mesh.manual_axes), check_vma=False)
    return sharded(q, k, v, named)


@functools.cache
def _warn_once(message: str) -> None:
    logging.getLogger(__name__).warning(message)


class MultiHeadAttention(nn.Module):
    """Projections around `attend`, T5X names `query`, `key`, `value`, `out`.

    Kernels are stored 2-D (`[embed, heads * head_dim]`, logical axes `('embed', 'joined_kv')`)
    as in T5X. With T5's relative bias the 1/sqrt(head_dim) logit scale is folded into the
    query initialisation instead of being applied. `decode`: None (training/scoring),
    `'prefill'` (attend over the inputs and write their K/V into a fresh cache of
    `max_decode_length`) or `'step'` (one query per example at `spec.q_index`; self-attention
    writes its K/V there and attends over the cache, cross-attention reads its cached K/V).
    """

    config: TransformerConfig
    is_cross: bool = False
    deterministic: bool = True
    decode: str | None = None
    max_decode_length: int | None = None

    @nn.compact
    def __call__(
        self,
        x_q: jax.Array,
        x_kv: jax.Array | None,
        spec: MaskSpec,
        positions: jax.Array | None = None,
    ) -> jax.Array:
        """`x_q: [B, Lq, embed]`, `x_kv: [B, Lk, embed]` -> `[B, Lq, embed]`."""
        cfg = self.config
        h, hkv, d = cfg.num_heads, cfg.kv_heads, cfg.head_dim
        q = self._project(x_q, h, "query", self._query_init())
        if self.is_cross and self.decode == "step":
            k = self.get_variable("cache", "cached_key")
            v = self.get_variable("cache", "cached_value")
        else:
            k = self._project(x_kv, hkv, "key", attention_kernel_init)
            v = self._project(x_kv, hkv, "value", attention_kernel_init)
        if cfg.position_encoding == "rope" and not self.is_cross:
            q = apply_rope(q, positions, cfg)
            k = apply_rope(k, positions, cfg)
        if self.decode is not None:
            k, v = self._update_cache(k, v, spec)
        dropout = not self.deterministic and cfg.dropout_rate > 0.0
        dropout_rng = self.make_rng("dropout") if dropout else None
        out = attend(q, k, v, spec, impl=cfg.attention_impl, scale=cfg.attention_scale,
                     float32_logits=cfg.float32_attention_logits, dropout_rate=cfg.dropout_rate,
                     dropout_rng=dropout_rng, flash_backend=cfg.flash_backend)
        out = constrain(out, HEAD_AXES).reshape(out.shape[0], out.shape[1], h * d)
        proj = make_dense(cfg, cfg.emb_dim, ("joined_kv", "embed"), "out", attention_kernel_init)
        return constrain(proj(out), BATCH_LENGTH_EMBED)

    def _query_init(self):
        if self.config.attention_scale != 1.0:
            return attention_kernel_init
        depth_scale = self.config.head_dim**-0.5
        return lambda *args: attention_kernel_init(*args) * depth_scale

    def _project(self, x: jax.Array, heads: int, name: str, init) -> jax.Array:
        cfg = self.config
        y = make_dense(cfg, heads * cfg.head_dim, ("embed", "joined_kv"), name, init)(x)
        return constrain(y.reshape(*x.shape[:2], heads, cfg.head_dim), HEAD_AXES)

    def _update_cache(self, k: jax.Array, v: jax.Array, spec: MaskSpec):
        """Writes K/V into the 'cache' collection; returns the K/V to attend over."""
        if self.is_cross:
            if self.decode == "prefill":
                self._put_cache(k, v)
            return k, v
        if self.decode == "prefill":
            shape = (k.shape[0], self.max_decode_length, *k.shape[2:])
            caches = (jnp.zeros(shape, k.dtype), jnp.zeros(shape, v.dtype))
            start = jnp.zeros((k.shape[0],), jnp.int32)
        else:
            caches = (self.get_variable("cache", "cached_key"),
                      self.get_variable("cache", "cached_value"))
            start = spec.q_index[:, 0]
        # Per example b: cache[b, start[b]:start[b] + Lq] = k[b] (resp. v[b]).
        write = lambda c, u, s: jax.lax.dynamic_update_slice(c, u.astype(c.dtype), (s, 0, 0))
        k_all, v_all = jax.vmap(write)(caches[0], k, start), jax.vmap(write)(caches[1], v, start)
        self._put_cache(k_all, v_all)
        return (k, v) if self.decode == "prefill" else (k_all, v_all)

    def _put_cache(self, k: jax.Array, v: jax.Array) -> None:
        self.put_variable("cache", "cached_key", k)
        self.put_variable("cache", "cached_value", v)
