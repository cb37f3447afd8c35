"""Hopper (sm_90a) flash-attention kernels in Pallas on Mosaic GPU: warp-specialised, TMA + wgmma.

Three kernels, forward, dK/dV and dQ, each one CTA of three warpgroups:

- two **compute** warpgroups, each owning 64 rows (one wgmma M): query rows in the forward and
  dQ, key rows in dK/dV;
- one **producer** warpgroup (`_produce`) that streams the other side's tiles with TMA into a
  ring of `num_stages` shared-memory slots. Forward, per k block: K and V `[block_k, D]`, the
  T5 bias tile `[128, block_k]` in q's dtype (a slice of the bias band `gpu_inputs.rel_band`
  builds: no bucket math in the loop; not streamed for a tile wholly beyond where the
  buckets saturate, whose bias is one number, `tiles.bias_over_scale`), the keys' segment ids and
  prefix flags (dQ: the same). dK/dV, per q block: q and dO, lse and Δ, the transposed bias
  band's tile, the queries' ids and flags.

Every stream has a "ready" barrier per slot (its TMA completes it); both compute warpgroups
arrive on the slot's "free" barrier when done with it, and the producer waits on it before it
refills the slot. Both compute warpgroups are handed the CTA's range of blocks (causal, prefix
and segment bounds are per 128-row block); a warpgroup whose own rows cannot see a block
releases it unread, so every barrier phase is waited on by every warpgroup that uses it.
Forward, per k block, in base 2 with the scale folded in:

    s  = q kᵀ + bias / scale (the wgmma's accumulator starts from the bias), masked to -inf
    m' = max(m, c · rowmax s);  p = 2^(c · s - m');  l = l · 2^(m - m') + rowsum p
    acc = acc · 2^(m - m') + p v                                      [64, D] f32

with c = scale · log2 e (the max is taken over the unscaled scores and scaled after, the
scale rides in the exponent's FFMA, `tiles.unscaled_logits`: no FMUL a score; the backward
kernels' 2^(c · s - lse · log2 e) the same), and at the end o = acc / l,
lse = (m + log2 l) · ln 2 (rows with no allowed key: o = 0, lse = 0, as the Triton kernel).
A tile inside one packed example skips the segment test (`tiles.masked`). The two
warpgroups take turns on the tensor cores (`PingPong`): one's softmax runs while the other's
matmuls do. dK/dV works with keys as rows (`_dkdv_consumer`), so every wgmma takes its
register operand untransposed. dQ also yields the T5 table's gradient, as the Triton kernel
does: the near-diagonal dS tiles stored, the others' row sums per side (`tiles.far_tile_sums`),
both reduced by bucket in XLA (`gpu_inputs.window_table_gradient`).

The warp-specialised machinery (producer, barriers, what differs in interpret mode) is
`_mosaic_gpu_pipeline`. **Interpret mode** (the CPU tests) runs these kernels under Pallas' GPU
interpreter, which simulates the warpgroups, shared memory, TMA and barriers (it checks that
every barrier phase is observed; `interpreter_options(detect_races=True)` adds a race
detector) but lacks three things the compiled kernels use. `Ops` swaps each for an equivalent
that moves data differently and computes the same: a transposed operand comes from a
transposed copy in HBM instead of a transposed view of its slot; a register operand of wgmma
goes through shared memory (there operands must be refs); layouts are not cast.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from t5x_like.kernels import _flash_common as common
from t5x_like.kernels import _flash_gpu_inputs as gpu_inputs
from t5x_like.kernels import _mosaic_gpu_tiles as tiles
from t5x_like.kernels._flash_common import NEG_INF, FlashConfig
from t5x_like.kernels._mosaic_gpu_pipeline import (
    COMPUTE_WGS,
    ROWS,
    Ops,
    PingPong,
    barriers,
    call_params,
    load_own,
    release,
    warp_specialized,
)

BLOCK_Q = ROWS * COMPUTE_WGS
HEAD_DIMS = (64, 128)
BLOCK_KS = (64, 128)
LOG2E = tiles.LOG2E
LN2 = math.log(2.0)
SMEM_LIMIT = 232_448  # bytes of shared memory a block may opt into on sm_90
SMEM_SLACK = 8_192  # what Mosaic adds to `smem_bytes`: barriers, alignment (2.6-3.7 KB seen)


def smem_bytes(cfg: FlashConfig) -> int:
    """Shared memory of one forward CTA (`_scratch`'s buffers, barriers aside): q/o tiles, and
    per ring slot the streamed K, V, bias and key-side tiles. (The dK/dV and dQ kernels' blocks
    are fixed: at most 137 KB.)"""
    return _fwd_smem_bytes(cfg.head_dim_pad, cfg.block_k, cfg.num_stages, cfg.has_seg,
                           cfg.has_prefix, cfg.has_rel)


def _fwd_smem_bytes(d: int, bk: int, stages: int, seg: bool, prefix: bool, rel: bool) -> int:
    itemsize = 2
    own = BLOCK_Q * (d * itemsize + 4 + 4 * seg + 4 * prefix)  # q/o, lse, ids
    slot = 2 * bk * d * itemsize + bk * (4 * seg + 4 * prefix)
    slot += BLOCK_Q * bk * itemsize * rel  # the band tile, in q's dtype
    return own + stages * slot


def default_block_k(head_dim_pad: int, stages: int, seg: bool, prefix: bool, rel: bool) -> int:
    """The forward's k tile: 128 where its ring fits shared memory (half the loop steps, and
    wgmma N = 128), else 64 (head_dim 128 with a T5 table)."""
    fits = _fwd_smem_bytes(head_dim_pad, 128, stages, seg, prefix, rel) <= SMEM_LIMIT - SMEM_SLACK
    return 128 if fits else 64


def unsupported(cfg: FlashConfig, dtype) -> str | None:
    """Why this backend cannot run `cfg` (a sentence), or None when it can."""
    if jnp.dtype(dtype) != jnp.bfloat16:
        return f"it takes bfloat16 q/k/v (wgmma), not {jnp.dtype(dtype).name}"
    if cfg.head_dim_pad not in HEAD_DIMS:
        return f"head_dim {cfg.head_dim_pad} (padded) is not one of {HEAD_DIMS}"
    if cfg.block_q != BLOCK_Q:
        return f"block_q must be {BLOCK_Q} (two warpgroups of {ROWS} rows); got {cfg.block_q}"
    if cfg.block_k not in BLOCK_KS:
        return f"block_k must be one of {BLOCK_KS}; got {cfg.block_k}"
    if cfg.has_bias:
        return "a dense bias is not supported (the T5 table is)"
    if smem_bytes(cfg) > SMEM_LIMIT - SMEM_SLACK:
        return (f"its tiles need {smem_bytes(cfg):,} B of shared memory "
                f"(> {SMEM_LIMIT - SMEM_SLACK:,}); use block_k=64")
    return None


def _streams(cfg: FlashConfig, ops: Ops) -> list[str]:
    """The per-k-block tiles the forward's producer streams."""
    return (["v", "kt" if ops.interpret else "k"] + (["rel"] if cfg.has_rel else [])
            + (["kseg"] if cfg.has_seg else []) + (["pk"] if cfg.has_prefix else []))


