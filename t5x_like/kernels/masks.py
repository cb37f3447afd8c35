"""The attention mask rule, in one place (DESIGN.md "Masks").

    allowed[q, k] = segment(q, k) AND (not causal OR k <= q OR (prefix[q] AND prefix[k]))

where segment(q, k) = q_seg == k_seg != 0 with both segment ids, k_seg != 0 (q_seg != 0) with
only the keys' (queries') ids, and True with neither. Used by the flash kernels on each
`[block_q, block_k]` tile, by the plain-jnp reference attention and by the models' dense
(XLA) attention. The kernel tests' float64 oracle keeps its own numpy copy on purpose.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def attention_mask(
    q_index: jax.Array, k_index: jax.Array, *, causal: bool,
    q_segment_ids: jax.Array | None = None, kv_segment_ids: jax.Array | None = None,
    q_prefix: jax.Array | None = None, k_prefix: jax.Array | None = None,
) -> jax.Array | None:
    """Allowed `[..., Lq, Lk]` bool from query-side `[..., Lq]` and key-side `[..., Lk]` vectors.

    Leading dims broadcast (`[B, Lq]` ids with `[1, Lk]` positions, or 1-D tile vectors).
    `q_prefix`/`k_prefix` (nonzero = in the bidirectional prefix) only matter when causal.
    Returns None when everything is allowed.
    """
    mask = None
    if q_segment_ids is not None and kv_segment_ids is not None:
        q_seg = q_segment_ids[..., :, None]
        mask = jnp.logical_and(q_seg == kv_segment_ids[..., None, :], q_seg != 0)
    elif kv_segment_ids is not None:
        mask = kv_segment_ids[..., None, :] != 0
    elif q_segment_ids is not None:
        mask = q_segment_ids[..., :, None] != 0
    if causal:
        allowed = k_index[..., None, :] <= q_index[..., :, None]
        if q_prefix is not None and k_prefix is not None:
            in_prefix = jnp.logical_and(q_prefix[..., :, None] != 0, k_prefix[..., None, :] != 0)
            allowed = jnp.logical_or(allowed, in_prefix)
        mask = allowed if mask is None else jnp.logical_and(mask, allowed)
    return mask
