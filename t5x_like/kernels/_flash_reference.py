"""Plain-jnp attention with the exact semantics of `flash_attention` (materialises [Lq, Lk]).

Used by the tests (as the fp32/f64 reference and as "plain XLA attention in the same dtype") and
by the benchmark as the XLA baseline. Not a kernel: memory is O(Lq·Lk).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from t5x_like.kernels.masks import attention_mask
from t5x_like.kernels.relpos import relative_position_bucket


def reference_rel_bias(
    table: jax.Array, lq: int, lk: int, *, bidirectional: bool, max_distance: int
) -> jax.Array:
    """T5 bias [1, H, Lq, Lk] from a [num_buckets, H] table."""
    rel = jnp.arange(lk)[None, :] - jnp.arange(lq)[:, None]
    bucket = relative_position_bucket(rel, bidirectional=bidirectional,
                                      num_buckets=table.shape[0], max_distance=max_distance)
    return jnp.transpose(table[bucket], (2, 0, 1))[None]


def reference_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = False,
    q_segment_ids: jax.Array | None = None, kv_segment_ids: jax.Array | None = None,
    prefix_mask: jax.Array | None = None, rel_bias: jax.Array | None = None,
    rel_bidirectional: bool = True, rel_max_distance: int = 128, bias: jax.Array | None = None,
    sm_scale: float = 1.0,
) -> jax.Array:
    """Same signature/semantics as `flash_attention`, computed in the inputs' dtype.

    q [B, Lq, H, D], k/v [B, Lk, Hkv, D] -> [B, Lq, H, D]; fully-masked rows give 0.
    """
    b, lq, h, _ = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    k, v = jnp.repeat(k, h // hkv, axis=2), jnp.repeat(v, h // hkv, axis=2)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) * jnp.asarray(sm_scale, q.dtype)
    if rel_bias is not None:
        logits = logits + reference_rel_bias(rel_bias, lq, lk, bidirectional=rel_bidirectional,
                                             max_distance=rel_max_distance).astype(logits.dtype)
    if bias is not None:
        logits = logits + bias.astype(logits.dtype)
    # Allowed [B, 1, Lq, Lk] bool: `masks.attention_mask` with positions 0..L-1.
    mask = attention_mask(jnp.arange(lq), jnp.arange(lk), causal=causal,
                          q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                          q_prefix=prefix_mask, k_prefix=prefix_mask)
    mask = jnp.broadcast_to(True if mask is None else mask, (b, lq, lk))[:, None]
    logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    probs = jax.nn.softmax(logits, axis=-1)
    probs = jnp.where(mask, probs, 0)  # fully-masked rows: 0, not a uniform average
    return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v)