def _scratch(cfg: FlashConfig, dtype, ops: Ops) -> tuple[dict, dict]:
    """Shared-memory buffers and barriers of one CTA."""
    s, bk, d = cfg.num_stages, cfg.block_k, cfg.head_dim_pad
    tiled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    smem = {
        "q": plgpu.SMEM((COMPUTE_WGS, ROWS, d), dtype, transforms=tiled),  # then o
        "kt" if ops.interpret else "k": plgpu.SMEM(
            (s, d, bk) if ops.interpret else (s, bk, d), dtype, transforms=tiled),
        "v": plgpu.SMEM((s, bk, d), dtype, transforms=tiled),
        "lse": plgpu.SMEM((COMPUTE_WGS, ROWS), jnp.float32),
    }
    if cfg.has_rel:
        smem["rel"] = tiles.rel_smem(s, BLOCK_Q, bk, dtype)
    if cfg.has_seg:
        smem["qseg"] = plgpu.SMEM((COMPUTE_WGS, ROWS), jnp.int32)
        smem["kseg"] = plgpu.SMEM((s, bk), jnp.int32)
    if cfg.has_prefix:
        smem["pq"] = plgpu.SMEM((COMPUTE_WGS, ROWS), jnp.int32)
        smem["pk"] = plgpu.SMEM((s, bk), jnp.int32)
    if ops.interpret:
        smem["a"] = plgpu.SMEM((COMPUTE_WGS, ROWS, bk), dtype)
    own = ["q"] + (["qseg"] if cfg.has_seg else []) + (["pq"] if cfg.has_prefix else [])
    return smem, barriers(own, _streams(cfg, ops), s, schedule=True)


def _fwd_sources(cfg: FlashConfig, r: dict, b, h, i, ops: Ops) -> dict:
    """The forward's streams: k block j's keys, values and side tiles."""
    bk, hk = cfg.block_k, lax.div(h, jnp.int32(cfg.group))
    ks = lambda j: pl.ds(j * bk, bk)  # noqa: E731
    sources = {"v": lambda j: r["v"].at[b, ks(j), hk]}
    if ops.interpret:
        sources["kt"] = lambda j: r["kt"].at[b, hk, :, ks(j)]
    else:
        sources["k"] = lambda j: r["k"].at[b, ks(j), hk]
    if cfg.has_rel:  # the band's columns for offsets k - q of this tile
        sources["rel"] = lambda j: r["relband"].at[
            h, :, pl.ds(j * bk - i * cfg.block_q + cfg.lq_pad, bk)]
    if cfg.has_seg:
        sources["kseg"] = lambda j: r["kseg"].at[b, ks(j)]
    if cfg.has_prefix:
        sources["pk"] = lambda j: r["pk"].at[b, ks(j)]
    return sources


def _fwd_when(cfg: FlashConfig, i) -> dict:
    """Streams of the q-block kernels (forward, dQ) loaded on some steps only: the band tile of
    k block j where the CTA's tile may hold more than one bucket."""
    if not cfg.has_rel:
        return {}
    return {"rel": lambda j: tiles.bias_varies(cfg, cfg.block_q, cfg.block_k, i * cfg.block_q,
                                               j * cfg.block_k)[0]}


