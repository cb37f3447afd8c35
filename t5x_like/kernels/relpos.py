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


def saturation_distance(*, bidirectional: bool = True, num_buckets: int = 32,
                        max_distance: int = 128) -> int:
    """The largest distance |k - q| whose bucket is not its side's outermost one (-1: none):
    every offset farther from the diagonal shares one bucket per side. A static Python int
    (numpy, float64) for kernels that treat far tiles as one bucket. T5's 32 buckets up to 128
    saturate from distance 91 on (bidirectional; 113 causal), not at max_distance: the last log
    bucket already reaches it. float32, which `relative_position_bucket` uses, can move that
    boundary by one offset at most (consecutive distances differ by far more than its rounding,
    in bucket units); callers add that margin."""
    half = num_buckets // 2 if bidirectional else num_buckets
    num_exact = half // 2
    if max_distance <= num_exact:  # no log-spaced buckets: the formula divides by log(1)
        return max_distance
    distance = np.arange(max_distance + 2, dtype=np.float64)
    scale = (half - num_exact) / np.log(max_distance / num_exact)
    log_bucket = num_exact + np.trunc(np.log(distance / num_exact + np.finfo(np.float32).eps)
                                      * scale)
    bucket = np.where(distance < num_exact, distance, np.minimum(log_bucket, half - 1))
    inner = np.nonzero(bucket != bucket[-1])[0]
    return int(inner[-1]) if inner.size else -1
