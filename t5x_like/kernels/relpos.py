"""T5 relative-position buckets, as a pure elementwise function.

Lives with the kernels because the flash-attention kernel evaluates it per tile; the models'
relative-position bias layer uses the same function, so both agree bit for bit.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def relative_position_bucket(
    relative_position: jnp.ndarray, *, bidirectional: bool = True, num_buckets: int = 32,
    max_distance: int = 128,
) -> jnp.ndarray:
    """Maps `relative_position = key_index - query_index` to a bucket id in [0, num_buckets).

    Small offsets get a bucket each; larger ones share log-spaced buckets up to `max_distance`,
    beyond which all offsets share the last bucket. Bidirectional (encoder) attention spends half
    the buckets on keys after the query; causal (decoder) attention only sees keys at or before it.
    `relative_position`: int array of any shape; returns int32 of the same shape.
    """
    # Distance looking backwards (query after key) is positive.
    backward = -relative_position.astype(jnp.int32)
    offset = jnp.zeros_like(backward)
    if bidirectional:
        num_buckets //= 2
        offset = jnp.where(backward < 0, num_buckets, 0).astype(jnp.int32)
        distance = jnp.abs(backward)
    else:
        distance = jnp.maximum(backward, 0)
    num_exact = num_buckets // 2
    # Log-spaced buckets for distances in [num_exact, max_distance).
    log_ratio = jnp.log(distance.astype(jnp.float32) / num_exact + np.finfo(np.float32).eps)
    scale = (num_buckets - num_exact) / np.log(max_distance / num_exact)
    log_bucket = num_exact + (log_ratio * scale).astype(jnp.int32)
    log_bucket = jnp.minimum(log_bucket, num_buckets - 1)
    return offset + jnp.where(distance < num_exact, distance, log_bucket)