def _consumer(cfg: FlashConfig, r: dict, smem: dict, bars: dict, b, h, i, lo, hi, wg, ops: Ops):
    """Online softmax over k blocks [lo, hi) for the warpgroup's 64 query rows."""
    if not ops.interpret:
        plgpu.set_max_registers(232, action="increase")
    bk, d, s = cfg.block_k, cfg.head_dim_pad, cfg.num_stages
    dtype = r["q"].dtype
    q0 = i * cfg.block_q + wg * ROWS
    rows = pl.ds(q0, ROWS)
    own = {"q": r["q"].at[b, rows, h]}
    if cfg.has_seg:
        own["qseg"] = r["qseg"].at[b, rows]
    if cfg.has_prefix:
        own["pq"] = r["pq"].at[b, rows]
    load_own(smem, bars, own, wg)
    row_layout = plgpu.Layout.WGMMA.reduce(1)
    rows_of = lambda x: lax.broadcast_in_dim(x, (ROWS, bk), [0])  # noqa: E731
    qseg, pq = tiles.query_row_vectors(cfg, ops, smem, wg)
    q_smem = smem["q"].at[wg]
    when = _fwd_when(cfg, i)
    turns = PingPong(bars, wg)
    # The max is over the raw scores, q kᵀ + bias / scale; the scale rides in the exp2 FFMA.
    raw = tiles.unscaled_logits(cfg)
    c = tiles.logit_scale(cfg) if raw else 1.0
    own_id = tiles.row_segment(cfg, r, b, "qone", q0 // ROWS)

    def step(diagonal, j, carry):
        m, denom, acc = carry
        slot = lax.rem(j - lo, jnp.int32(s))
        for name in _streams(cfg, ops):
            if name not in ("v", "rel"):  # v before P·V, the band tile in `tiles.bias_over_scale`
                plgpu.barrier_wait(bars[name].at[slot])
        x = tiles.query_row_logits(cfg, ops, r, smem, bars, slot, wg, q_smem, h, i, j * bk,
                                   qseg, pq, diagonal, after_issue=turns.issued, scaled=not raw,
                                   one_segment=None if diagonal and cfg.causal else
                                   tiles.same_segment(r, b, own_id, "kone", j))
        m_new = jnp.maximum(m, x.max(axis=1) * c if raw else x.max(axis=1))
        m_use = jnp.where(m_new == NEG_INF, 0.0, m_new)  # rows with no allowed key yet
        alpha = jnp.exp2(m - m_use)
        p = jnp.exp2((x * c if raw else x) - rows_of(m_use))
        denom = denom * alpha + p.sum(axis=1)
        acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
        p16 = p.astype(dtype)
        turns.softmax_done()
        plgpu.barrier_wait(bars["v"].at[slot])
        turns.pv_turn()
        acc = ops.mma_acc(acc, p16, smem["v"].at[slot],
                          smem["a"].at[wg] if ops.interpret else None)
        plgpu.barrier_arrive(bars["free"].at[slot])
        return m_new, denom, acc

    def drain(j, carry):
        turns.skip()
        release(bars, _streams(cfg, ops), lax.rem(j - lo, jnp.int32(s)),
                {name: pred(j) for name, pred in when.items()})
        return carry

    init = (ops.layout(jnp.full((ROWS,), NEG_INF, jnp.float32), row_layout),
            ops.layout(jnp.zeros((ROWS,), jnp.float32), row_layout),
            ops.layout(jnp.zeros((ROWS, d), jnp.float32), plgpu.Layout.WGMMA))
    # Causal: the first warpgroup's rows end a block earlier than the CTA's (block_k = 64).
    own_hi = jnp.clip(tiles.causal_end(cfg, r, b, q0, ROWS), lo, hi) if cfg.causal else hi
    turns.start()
    # k blocks before (q0 + 1) // block_k end at or before the rows' first query
    m, denom, acc = tiles.causal_split(cfg, lambda diag: functools.partial(step, diag), lo,
                                       own_hi, (q0 + 1) // bk, init)
    lax.fori_loop(own_hi, hi, drain, 0)
    turns.finish()
    empty = denom == 0.0
    denom = jnp.where(empty, 1.0, denom)
    q_smem[...] = (acc * lax.broadcast_in_dim(1.0 / denom, acc.shape, [0])).astype(dtype)
    smem["lse"].at[wg][...] = jnp.where(empty, 0.0, (m + jnp.log2(denom)) * LN2)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(q_smem, r["o"].at[b, rows, h])
    plgpu.copy_smem_to_gmem(smem["lse"].at[wg], r["lse"].at[b, h, rows])
    plgpu.wait_smem_to_gmem(0)


def _launch(cfg: FlashConfig, ops: Ops, args: dict, outs: dict, blocks: str, name: str,
            loop_range, consumer, sources, scratch, when) -> tuple:
    """One warp-specialised kernel over grid (heads, `blocks` = 'q' | 'k' blocks, batch) from
    `args` to `outs` (name: shape), both named in the kernel's refs: each CTA's loop bounds from
    `loop_range(cfg, r, b, n)`, its compute warpgroups running `consumer`, its producer
    streaming `sources` (those in `when(cfg, n)` on some steps only), in `scratch`'s buffers."""
    names = list(args) + list(outs)

    def kernel(*refs):
        r = dict(zip(names, refs, strict=True))
        b, h, n = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index(blocks)
        if cfg.causal and blocks == "q":  # longest first: the last q blocks see the most keys,
            n = cfg.nq - 1 - n  # so the grid's tail is short CTAs, not long ones (FA2's order)
        lo, hi = loop_range(cfg, r, b, n)
        warp_specialized(
            lambda smem, bars, wg: consumer(cfg, r, smem, bars, b, h, n, lo, hi, wg, ops),
            sources(cfg, r, b, h, n, ops), lo, hi, cfg.num_stages,
            scratch(cfg, r["q"].dtype, ops), ops, when(cfg, n))

    call = plgpu.kernel(
        kernel, out_type=tuple(outs.values()),
        grid=(cfg.num_heads, cfg.nq if blocks == "q" else cfg.nk, args["q"].shape[0]),
        grid_names=("h", blocks, "b"), num_threads=COMPUTE_WGS + 1, thread_name="wg",
        kernel_name=f"t5x_like_flash_{name}_hopper", **call_params(ops))
    return call(*args.values())


def forward(cfg: FlashConfig, q, k, v, side: dict) -> tuple[jax.Array, jax.Array]:
    """o [B, Lq_pad, H, Dp] (q.dtype), lse [B, H, Lq_pad] f32, as `_flash_triton.forward`."""
    reason = unsupported(cfg, q.dtype)
    if reason:
        raise ValueError(f"backend 'mosaic_gpu' cannot run this call: {reason}")
    ops = Ops(cfg.interpret)
    args = {"q": q, "v": v}
    if ops.interpret:
        args["kt"] = jnp.transpose(k, (0, 2, 3, 1))  # [B, Hkv, D, Lk]
    else:
        args["k"] = k
    if cfg.has_rel:  # the band in q's dtype: half the bytes of f32 (the bias is bf16 in T5X)
        args["relband"] = gpu_inputs.rel_band(cfg, side["tab"], dtype=q.dtype)
        args["relfar"] = gpu_inputs.rel_far(cfg, side["tab"], q.dtype)
    args.update(gpu_inputs.side_args(cfg, side, ("klo", "khi"), (ROWS, cfg.block_k)))
    batch = q.shape[0]
    outs = {"o": jax.ShapeDtypeStruct(q.shape, q.dtype),
            "lse": jax.ShapeDtypeStruct((batch, cfg.num_heads, cfg.lq_pad), jnp.float32)}
    return _launch(cfg, ops, args, outs, "q", "fwd", tiles.k_range, _consumer, _fwd_sources,
                   _scratch, _fwd_when)


# ---- backward: dK/dV -------------------------------------------------------------------------
DKDV_KEYS = BLOCK_Q  # keys per dK/dV CTA: two compute warpgroups of 64


def _dkdv_cfg(cfg: FlashConfig) -> FlashConfig:
    """`cfg` with the dK/dV kernel's blocks: 128 keys per CTA and streamed tiles of 64 query
    rows, 32 at head_dim 128 (the dK and dV accumulators then hold 128 of a thread's registers;
    with 64 rows the prefix-LM variants spilled)."""
    return dataclasses.replace(cfg, block_q=64 if cfg.head_dim_pad <= 64 else 32,
                               block_k=DKDV_KEYS)


def _dkdv_streams(cfg: FlashConfig, ops: Ops) -> list[str]:
    """The per-q-block tiles the dK/dV producer streams."""
    return (["q", "do", "lse", "delta"] + (["qt", "dot"] if ops.interpret else [])
            + (["rel"] if cfg.has_rel else []) + (["qseg"] if cfg.has_seg else [])
            + (["pq"] if cfg.has_prefix else []))


def _dkdv_scratch(cfg: FlashConfig, dtype, ops: Ops) -> tuple[dict, dict]:
    s, bq, d = cfg.num_stages, cfg.block_q, cfg.head_dim_pad
    # dK += dSᵀ q contracts over the tile's bq rows: a swizzle of at most bq 16-bit elements,
    # and wgmma wants the same swizzle on both operands of kqᵀ and v dOᵀ.
    tiled = (plgpu.TilingTransform((8, bq)), plgpu.SwizzleTransform(2 * bq))
    smem = {"k": plgpu.SMEM((COMPUTE_WGS, ROWS, d), dtype, transforms=tiled),
            "v": plgpu.SMEM((COMPUTE_WGS, ROWS, d), dtype, transforms=tiled),
            "q": plgpu.SMEM((s, bq, d), dtype, transforms=tiled),
            "do": plgpu.SMEM((s, bq, d), dtype, transforms=tiled),
            "lse": plgpu.SMEM((s, bq), jnp.float32), "delta": plgpu.SMEM((s, bq), jnp.float32)}
    own = ["k", "v"]
    if ops.interpret:
        smem["qt"] = plgpu.SMEM((s, d, bq), dtype)
        smem["dot"] = plgpu.SMEM((s, d, bq), dtype)
        smem["a"] = plgpu.SMEM((COMPUTE_WGS, ROWS, bq), dtype)
    if cfg.has_rel:
        smem["rel"] = tiles.rel_smem(s, DKDV_KEYS, bq, dtype)
    if cfg.has_seg:
        smem["qseg"] = plgpu.SMEM((s, bq), jnp.int32)
        smem["kseg"] = plgpu.SMEM((COMPUTE_WGS, ROWS), jnp.int32)
        own.append("kseg")
    if cfg.has_prefix:
        smem["pq"] = plgpu.SMEM((s, bq), jnp.int32)
        smem["pk"] = plgpu.SMEM((COMPUTE_WGS, ROWS), jnp.int32)
        own.append("pk")
    return smem, barriers(own, _dkdv_streams(cfg, ops), s)


def _dkdv_skips_far(cfg: FlashConfig) -> bool:
    """Whether dK/dV skips the band tiles of tiles in one bucket: not at head_dim 128 with a
    prefix mask, where the branch spilled registers (16/28 B) beside the two accumulators."""
    return cfg.has_rel and not (cfg.head_dim_pad > 64 and cfg.has_prefix)


def _dkdv_unscaled(cfg: FlashConfig) -> bool:
    """Whether dK/dV scales its scores inside the exponent's FFMA (`tiles.unscaled_logits`):
    not at head_dim 128, where that spilled registers (4/20 B, packed causal with a T5 table)
    beside the two accumulators."""
    return tiles.unscaled_logits(cfg) and cfg.head_dim_pad <= 64


def _dkdv_when(cfg: FlashConfig, j) -> dict:
    """dK/dV's streams loaded on some steps only: the transposed band tile of q block i where
    the CTA's tile (its 128 keys against the block's queries) may hold more than one bucket."""
    if not _dkdv_skips_far(cfg):
        return {}
    return {"rel": lambda i: tiles.bias_varies(cfg, cfg.block_q, cfg.block_k, i * cfg.block_q,
                                               j * cfg.block_k)[0]}


def _dkdv_consumer(cfg: FlashConfig, r: dict, smem: dict, bars: dict, b, h, j, lo, hi, wg,
                   ops: Ops):
    """dK, dV of the warpgroup's 64 keys over q blocks [lo, hi), in the transposed frame (keys
    as rows, so no operand is transposed in registers):

        sᵀ = k qᵀ·scale + biasᵀ;  pᵀ = 2^(sᵀ·log2 e - lse·log2 e);  dV += pᵀ dO
        dPᵀ = v dOᵀ;  dSᵀ = pᵀ (dPᵀ - Δ);  dK += dSᵀ q (· scale at the end)
    """
    if not ops.interpret:
        plgpu.set_max_registers(232, action="increase")
    bq, d, s = cfg.block_q, cfg.head_dim_pad, cfg.num_stages
    dtype = r["q"].dtype
    k0 = j * cfg.block_k + wg * ROWS
    keys, hk = pl.ds(k0, ROWS), lax.div(h, jnp.int32(cfg.group))
    own = {"k": r["k"].at[b, keys, hk], "v": r["v"].at[b, keys, hk]}
    if cfg.has_seg:
        own["kseg"] = r["kseg"].at[b, keys]
    if cfg.has_prefix:
        own["pk"] = r["pk"].at[b, keys]
    load_own(smem, bars, own, wg)
    row_layout, col_layout = plgpu.Layout.WGMMA.reduce(1), plgpu.Layout.WGMMA.reduce(0)
    cols_of = lambda x: lax.broadcast_in_dim(x, (ROWS, bq), [1])  # noqa: E731
    kseg = ops.load(smem["kseg"].at[wg], row_layout) if cfg.has_seg else None  # broadcast
    pk = ops.load(smem["pk"].at[wg], row_layout) if cfg.has_prefix else None  # in the loop
    a_smem = smem["a"].at[wg] if ops.interpret else None
    scale, raw = tiles.logit_scale(cfg), _dkdv_unscaled(cfg)
    streams = _dkdv_streams(cfg, ops)
    when = _dkdv_when(cfg, j)
    own_id = tiles.row_segment(cfg, r, b, "kone", k0 // ROWS)

    def step(diagonal, i, carry):
        dk, dv = carry
        slot = lax.rem(i - lo, jnp.int32(s))
        for name in streams:
            if name not in ("do", "dot", "delta", "rel"):
                plgpu.barrier_wait(bars[name].at[slot])
        init = None
        if cfg.has_rel:
            varies, right = tiles.bias_varies(cfg, bq, cfg.block_k, i * bq, j * cfg.block_k)
            varies = varies if _dkdv_skips_far(cfg) else None
            init = tiles.bias_over_scale(cfg, ops, r, smem, bars, h, slot,
                                         pl.ds(wg * ROWS, ROWS), bq, varies, right)
        x = ops.scores(smem["k"].at[wg], ops.transposed(smem, "q", slot), bq, init=init)
        x = tiles.masked(cfg, ops, smem, slot, x if raw else x * scale, i * bq, k0, kseg, pk,
                         keys_as_rows=True, diagonal=diagonal,
                         one_segment=tiles.same_segment(r, b, own_id, "qone", i))
        lse2 = cols_of(ops.load(smem["lse"].at[slot], col_layout))  # lse · log2 e
        p = jnp.exp2((x * scale if raw else x) - lse2)  # raw: one FFMA a score
        for name in ("do", "dot", "delta"):
            if name in streams:
                plgpu.barrier_wait(bars[name].at[slot])
        dv = ops.mma_acc(dv, p.astype(dtype), smem["do"].at[slot], a_smem)
        dp = ops.scores(smem["v"].at[wg], ops.transposed(smem, "do", slot), bq)
        ds = p * (dp - cols_of(ops.load(smem["delta"].at[slot], col_layout)))
        dk = ops.mma_acc(dk, ds.astype(dtype), smem["q"].at[slot], a_smem)
        plgpu.barrier_arrive(bars["free"].at[slot])
        return dk, dv

    def drain(i, carry):
        release(bars, streams, lax.rem(i - lo, jnp.int32(s)),
                {name: pred(i) for name, pred in when.items()})
        return carry

    zeros = ops.layout(jnp.zeros((ROWS, d), jnp.float32), plgpu.Layout.WGMMA)
    # Causal: the second warpgroup's keys start a q block later than the CTA's.
    own_lo = jnp.clip(tiles.causal_start(cfg, r, b, k0), lo, hi) if cfg.causal else lo
    lax.fori_loop(lo, own_lo, drain, 0)
    # q blocks from ceil((k0 + 63) / bq) start at or after the warpgroup's last key
    dk, dv = tiles.causal_split(cfg, lambda diag: functools.partial(step, diag), own_lo, hi,
                                (k0 + ROWS - 1 + bq - 1) // bq, (zeros, zeros),
                                diagonal_first=True)
    dk = dk * cfg.sm_scale if cfg.sm_scale != 1.0 else dk
    r["dk"].at[b, keys, h][...] = dk.astype(r["dk"].dtype)
    r["dv"].at[b, keys, h][...] = dv.astype(r["dv"].dtype)


def _dkdv_sources(cfg: FlashConfig, r: dict, b, h, j, ops: Ops) -> dict:
    """dK/dV's streams: q block i's queries, output gradients, statistics and side tiles."""
    bq = cfg.block_q
    rows = lambda i: pl.ds(i * bq, bq)  # noqa: E731
    sources = {"q": lambda i: r["q"].at[b, rows(i), h], "do": lambda i: r["do"].at[b, rows(i), h],
               "lse": lambda i: r["lse"].at[b, h, rows(i)],
               "delta": lambda i: r["delta"].at[b, h, rows(i)]}
    if ops.interpret:
        sources["qt"] = lambda i: r["qt"].at[b, h, :, rows(i)]
        sources["dot"] = lambda i: r["dot"].at[b, h, :, rows(i)]
    if cfg.has_rel:  # the transposed band's columns for offsets k - q of this tile
        sources["rel"] = lambda i: r["relbandt"].at[
            h, :, pl.ds(i * bq - j * cfg.block_k + cfg.lk_pad, bq)]
    if cfg.has_seg:
        sources["qseg"] = lambda i: r["qseg"].at[b, rows(i)]
    if cfg.has_prefix:
        sources["pq"] = lambda i: r["pq"].at[b, rows(i)]
    return sources


def _dkdv(cfg: FlashConfig, q, k, v, side: dict, lse, delta, do) -> tuple[jax.Array, jax.Array]:
    """dK, dV per q head, `[B, Lk_pad, H, Dp]` in `common.grad_dtypes` (f32 at head_dim 128),
    as the Triton backward's."""
    ops = Ops(cfg.interpret)
    # lse in base 2 once here, not per streamed tile (16 FMULs a thread a step)
    args = {"q": q, "k": k, "v": v, "do": do, "lse": lse * LOG2E, "delta": delta}
    if ops.interpret:
        args["qt"] = jnp.transpose(q, (0, 2, 3, 1))  # [B, H, D, Lq]
        args["dot"] = jnp.transpose(do, (0, 2, 3, 1))
    if cfg.has_rel:
        args["relbandt"] = gpu_inputs.rel_band_keys_as_rows(cfg, side["tab"], DKDV_KEYS,
                                                            dtype=q.dtype)
        args["relfar"] = gpu_inputs.rel_far(cfg, side["tab"], q.dtype)
    args.update(gpu_inputs.side_args(cfg, side, ("qlo", "qhi"), (cfg.block_q, ROWS)))
    # At head_dim 128 the two [64, 128] f32 accumulators fill the registers: a cast before the
    # stores spilled (packed prefix LM with a table), so those store f32 and XLA casts.
    out_dtype = common.grad_dtypes(cfg, q.dtype)[1] if cfg.head_dim_pad <= 64 else jnp.float32
    per_head = jax.ShapeDtypeStruct((q.shape[0], cfg.lk_pad, cfg.num_heads, cfg.head_dim_pad),
                                    out_dtype)
    return _launch(cfg, ops, args, {"dk": per_head, "dv": per_head}, "k", "bwd_dkdv",
                   tiles.q_range, _dkdv_consumer, _dkdv_sources, _dkdv_scratch, _dkdv_when)


# ---- backward: dQ (+ the T5 table's gradient) --------------------------------------------------
def _dq_cfg(cfg: FlashConfig) -> FlashConfig:
    """`cfg` with the dQ kernel's blocks: 128 query rows per CTA, k tiles of 64, or 32 at
    head_dim 128 with a table (64 spilled 4/8 B there with a causal mask)."""
    return dataclasses.replace(cfg, block_k=32 if cfg.has_rel and cfg.head_dim_pad > 64 else 64)


def _dq_streams(cfg: FlashConfig, ops: Ops) -> list[str]:
    """The per-k-block tiles the dQ producer streams: k (and kᵀ, vᵀ in interpret mode), with a
    table its bias tiles."""
    return (["k"] + (["kt", "vt"] if ops.interpret else ["v"])
            + (["rel"] if cfg.has_rel else [])
            + (["kseg"] if cfg.has_seg else []) + (["pk"] if cfg.has_prefix else []))


def _dq_scratch(cfg: FlashConfig, dtype, ops: Ops) -> tuple[dict, dict]:
    s, bk, d = cfg.num_stages, cfg.block_k, cfg.head_dim_pad
    # dQ += dS k contracts over the tile's bk keys: a swizzle of at most bk 16-bit elements, the
    # same on both operands of q kᵀ and dO vᵀ.
    tiled = (plgpu.TilingTransform((8, bk)), plgpu.SwizzleTransform(2 * bk))
    smem = {"q": plgpu.SMEM((COMPUTE_WGS, ROWS, d), dtype, transforms=tiled),
            "do": plgpu.SMEM((COMPUTE_WGS, ROWS, d), dtype, transforms=tiled),
            "lse": plgpu.SMEM((COMPUTE_WGS, ROWS), jnp.float32),
            "delta": plgpu.SMEM((COMPUTE_WGS, ROWS), jnp.float32),
            "k": plgpu.SMEM((s, bk, d), dtype, transforms=tiled)}
    own = ["q", "do", "lse", "delta"]
    if ops.interpret:
        smem["kt"] = plgpu.SMEM((s, d, bk), dtype)
        smem["vt"] = plgpu.SMEM((s, d, bk), dtype)
        smem["a"] = plgpu.SMEM((COMPUTE_WGS, ROWS, bk), dtype)
    else:
        smem["v"] = plgpu.SMEM((s, bk, d), dtype, transforms=tiled)
    if cfg.has_rel:
        smem["rel"] = tiles.rel_smem(s, BLOCK_Q, bk, dtype)
        smem["far"] = plgpu.SMEM((COMPUTE_WGS, 2, ROWS), jnp.float32)
    if cfg.has_seg:
        smem["qseg"] = plgpu.SMEM((COMPUTE_WGS, ROWS), jnp.int32)
        smem["kseg"] = plgpu.SMEM((s, bk), jnp.int32)
        own.append("qseg")
    if cfg.has_prefix:
        smem["pq"] = plgpu.SMEM((COMPUTE_WGS, ROWS), jnp.int32)
        smem["pk"] = plgpu.SMEM((s, bk), jnp.int32)
        own.append("pq")
    return smem, barriers(own, _dq_streams(cfg, ops), s)


def _dq_consumer(cfg: FlashConfig, r: dict, smem: dict, bars: dict, b, h, i, lo, hi, wg,
                 ops: Ops):
    """dQ of the warpgroup's 64 query rows over k blocks [lo, hi), and with a T5 table its
    gradient: dS of the tiles in the q block's window stored (`gpu_inputs.near_window`), the
    row sums of the others in their outermost bucket's column:

        p = 2^(s·log2 e - lse·log2 e);  dP = dO vᵀ;  dS = p (dP - Δ);  dQ += dS k (· scale)
        d table[n] += sum of dS over the tile's (q, k) with bucket(k - q) = n
    """
    if not ops.interpret:
        plgpu.set_max_registers(232, action="increase")
    bk, d, s = cfg.block_k, cfg.head_dim_pad, cfg.num_stages
    dtype = r["q"].dtype
    q0 = i * cfg.block_q + wg * ROWS
    rows = pl.ds(q0, ROWS)
    own = {"q": r["q"].at[b, rows, h], "do": r["do"].at[b, rows, h],
           "lse": r["lse"].at[b, h, rows], "delta": r["delta"].at[b, h, rows]}
    if cfg.has_seg:
        own["qseg"] = r["qseg"].at[b, rows]
    if cfg.has_prefix:
        own["pq"] = r["pq"].at[b, rows]
    load_own(smem, bars, own, wg)
    row_layout = plgpu.Layout.WGMMA.reduce(1)
    rows_of = lambda x: lax.broadcast_in_dim(x, (ROWS, bk), [0])  # noqa: E731
    qseg, pq = tiles.query_row_vectors(cfg, ops, smem, wg)
    lse2 = ops.load(smem["lse"].at[wg], row_layout) * LOG2E
    delta = ops.load(smem["delta"].at[wg], row_layout)
    a_smem = smem["a"].at[wg] if ops.interpret else None
    streams = _dq_streams(cfg, ops)
    raw, c = tiles.unscaled_logits(cfg), tiles.logit_scale(cfg)
    when = _fwd_when(cfg, i)
    own_id = tiles.row_segment(cfg, r, b, "qone", q0 // ROWS)
    if cfg.has_rel:  # the q block's window; this warpgroup's rows of its stored dS tiles
        nwin = gpu_inputs.near_window(cfg)
        j0 = gpu_inputs.near_first_block(cfg, i * cfg.block_q)
        rows_in_block = pl.ds(wg * ROWS, ROWS)
        band = lambda j: r["dsband"].at[b, h, i, rows_in_block, pl.ds((j - j0) * bk, bk)]  # noqa: E731

    def step(diagonal, j, carry):
        dq, far = carry
        slot = lax.rem(j - lo, jnp.int32(s))
        for name in streams:
            if name != "rel":  # the band tile in `tiles.bias_over_scale`
                plgpu.barrier_wait(bars[name].at[slot])
        x = tiles.query_row_logits(cfg, ops, r, smem, bars, slot, wg, smem["q"].at[wg], h, i,
                                   j * bk, qseg, pq, diagonal, scaled=not raw,
                                   one_segment=tiles.same_segment(r, b, own_id, "kone", j))
        p = jnp.exp2((x * c if raw else x) - rows_of(lse2))  # raw: one FFMA a score
        dp = ops.scores(smem["do"].at[wg], ops.transposed(smem, "v", slot), bk)
        ds = p * (dp - rows_of(delta))
        dq = ops.mma_acc(dq, ds.astype(dtype), smem["k"].at[slot], a_smem)
        if cfg.has_rel:
            in_window = (j0 <= j) & (j < j0 + nwin)
            far = lax.cond(in_window, lambda f: f,
                           lambda f: tiles.far_tile_sums(cfg, f, ds, q0, j * bk), far)

            @pl.when(in_window)
            def _():
                band(j)[...] = ds.astype(dtype)

        plgpu.barrier_arrive(bars["free"].at[slot])
        return dq, far

    def drain(j, carry):
        release(bars, streams, lax.rem(j - lo, jnp.int32(s)),
                {name: pred(j) for name, pred in when.items()})
        return carry

    zeros = lambda n: ops.layout(jnp.zeros((ROWS, n), jnp.float32),  # noqa: E731
                                 plgpu.Layout.WGMMA)
    row_zeros = lambda: ops.layout(jnp.zeros((ROWS,), jnp.float32), row_layout)  # noqa: E731
    init = (zeros(d), (row_zeros(), row_zeros()) if cfg.has_rel else None)
    own_hi = jnp.clip(tiles.causal_end(cfg, r, b, q0, ROWS), lo, hi) if cfg.causal else hi
    dq, far = tiles.causal_split(cfg, lambda diag: functools.partial(step, diag), lo, own_hi,
                                 (q0 + 1) // bk, init)
    lax.fori_loop(own_hi, hi, drain, 0)
    if cfg.has_rel:  # window tiles these rows skip (causal, segments) read as zeros

        def zero(j, c):
            band(j)[...] = ops.layout(jnp.zeros((ROWS, bk), dtype), plgpu.Layout.WGMMA)
            return c

        lax.fori_loop(j0, jnp.minimum(lo, j0 + nwin), zero, 0)
        lax.fori_loop(jnp.maximum(jnp.maximum(own_hi, lo), j0), j0 + nwin, zero, 0)
    dq = dq * cfg.sm_scale if cfg.sm_scale != 1.0 else dq
    r["dq"].at[b, rows, h][...] = dq.astype(r["dq"].dtype)
    if cfg.has_rel:  # this warpgroup's far sums: [2, 64] at 2i + wg of [B, H, 2 nq, 2, 64]
        smem["far"].at[wg, 0][...] = far[0]
        smem["far"].at[wg, 1][...] = far[1]
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem["far"].at[wg], r["dfar"].at[b, h, i * COMPUTE_WGS + wg])
        plgpu.wait_smem_to_gmem(0)


def _dq_sources(cfg: FlashConfig, r: dict, b, h, i, ops: Ops) -> dict:
    """dQ's streams: k block j's keys, values, bias tiles and side tiles."""
    bk, hk = cfg.block_k, lax.div(h, jnp.int32(cfg.group))
    ks = lambda j: pl.ds(j * bk, bk)  # noqa: E731
    sources = {"k": lambda j: r["k"].at[b, ks(j), hk]}
    if ops.interpret:
        sources["kt"] = lambda j: r["kt"].at[b, hk, :, ks(j)]
        sources["vt"] = lambda j: r["vt"].at[b, hk, :, ks(j)]
    else:
        sources["v"] = lambda j: r["v"].at[b, ks(j), hk]
    if cfg.has_rel:  # the bands' columns for offsets k - q of this tile
        cols = lambda j: pl.ds(j * bk - i * cfg.block_q + cfg.lq_pad, bk)  # noqa: E731
        sources["rel"] = lambda j: r["relband"].at[h, :, cols(j)]
    if cfg.has_seg:
        sources["kseg"] = lambda j: r["kseg"].at[b, ks(j)]
    if cfg.has_prefix:
        sources["pk"] = lambda j: r["pk"].at[b, ks(j)]
    return sources


def _dq(cfg: FlashConfig, q, k, v, side: dict, lse, delta, do):
    """(dQ `[B, Lq_pad, H, Dp]` in q's dtype, the table gradient `[H, NBp]` f32 or None), as
    `_flash_triton.backward`'s."""
    ops = Ops(cfg.interpret)
    args = {"q": q, "k": k, "do": do, "lse": lse, "delta": delta}
    if ops.interpret:
        args["kt"] = jnp.transpose(k, (0, 2, 3, 1))
        args["vt"] = jnp.transpose(v, (0, 2, 3, 1))
    else:
        args["v"] = v
    if cfg.has_rel:
        args["relband"] = gpu_inputs.rel_band(cfg, side["tab"], dtype=q.dtype)
        args["relfar"] = gpu_inputs.rel_far(cfg, side["tab"], q.dtype)
    args.update(gpu_inputs.side_args(cfg, side, ("klo", "khi"), (ROWS, cfg.block_k)))
    outs = {"dq": jax.ShapeDtypeStruct(q.shape, common.grad_dtypes(cfg, q.dtype)[0])}
    if cfg.has_rel:
        outs["dfar"] = jax.ShapeDtypeStruct(
            (q.shape[0], cfg.num_heads, cfg.nq * COMPUTE_WGS, 2, ROWS), jnp.float32)
        outs["dsband"] = jax.ShapeDtypeStruct(
            (q.shape[0], cfg.num_heads, cfg.nq, cfg.block_q,
             gpu_inputs.near_window(cfg) * cfg.block_k), q.dtype)
    res = _launch(cfg, ops, args, outs, "q", "bwd_dq", tiles.k_range, _dq_consumer, _dq_sources,
                  _dq_scratch, _fwd_when)
    if not cfg.has_rel:
        return res[0], None
    return res[0], gpu_inputs.window_table_gradient(cfg, res[2], res[1])


def backward(cfg: FlashConfig, q, k, v, side: dict, o, lse, do):
    """`_flash_triton.backward`'s contract, from the Hopper dK/dV and dQ kernels (dQ also
    reduces the T5 table's gradient)."""
    delta = gpu_inputs.delta_of(o, do)
    dk, dv = _dkdv(_dkdv_cfg(cfg), q, k, v, side, lse, delta, do)
    dq, dtab = _dq(_dq_cfg(cfg), q, k, v, side, lse, delta, do)
    return dq, dk, dv, dtab, None
