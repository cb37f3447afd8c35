"""Inputs the GPU backends (Triton, Mosaic GPU) derive outside their kernels, in XLA: the T5
bias band (a tile's bias becomes a block load; with keys as rows for the Hopper dK/dV kernel),
the table gradient from the dQ kernels' stored near-diagonal dS tiles and far tiles' sums,
per-block segment ranges (loop bounds that skip blocks sharing no segment), the Hopper kernels'
side arguments and the backward's Δ."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from t5x_like.kernels import _flash_common as common
from t5x_like.kernels._flash_common import FlashConfig
from t5x_like.kernels.relpos import saturation_distance


def offset_row_width(cfg: FlashConfig) -> int:
    """Columns of the T5 bias bands: lq_pad + lk_pad, rounded up to a power of two."""
    return 1 << (cfg.lq_pad + cfg.lk_pad - 1).bit_length()


def rel_band(cfg: FlashConfig, table: jax.Array, unit: float = 1.0,
             dtype=jnp.float32) -> jax.Array:
    """The T5 bias "band" from the padded table `[H, num_buckets_pad]`, times `unit` (1 /
    sm_scale for the Triton kernels, which add it to the scores before scaling), in `dtype`
    (the Hopper kernels stream it in q's: half the bytes).

    Row i of a tile starting at (q0, k0) needs the biases of offsets k - q = k0 - q0 + j - i,
    a contiguous run shifted by i. The band stores those shifted runs: with column
    x = k - q + lq_pad + i, relband[h, i, x] = table[h, bucket(x - i - lq_pad)] f32
    `[H, block_q, W]`, so a tile's bias is the plain, 16-aligned block load
    relband[h, :, c:c + block_k], c = k0 - q0 + lq_pad. The k loop then has no bucket math, no
    loop over buckets and no gather: Triton software-pipelines it (cp.async / TMA), Mosaic GPU
    loads it by TMA. Cost: H * block_q * W * 4 bytes, O(length).
    """
    width = offset_row_width(cfg)
    x = jnp.arange(width, dtype=jnp.int32)[None, :]
    rel = x - jnp.arange(cfg.block_q, dtype=jnp.int32)[:, None] - cfg.lq_pad
    bucket = common.rel_bucket_tile(cfg, jnp.zeros((1,), jnp.int32), rel.reshape(-1))
    band = jnp.take(table.astype(jnp.float32) * unit, bucket.reshape(cfg.block_q, width), axis=1)
    return band.astype(dtype)


def rel_far(cfg: FlashConfig, table: jax.Array, dtype=jnp.float32) -> jax.Array:
    """`[H, 2]` f32: each head's bias left and right of the diagonal beyond `window_reach` (the
    outermost buckets, `common.bucket_order`'s first and last), rounded through `dtype` as the
    band is: the Hopper kernels add it to tiles wholly out there instead of streaming their
    band tiles."""
    order = common.bucket_order(cfg)
    far = table.astype(jnp.float32)[:, jnp.array([order[0], order[-1]])]
    return far.astype(dtype).astype(jnp.float32)


def window_reach(cfg: FlashConfig) -> int:
    """Bucket boundaries lie at offsets k - q in [-reach, reach]: farther out each side of the
    diagonal has one bucket (its outermost). That starts where the buckets saturate
    (`relpos.saturation_distance`: from 91 for T5's 32 buckets up to 128, bidirectional), plus
    one offset for float32's rounding of the bucket function, never beyond max_distance + 1."""
    sat = saturation_distance(bidirectional=cfg.rel_bidirectional,
                              num_buckets=cfg.num_buckets, max_distance=cfg.rel_max_distance)
    return min(sat + 1, cfg.rel_max_distance + 1)


def _window_bounds(cfg: FlashConfig, q0: int) -> tuple[int, int]:
    """The k blocks [first, last + 1) of q block q0 whose tiles a bucket boundary can cross:
    rmin <= reach and rmax >= -reach (`common.tile_offset_range`)."""
    reach, bk = window_reach(cfg), cfg.block_k
    first = max(q0 - reach, 0) // bk
    last = min((q0 + cfg.block_q - 1 + reach) // bk, cfg.nk - 1)
    return first, max(last + 1, first)


def near_window(cfg: FlashConfig) -> int:
    """k blocks per q block whose dS tiles the dQ kernels store for the T5 table gradient: the
    widest run of tiles, over the q blocks, that a bucket boundary can cross. About
    (2 reach + block_q) / block_k + 1, at most nk: the memory is O(length)."""
    return max(b - a for a, b in (_window_bounds(cfg, i * cfg.block_q) for i in range(cfg.nq)))


def near_first_block(cfg: FlashConfig, q0):
    """First k block of q block q0's window (traced in the kernels, int in XLA): its own first
    block, moved back so that the `near_window` blocks end by nk."""
    first = jnp.maximum(q0 - window_reach(cfg), 0) // cfg.block_k
    return jnp.minimum(first, cfg.nk - near_window(cfg))


def near_window_bucket_sums(cfg: FlashConfig, band: jax.Array) -> jax.Array:
    """T5 table gradient `[H, num_buckets_pad]` f32 of the stored window tiles.

    `band` [B, H, nq, block_q, W] holds, per q block, dS of its `near_window` k blocks side by
    side (W = near_window * block_k columns from k block `near_first_block`). Summed over the
    batch first (f32), then by offset: rows reversed and row i' shifted right by i' (pad,
    reshape, slice: no gather), so column y of q block i holds offset
    r = first_i * block_k - i * block_q - (block_q - 1) + y; then one product with the offsets'
    one-hot buckets (full f32 precision: no TF32), computed by the same function as the
    forward's band."""
    heads, nq, bq, width = band.shape[1:]
    s = jnp.sum(band.astype(jnp.float32), axis=0)[:, :, ::-1, :]
    s = jnp.pad(s, ((0, 0), (0, 0), (0, 0), (0, bq))).reshape(heads, nq, bq * (width + bq))
    diag = s[..., : bq * (width + bq - 1)].reshape(heads, nq, bq, width + bq - 1).sum(axis=2)
    i = jnp.arange(nq, dtype=jnp.int32)
    base = near_first_block(cfg, i * bq) * cfg.block_k - i * bq - (bq - 1)
    rel = base[:, None] + jnp.arange(width + bq - 1, dtype=jnp.int32)[None, :]
    bucket = common.rel_bucket_tile(cfg, jnp.zeros((1,), jnp.int32), rel.reshape(-1))[0]
    one_hot = jax.nn.one_hot(bucket, cfg.num_buckets_pad, dtype=jnp.float32)
    return jnp.matmul(diag.reshape(heads, -1), one_hot, precision=jax.lax.Precision.HIGHEST)


def window_table_gradient(cfg: FlashConfig, band: jax.Array, far: jax.Array) -> jax.Array:
    """The Triton dQ kernel's T5 table gradient `[H, num_buckets_pad]` f32: its stored window
    tiles (`near_window_bucket_sums`) plus `far` [B, H, nq, 2, block_q], the row sums of the
    tiles outside the windows, each wholly in its side's outermost bucket (0: left, offsets
    below -reach; 1: right; `common.bucket_order`'s first and last). The Hopper dQ
    kernel's `far` is [B, H, 2 nq, 2, 64] (a row per warpgroup): the same sum."""
    order = common.bucket_order(cfg)
    side = jnp.sum(far, axis=(0, 2, 4))  # [H, 2]
    return near_window_bucket_sums(cfg, band).at[:, order[0]].add(side[:, 0]).at[
        :, order[-1]].add(side[:, 1])


def _block_segment_range(seg: jax.Array, block: int) -> tuple[jax.Array, jax.Array]:
    """(min nonzero, max) segment id per block of `seg` [B, L] -> two [B, L // block]."""
    blocks = seg.reshape(seg.shape[0], -1, block)
    big = jnp.iinfo(jnp.int32).max
    return jnp.min(jnp.where(blocks == 0, big, blocks), axis=2), jnp.max(blocks, axis=2)


def _first_last(overlap: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[..., n] bool -> (first True index, last True index + 1), (0, 0) where none."""
    n = overlap.shape[-1]
    some = jnp.any(overlap, axis=-1)
    first = jnp.argmax(overlap, axis=-1)
    last = n - jnp.argmax(overlap[..., ::-1], axis=-1)
    return (jnp.where(some, first, 0).astype(jnp.int32),
            jnp.where(some, last, 0).astype(jnp.int32))


def segment_block_ranges(cfg: FlashConfig, qseg: jax.Array, kseg: jax.Array) -> dict:
    """Loop bounds from segment ids: per q block the k blocks [klo, khi) and per k block the q
    blocks [qlo, qhi) whose nonzero segment ranges overlap, each `[B, n_blocks]` int32.

    Blocks outside the bounds are fully masked, so the kernels skip them by loop bounds instead
    of a `cond` around the loads (which would stop Triton's software pipelining, and would leave
    the Mosaic GPU kernels' producer and consumers disagreeing on the steps). With packed
    (sorted) ids the bounds are exact; with unsorted ids they are a superset, still correct.
    """
    qmin, qmax = _block_segment_range(qseg, cfg.block_q)
    kmin, kmax = _block_segment_range(kseg, cfg.block_k)
    overlap = (jnp.maximum(qmin[:, :, None], kmin[:, None, :])
               <= jnp.minimum(qmax[:, :, None], kmax[:, None, :]))  # [B, nq, nk]
    klo, khi = _first_last(overlap)
    qlo, qhi = _first_last(jnp.swapaxes(overlap, 1, 2))
    return {"klo": klo, "khi": khi, "qlo": qlo, "qhi": qhi}


def delta_of(o: jax.Array, do: jax.Array) -> jax.Array:
    """Δ [B, H, Lq] = rowsum(o · dO) in f32, the softmax backward's per-row term."""
    return jnp.einsum("blhd,blhd->bhl", o.astype(jnp.float32), do.astype(jnp.float32))


def rel_band_keys_as_rows(cfg: FlashConfig, table: jax.Array, rows: int,
                          dtype=jnp.float32) -> jax.Array:
    """The T5 bias band with keys as rows, `[H, rows, W]` in `dtype`: band[h, i, x] =
    table[h, bucket(i + lk_pad - x)], so the bias of keys k0 + i and queries q0 + j is the
    block band[h, :, c:c + n] with c = q0 - k0 + lk_pad (offset k - q = k0 + i - q0 - j)."""
    width = offset_row_width(cfg)
    x = jnp.arange(width, dtype=jnp.int32)[None, :]
    rel = jnp.arange(rows, dtype=jnp.int32)[:, None] + cfg.lk_pad - x
    bucket = common.rel_bucket_tile(cfg, jnp.zeros((1,), jnp.int32), rel.reshape(-1))
    return jnp.take(table.astype(jnp.float32), bucket.reshape(rows, width), axis=1).astype(dtype)


def single_segment_blocks(seg: jax.Array, block: int, none: int) -> jax.Array:
    """`[B, L // block]` int32: the segment id every position of a block of `seg` [B, L]
    shares, or `none` (negative) where they differ or one is padding (id 0). A tile whose
    query block and key block hold the same id needs no segment mask."""
    blocks = seg.reshape(seg.shape[0], -1, block)
    lo, hi = jnp.min(blocks, axis=2), jnp.max(blocks, axis=2)
    return jnp.where((lo == hi) & (lo != 0), lo, none).astype(jnp.int32)


def side_args(cfg: FlashConfig, side: dict, bounds: tuple[str, str],
              blocks: tuple[int, int] | None = None) -> dict:
    """A Hopper kernel's side inputs: segment ids with the per-block loop bounds it takes
    (("klo", "khi") for the q-block kernels, ("qlo", "qhi") for dK/dV) and, with `blocks` =
    (query block, key block) of its tiles, each block's single segment id ("qone", "kone",
    `single_segment_blocks`: -1 / -2 where none, so those never match); prefix flags and prefix
    lengths."""
    args = {}
    if cfg.has_seg:
        ranges = segment_block_ranges(cfg, side["qseg"], side["kseg"])
        args.update(qseg=side["qseg"], kseg=side["kseg"], **{n: ranges[n] for n in bounds})
        if blocks is not None:
            args.update(qone=single_segment_blocks(side["qseg"], blocks[0], -1),
                        kone=single_segment_blocks(side["kseg"], blocks[1], -2))
    if cfg.has_prefix:
        args.update(pq=side["pq"], pk=side["pk"], plen=side["plen"])
    return args
