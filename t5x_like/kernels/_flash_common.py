"""Static kernel configuration and the per-tile math shared by the GPU and TPU flash kernels.

Everything here runs *inside* a Pallas kernel on one `[block_q, block_k]` tile: the mask is built
from index vectors, segment ids and prefix flags; the T5 relative bias is computed from the bucket
function and a `[num_buckets_padded]` row of the bucket table; and the table gradient is reduced
from the tile's `dS`. Nothing of size `[Lq, Lk]` ever exists outside a tile.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from t5x_like.kernels.masks import attention_mask
from t5x_like.kernels.relpos import relative_position_bucket

# Row maximum of a fully-masked row; replaced by 0 before exponentiating so nothing becomes NaN.
# The kernel's own constant, not models.config.NEG_INF (-1e30): the online softmax tests
# `m == -inf` to find rows with no allowed key yet, which a finite value could not mark
# (kernels import nothing from models).
NEG_INF = float("-inf")


@dataclasses.dataclass(frozen=True)
class FlashConfig:
    """Static (hashable) description of one flash-attention call, after padding.

    `lq`/`lk` are the true lengths, `lq_pad`/`lk_pad` the block multiples the kernels see.
    `group` = H // Hkv. `kv_pad_mask` masks keys >= lk when no segment ids carry the padding.
    `block_q`/`block_k`/`num_warps`/`num_stages` are the forward kernel's; the backward kernels
    (dK/dV and dQ) use the `bwd_*` ones. `lq_pad`/`lk_pad` are multiples of every block used.
    """

    backend: str
    interpret: bool
    causal: bool
    has_seg: bool
    has_prefix: bool
    has_rel: bool
    has_bias: bool
    bias_batch: int  # 1 (broadcast) or B
    bias_heads: int  # 1 (broadcast) or H
    sm_scale: float
    block_q: int
    block_k: int
    lq: int
    lk: int
    lq_pad: int
    lk_pad: int
    head_dim_pad: int
    num_heads: int
    group: int
    num_buckets: int
    num_buckets_pad: int
    rel_bidirectional: bool
    rel_max_distance: int
    kv_pad_mask: bool
    num_warps: int
    num_stages: int
    bwd_block_q: int
    bwd_block_k: int
    bwd_num_warps: int
    bwd_num_stages: int

    def __post_init__(self):
        for name in ("block_q", "bwd_block_q"):
            if self.lq_pad % getattr(self, name):
                raise ValueError(f"lq_pad={self.lq_pad} is not a multiple of {name}")
        for name in ("block_k", "bwd_block_k"):
            if self.lk_pad % getattr(self, name):
                raise ValueError(f"lk_pad={self.lk_pad} is not a multiple of {name}")

    @property
    def nq(self) -> int:
        return self.lq_pad // self.block_q

    @property
    def nk(self) -> int:
        return self.lk_pad // self.block_k

    def for_backward(self) -> FlashConfig:
        """The same call with the backward blocks/warps/stages in the forward fields, so tile code
        written against `block_q`/`block_k`/`nq`/`nk` serves the backward kernels unchanged."""
        return dataclasses.replace(
            self, block_q=self.bwd_block_q, block_k=self.bwd_block_k,
            num_warps=self.bwd_num_warps, num_stages=self.bwd_num_stages)


def grad_dtypes(cfg: FlashConfig, dtype: jnp.dtype) -> tuple[jnp.dtype, jnp.dtype]:
    """(dQ, per-q-head dK/dV) dtypes the GPU backward kernels store: the inputs' dtype, except
    dK/dV under GQA/MQA, which stay f32 for the sum over each kv head's group. The accumulators
    are f32 either way; casting in the kernel rounds as XLA's convert would, and spares a
    separate f32 -> bf16 pass (60 converts, 5.8 ms of the H100's T5-base step)."""
    return dtype, dtype if cfg.group == 1 else jnp.float32


def visited_tiles(cfg: FlashConfig) -> int:
    """(q block, k block) tiles per (batch, head) a kernel computes: all of them, or under a causal
    mask those on or below the diagonal (prefix / segment skipping is data-dependent)."""
    if not cfg.causal:
        return cfg.nq * cfg.nk
    return sum(min(cfg.nk, (i * cfg.block_q + cfg.block_q - 1) // cfg.block_k + 1)
               for i in range(cfg.nq))


def dot(a: jax.Array, b: jax.Array, *, ta: bool = False, tb: bool = False) -> jax.Array:
    """2-D matmul with optional transposes, fp32 accumulation: op(a) @ op(b)."""
    dims = (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def side_names(cfg: FlashConfig) -> list[str]:
    """Names of the optional side inputs a kernel receives, in call order."""
    groups = ((cfg.has_seg, ("qseg", "kseg")), (cfg.has_prefix, ("pq", "pk", "plen")),
              (cfg.has_rel, ("tab",)), (cfg.has_bias, ("bias",)))
    return [name for present, names in groups if present for name in names]


def rel_bucket_tile(cfg: FlashConfig, q_idx: jax.Array, k_idx: jax.Array) -> jax.Array:
    """Bucket ids [bq, bk] of relative position k - q for index vectors q_idx [bq], k_idx [bk]."""
    return relative_position_bucket(
        k_idx[None, :] - q_idx[:, None], bidirectional=cfg.rel_bidirectional,
        num_buckets=cfg.num_buckets, max_distance=cfg.rel_max_distance)


def bucket_range(bucket: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(min, max) bucket id present in a tile [bq, bk]: the per-bucket loops visit only that range
    (once for tiles farther than `max_distance` from the diagonal, which hold one bucket). One
    whole-tile reduction: reducing a row-reduced [bq] vector again lowers to a sublane gather in
    Mosaic, which TPU v4 does not have."""
    return jnp.min(bucket), jnp.max(bucket)


def bucket_order(cfg: FlashConfig) -> tuple[int, ...]:
    """The bucket ids in the order they occur along the offset axis r = k - q, from -inf to
    +inf: each id covers one contiguous run of offsets (a bucket is monotone in |r| on each
    side), possibly empty (bidirectional: id num_buckets // 2, as r > 0 starts at bucket
    half + 1). The first and last are the outermost buckets, beyond max_distance: the GPU dQ
    kernels add whole tiles there (`gpu_inputs.near_window`)."""
    if not cfg.rel_bidirectional:
        return tuple(range(cfg.num_buckets - 1, -1, -1))
    half = cfg.num_buckets // 2
    return tuple(range(half - 1, -1, -1)) + tuple(range(half, cfg.num_buckets))


def tile_offset_range(rows: int, cols: int, q0, k0) -> tuple:
    """(rmin, rmax): the least and greatest offset r = k - q of tile [q0, q0 + rows) x
    [k0, k0 + cols) (scalars: corner arithmetic, no reduction over the tile)."""
    return k0 - q0 - (rows - 1), k0 + (cols - 1) - q0


def rel_bias_tile(cfg: FlashConfig, bucket: jax.Array, table_row: jax.Array) -> jax.Array:
    """Bias [bq, bk] = table_row[bucket], as a select per bucket present (no in-kernel gather)."""
    lo, hi = bucket_range(bucket)
    ids = jnp.arange(cfg.num_buckets_pad, dtype=jnp.int32)

    def body(n, acc):
        value = jnp.sum(jnp.where(ids == n, table_row, 0.0), axis=0)
        return acc + jnp.where(bucket == n, value, 0.0)

    return jax.lax.fori_loop(lo, hi + 1, body, jnp.zeros(bucket.shape, jnp.float32))


def tile_mask(
    cfg: FlashConfig, q_idx: jax.Array, k_idx: jax.Array, qseg: jax.Array | None,
    kseg: jax.Array | None, pq: jax.Array | None, pk: jax.Array | None,
) -> jax.Array | None:
    """Allowed [bq, bk] (or None = all allowed): `masks.attention_mask` on the tile's vectors
    (segment ids / prefix flags None when absent), and k < lk when segment ids do not carry the
    padding."""
    mask = attention_mask(q_idx, k_idx, causal=cfg.causal, q_segment_ids=qseg, kv_segment_ids=kseg,
                          q_prefix=pq, k_prefix=pk)
    if cfg.kv_pad_mask:
        in_range = jnp.broadcast_to(k_idx[None, :] < cfg.lk, (q_idx.shape[0], k_idx.shape[0]))
        mask = in_range if mask is None else jnp.logical_and(mask, in_range)
    return mask


def logits_tile(
    cfg: FlashConfig, s: jax.Array, q_idx: jax.Array, k_idx: jax.Array, qseg: jax.Array | None,
    kseg: jax.Array | None, pq: jax.Array | None, pk: jax.Array | None,
    table_row: jax.Array | None, bias: jax.Array | None, rel_tile: jax.Array | None = None,
    unit: float = 1.0, one_segment: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """Scaled scores s [bq, bk] + biases, masked to -inf, times `unit` (log2 e: logits in base 2,
    for `exp2`; folded into the scale and one multiply-add per bias). Returns (logits, bucket
    ids or None).

    `rel_tile` [bq, bk]: the T5 bias of the tile divided by sm_scale (in the scores' units),
    when the caller has it (the Triton kernels load it from a band): added before the scale,
    right after the product, so Triton folds it into the MMA as its accumulator's start (one
    add an element fewer). Otherwise the bias is computed here from `table_row` and the bucket
    ids are returned.

    `one_segment` (traced bool): the tile's queries and keys all hold one segment id
    (`gpu_inputs.single_segment_blocks`), so the segment test is skipped on it (a branch, not
    two compares and a select a score).
    """
    scale = cfg.sm_scale * unit
    if cfg.has_rel and rel_tile is not None:
        s = s + rel_tile
    s = s * scale if scale != 1.0 else s
    with_unit = lambda x: x * unit if unit != 1.0 else x  # noqa: E731
    bucket = None
    if cfg.has_rel and rel_tile is None:
        bucket = rel_bucket_tile(cfg, q_idx, k_idx)
        s = s + with_unit(rel_bias_tile(cfg, bucket, table_row))
    if cfg.has_bias:
        s = s + with_unit(bias.astype(jnp.float32))

    def masked(s: jax.Array, segments: bool) -> jax.Array:
        mask = tile_mask(cfg, q_idx, k_idx, qseg if segments else None,
                         kseg if segments else None, pq, pk)
        return s if mask is None else jnp.where(mask, s, NEG_INF)

    if cfg.has_seg and one_segment is not None:
        s = jax.lax.cond(one_segment, lambda s: masked(s, False), lambda s: masked(s, True), s)
    else:
        s = masked(s, True)
    return s, bucket


def segments_overlap(qrange: tuple, krange: tuple) -> jax.Array:
    """True when a q block and a k block can share a nonzero segment (ids sorted or not,
    overlapping [min, max] ranges is necessary for any equal pair)."""
    return jnp.maximum(qrange[0], krange[0]) <= jnp.minimum(qrange[1], krange[1])


def causal_k_blocks(cfg: FlashConfig, q0: jax.Array, prefix_len: jax.Array | None) -> jax.Array:
    """Number of k blocks a causal q block starting at q0 visits (later ones are skipped)."""
    hi = (q0 + cfg.block_q - 1) // cfg.block_k + 1
    if cfg.has_prefix:
        prefix_blocks = (prefix_len + cfg.block_k - 1) // cfg.block_k
        hi = jnp.where(q0 < prefix_len, jnp.maximum(hi, prefix_blocks), hi)
    return jnp.minimum(hi, cfg.nk)


def causal_first_q_block(cfg: FlashConfig, k0: jax.Array,
                         prefix_len: jax.Array | None) -> jax.Array:
    """First q block that can see a causal k block starting at k0 (earlier ones are skipped)."""
    lo = k0 // cfg.block_q
    if cfg.has_prefix:
        lo = jnp.where(k0 < prefix_len, 0, lo)
    return lo
