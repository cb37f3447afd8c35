"""One tile's work in the Hopper flash kernels (`_flash_mosaic_gpu`), shared by the forward, dK/dV
and dQ: the loop bounds a causal / prefix / segment mask allows, which steps cross the causal
diagonal, the mask itself, the T5 bias of a tile (its band tile, or one number beyond where
the buckets saturate), and the query rows' logits."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from t5x_like.kernels import _flash_common as common
from t5x_like.kernels import _flash_gpu_inputs as gpu_inputs
from t5x_like.kernels._flash_common import NEG_INF, FlashConfig
from t5x_like.kernels._mosaic_gpu_pipeline import ROWS, Ops

LOG2E = math.log2(math.e)


def causal_end(cfg: FlashConfig, r: dict, b, q0, rows: int) -> jax.Array:
    """One past the last k block that query rows [q0, q0 + rows) can see under a causal mask:
    the diagonal's block, or the prefix's last when the rows start inside the prefix."""
    hi = (q0 + rows - 1) // cfg.block_k + 1
    if cfg.has_prefix:
        plen = r["plen"][b]
        hi = jnp.where(q0 < plen, jnp.maximum(hi, (plen + cfg.block_k - 1) // cfg.block_k), hi)
    return jnp.minimum(hi, cfg.nk)


def causal_start(cfg: FlashConfig, r: dict, b, k0) -> jax.Array:
    """First q block whose rows can see key k0 under a causal mask (0 inside the prefix)."""
    lo = k0 // cfg.block_q
    if cfg.has_prefix:
        lo = jnp.where(k0 < r["plen"][b], 0, lo)
    return lo


def k_range(cfg: FlashConfig, r: dict, b, i) -> tuple[jax.Array, jax.Array]:
    """[lo, hi) k blocks the CTA of q block i streams: up to the diagonal (or the prefix's end)
    when causal, within the blocks sharing a segment with it (`gpu_inputs.segment_block_ranges`)."""
    lo, hi = jnp.int32(0), jnp.int32(cfg.nk)
    if cfg.causal:
        hi = causal_end(cfg, r, b, i * cfg.block_q, cfg.block_q)
    if cfg.has_seg:
        lo, hi = r["klo"][b, i], jnp.minimum(hi, r["khi"][b, i])
    return lo, jnp.maximum(hi, lo)


def q_range(cfg: FlashConfig, r: dict, b, j) -> tuple[jax.Array, jax.Array]:
    """[lo, hi) q blocks the dK/dV CTA of k block j streams: from the first whose rows see its
    keys when causal (0 when its keys start inside a prefix), within the blocks sharing a
    segment with it."""
    lo, hi = jnp.int32(0), jnp.int32(cfg.nq)
    if cfg.causal:
        lo = causal_start(cfg, r, b, j * cfg.block_k)
    if cfg.has_seg:
        lo, hi = jnp.maximum(lo, r["qlo"][b, j]), r["qhi"][b, j]
    return lo, jnp.maximum(hi, lo)


def causal_split(cfg: FlashConfig, body, lo, hi, split, carry, diagonal_first: bool = False):
    """`fori_loop` over [lo, hi) of `body(diagonal)`: under a causal mask only the steps whose
    tiles the diagonal crosses, [split, hi) (or [lo, split) with `diagonal_first`: dK/dV, keys
    as rows), apply the causal test; the others lie wholly below it and skip the test's iota,
    compare and select (FA3's split)."""
    if not cfg.causal:
        return lax.fori_loop(lo, hi, body(False), carry)
    split = jnp.clip(split, lo, hi)
    carry = lax.fori_loop(lo, split, body(diagonal_first), carry)
    return lax.fori_loop(split, hi, body(not diagonal_first), carry)


def row_segment(cfg: FlashConfig, r: dict, b, name: str, n):
    """The single segment id of the warpgroup's rows, block n of `r[name]`
    (`gpu_inputs.single_segment_blocks`), read once before the loop; None without ids."""
    return r[name][b, n] if cfg.has_seg else None


def same_segment(r: dict, b, own, name: str, n):
    """Whether the rows' single id `own` (`row_segment`) is also every id of the step's column
    block n of `r[name]`: then the tile needs no segment test. None when `own` is."""
    return None if own is None else own == r[name][b, n]


def masked(cfg: FlashConfig, ops: Ops, smem: dict, slot, x: jax.Array, q0, k0, own_seg,
            own_prefix, keys_as_rows: bool = False, diagonal: bool = True,
            one_segment=None) -> jax.Array:
    """`x` [64, n] with the disallowed (query, key) pairs at -inf. Rows are the warpgroup's own
    queries from q0 (their segment / prefix row vectors given), columns the slot's keys from
    k0 (their vectors streamed); with `keys_as_rows`, dK/dV's transposed frame: rows are keys
    from k0, columns the slot's queries from q0. `diagonal=False`: the tile lies wholly below
    the causal diagonal (every key at or before every query), so the causal test is skipped.
    `one_segment` (traced bool, `same_segment`): where it holds (the tile lies inside one
    packed example), the segment test is skipped: two compares and a select a score fewer."""

    def mask(segments: bool):
        return lambda x: _masked(cfg, ops, smem, slot, x, q0, k0, own_seg, own_prefix,
                                 keys_as_rows, diagonal, segments)

    if cfg.has_seg and one_segment is not None:
        return lax.cond(one_segment, mask(False), mask(True), x)
    return mask(cfg.has_seg)(x)


def _masked(cfg: FlashConfig, ops: Ops, smem: dict, slot, x: jax.Array, q0, k0, own_seg,
            own_prefix, keys_as_rows: bool, diagonal: bool, segments: bool) -> jax.Array:
    shape = x.shape
    rows_of = lambda v: lax.broadcast_in_dim(v, shape, [0])  # noqa: E731
    cols = lambda name: lax.broadcast_in_dim(  # noqa: E731
        ops.load(smem[name].at[slot], plgpu.Layout.WGMMA.reduce(0)), shape, [1])
    seg_name, prefix_name = ("qseg", "pq") if keys_as_rows else ("kseg", "pk")
    q_dim, k_dim = (1, 0) if keys_as_rows else (0, 1)
    allowed = None
    if segments:  # equal ids, not padding (equal ids: one side's check is enough)
        seg = cols(seg_name)
        allowed = (rows_of(own_seg) == seg) & (seg != 0)
    causal = cfg.causal and diagonal
    if causal or cfg.kv_pad_mask:
        k_idx = ops.iota(shape, k_dim) + k0
    if causal:
        visible = k_idx <= ops.iota(shape, q_dim) + q0
        if cfg.has_prefix:
            visible = visible | ((rows_of(own_prefix) != 0) & (cols(prefix_name) != 0))
        allowed = visible if allowed is None else allowed & visible
    if cfg.kv_pad_mask:
        allowed = (k_idx < cfg.lk) if allowed is None else allowed & (k_idx < cfg.lk)
    return x if allowed is None else jnp.where(allowed, x, NEG_INF)


def far_tile_sums(cfg: FlashConfig, far: tuple, ds: jax.Array, q0, k0) -> tuple:
    """far = (left, right) [64] row sums of dS += the tile's, on its side of the diagonal (the
    dQ kernel's table gradient): a tile outside its q block's window (`gpu_inputs.near_window`)
    lies beyond the window's reach on one side, wholly in that side's outermost bucket
    (`common.bucket_order`'s first or last). Two row vectors (4 registers a thread) instead of
    a [64, buckets] accumulator (16)."""
    rmin, _ = common.tile_offset_range(ROWS, cfg.block_k, q0, k0)
    rows = ds.sum(axis=1)
    return lax.cond(rmin > 0, lambda f: (f[0], f[1] + rows),
                    lambda f: (f[0] + rows, f[1]), far)


def bias_varies(cfg: FlashConfig, rows: int, cols: int, q0, k0) -> tuple:
    """(whether tile [q0, q0 + rows) x [k0, k0 + cols) may hold more than one T5 bucket, whether
    it lies right of the diagonal): beyond `gpu_inputs.window_reach` (where the buckets
    saturate) on one side every offset k - q is in that side's outermost bucket
    (`gpu_inputs.rel_far`), so such a tile's bias is one number and its band tile is not
    streamed. Corner arithmetic on the CTA's tile, so the producer and both compute warpgroups
    agree."""
    rmin, rmax = common.tile_offset_range(rows, cols, q0, k0)
    reach = gpu_inputs.window_reach(cfg)
    return (rmin <= reach) & (rmax >= -reach), rmin > reach


def bias_over_scale(cfg: FlashConfig, ops: Ops, r: dict, smem: dict, bars: dict, h, slot,
                    rows, cols: int, varies, right) -> jax.Array:
    """The tile's T5 bias / scale [64, cols] f32, the scores' accumulator to start from
    (`Ops.scores`' init: times `logit_scale` it is bias · log2 e, so the bias costs its
    conversion only, not an add a score): the streamed band tile (`rows` of it) where buckets
    vary, after waiting for it; else head h's outermost bucket on the `right` (or left) of the
    diagonal, a scalar read per such tile (holding both across the loop spilled the head_dim
    128 dK/dV kernel)."""
    unit = 1.0 / cfg.sm_scale

    def band():
        plgpu.barrier_wait(bars["rel"].at[slot])
        tile = ops.load(smem["rel"].at[slot, rows], plgpu.Layout.WGMMA).astype(jnp.float32)
        return tile if unit == 1.0 else tile * unit

    def far():
        value = r["relfar"][h, right.astype(jnp.int32)] * unit
        return ops.layout(jnp.full((ROWS, cols), value, jnp.float32), plgpu.Layout.WGMMA)

    return band() if varies is None else lax.cond(varies, band, far)


def rel_smem(stages: int, rows: int, cols: int, dtype) -> plgpu.SMEM:
    """The band tiles' ring `[stages, rows, cols]` in `dtype`, swizzled for WGMMA-layout loads."""
    minor = min(cols, 128 // jnp.dtype(dtype).itemsize)
    return plgpu.SMEM((stages, rows, cols), dtype, transforms=(
        plgpu.TilingTransform((8, minor)),
        plgpu.SwizzleTransform(minor * jnp.dtype(dtype).itemsize)))


def query_row_vectors(cfg: FlashConfig, ops: Ops, smem: dict, wg) -> tuple:
    """The warpgroup's query segment ids and prefix flags as [64] row vectors (None if absent),
    broadcast to the tile inside the loop: a [64, block_k] int tile held across the loop would
    cost 32 registers a thread."""
    layout = plgpu.Layout.WGMMA.reduce(1)
    return (ops.load(smem["qseg"].at[wg], layout) if cfg.has_seg else None,
            ops.load(smem["pq"].at[wg], layout) if cfg.has_prefix else None)


def logit_scale(cfg: FlashConfig) -> float:
    """What turns q kᵀ into base-2 logits: scale · log2 e."""
    return cfg.sm_scale * LOG2E


def unscaled_logits(cfg: FlashConfig) -> bool:
    """Whether the kernels can leave the scores as wgmma returns them, q kᵀ (+ the T5 bias over
    the scale, the accumulator's start), and scale inside the exponent's FFMA, 2^(s · c - m)
    (m: the forward's scaled row max, the backward's lse · log2 e), so a tile's FMUL a score
    goes: with a positive scale (max(s) · c = max(s · c), rounding included, and a masked -inf
    stays -inf, for c > 0)."""
    return cfg.sm_scale > 0


def query_row_logits(cfg: FlashConfig, ops: Ops, r: dict, smem: dict, bars: dict, slot, wg,
                      q_smem, h, i, k0, qseg, pq, diagonal: bool = True,
                      after_issue=None, scaled: bool = True, one_segment=None) -> jax.Array:
    """Logits [64, block_k] f32 in base 2 of the warpgroup's query rows (head h, q block i)
    against the slot's keys (k0...): (q kᵀ + bias / scale) · scale · log2 e, masked to -inf
    (`diagonal`, `one_segment`: as `masked`'s; `after_issue`: as `Ops.scores`';
    `scaled=False`: q kᵀ + bias / scale masked, the scale left to the caller,
    `unscaled_logits`)."""
    init = None
    if cfg.has_rel:
        varies, right = bias_varies(cfg, cfg.block_q, cfg.block_k, i * cfg.block_q, k0)
        init = bias_over_scale(cfg, ops, r, smem, bars, h, slot, pl.ds(wg * ROWS, ROWS),
                               cfg.block_k, varies, right)
    x = ops.scores(q_smem, ops.transposed(smem, "k", slot), cfg.block_k, after_issue, init)
    if scaled:
        x = x * logit_scale(cfg)
    return masked(cfg, ops, smem, slot, x, i * cfg.block_q + wg * ROWS, k0, qseg, pq,
                  diagonal=diagonal, one_segment=one_segment)
