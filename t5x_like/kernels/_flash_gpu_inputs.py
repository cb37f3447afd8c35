"""Inputs the GPU backends (Triton, Mosaic GPU) derive outside their kernels, in XLA: the T5
bias band (a tile's bias becomes a block load; with keys as rows for the Hopper dK/dV kernel),
the bucket runs' first offsets and the table gradient from the dQ kernels' per-run sums,
per-block segment ranges (loop bounds that skip blocks sharing no segment), the
Hopper kernels' side arguments and the backward's Δ."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from t5x_like.kernels import _flash_common as common
from t5x_like.kernels._flash_common import FlashConfig


def offset_row_width(cfg: FlashConfig) -> int:
    """Columns of the T5 bias bands: lq_pad + lk_pad, rounded up to a power of two."""
    return 1 << (cfg.lq_pad + cfg.lk_pad - 1).bit_length()


def rel_band(cfg: FlashConfig, table: jax.Array, unit: float = 1.0) -> jax.Array:
    """The T5 bias "band" from the padded table `[H, num_buckets_pad]`, times `unit` (log2 e for
    kernels whose logits are in base 2).

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
    return jnp.take(table.astype(jnp.float32) * unit, bucket.reshape(cfg.block_q, width), axis=1)


def bucket_run_starts(cfg: FlashConfig) -> jax.Array:
    """First offset r = k - q of each run of `common.bucket_order(cfg)`, `[num_buckets_pad]`
    int32: entry 0 (the run from -inf) and the padding hold -2^30 / +2^30. Computed by the same
    function as the bands, on the device, so the gradient's runs match the forward's biases
    wherever float rounding puts a log-bucket boundary."""
    order = common.bucket_order(cfg)
    reach = cfg.rel_max_distance + 1  # beyond it each side's bucket is constant
    rel = jnp.arange(-reach, reach + 1, dtype=jnp.int32)
    bucket = common.rel_bucket_tile(cfg, jnp.zeros((1,), jnp.int32), rel)[0]
    position = jnp.zeros((cfg.num_buckets,), jnp.int32).at[jnp.array(order)].set(
        jnp.arange(len(order), dtype=jnp.int32))[bucket]  # nondecreasing in r
    starts = -reach + jnp.sum(position[None, :] < jnp.arange(1, len(order))[:, None], axis=1)
    big = jnp.full((1,), 2**30, jnp.int32)
    return jnp.concatenate([-big, starts.astype(jnp.int32),
                            jnp.broadcast_to(big, (cfg.num_buckets_pad - len(order),))])


def bucket_sums(cfg: FlashConfig, cum: jax.Array) -> jax.Array:
    """Per bucket `[..., num_buckets_pad]` from the dQ kernels' per-run sums C(t_i) (dS summed
    over offsets >= run i's first): run i's own sums C(t_i) - C(t_i+1), at its bucket's index."""
    order = common.bucket_order(cfg)
    runs = cum[..., :len(order)] - jnp.concatenate(
        [cum[..., 1:len(order)], jnp.zeros_like(cum[..., :1])], axis=-1)
    return jnp.zeros_like(cum).at[..., jnp.array(order)].set(runs)


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


def rel_band_keys_as_rows(cfg: FlashConfig, table: jax.Array, rows: int) -> jax.Array:
    """The T5 bias band with keys as rows, `[H, rows, W]` f32: band[h, i, x] =
    table[h, bucket(i + lk_pad - x)], so the bias of keys k0 + i and queries q0 + j is the
    block band[h, :, c:c + n] with c = q0 - k0 + lk_pad (offset k - q = k0 + i - q0 - j)."""
    width = offset_row_width(cfg)
    x = jnp.arange(width, dtype=jnp.int32)[None, :]
    rel = jnp.arange(rows, dtype=jnp.int32)[:, None] + cfg.lk_pad - x
    bucket = common.rel_bucket_tile(cfg, jnp.zeros((1,), jnp.int32), rel.reshape(-1))
    return jnp.take(table.astype(jnp.float32), bucket.reshape(rows, width), axis=1)


def side_args(cfg: FlashConfig, side: dict, bounds: tuple[str, str]) -> dict:
    """A Hopper kernel's side inputs: segment ids with the per-block loop bounds it takes
    (("klo", "khi") for the q-block kernels, ("qlo", "qhi") for dK/dV), prefix flags and prefix
    lengths."""
    args = {}
    if cfg.has_seg:
        ranges = segment_block_ranges(cfg, side["qseg"], side["kseg"])
        args.update(qseg=side["qseg"], kseg=side["kseg"], **{n: ranges[n] for n in bounds})
    if cfg.has_prefix:
        args.update(pq=side["pq"], pk=side["pk"], plen=side["plen"])
    return args
