"""GPU (Pallas on Triton) flash-attention kernels: forward, dK/dV, and dQ (+ bias gradients).

Grid `(B, H, n_blocks)`; each program owns one q block (forward, dQ) or one k block (dK/dV) and
loops over the other axis with `fori_loop`, so skipped blocks are never loaded or computed:
causal programs stop at the diagonal (or at the end of the prefix), and with segment ids the loop
bounds (precomputed per block, `gpu_inputs.segment_block_ranges`) leave out blocks whose segment
ranges do not overlap (packing, padding). The loop bodies hold no nested loop and no `cond`
around loads, so Triton software-pipelines the k/v (q/dO) loads (cp.async, TMA). The kv head of
a q head is chosen in the BlockSpec index map (`h // group`), so GQA/MQA never repeats k/v.

All array arguments are already padded by `flash.py`: lengths to block multiples, head_dim to a
power of two, the bucket table to `[H, num_buckets_pad]`. The table is turned into a bias band
(`gpu_inputs.rel_band`) so the k loop loads the T5 bias instead of looping over buckets; its
gradient comes from dS tiles near the diagonal, which the dQ kernel stores
(`gpu_inputs.near_window`), and the sums of the tiles beyond them.
The backward kernels run with the `bwd_*` blocks of `FlashConfig`.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from t5x_like.kernels import _flash_common as common
from t5x_like.kernels import _flash_gpu_inputs as gpu_inputs
from t5x_like.kernels._flash_common import FlashConfig, dot

# Softmax in base 2 (`exp2` is one `ex2.approx` instruction; `exp` lowers to libdevice's
# range-reduced expf, about eight): logits times log2 e, folded into the scale.
LOG2E = math.log2(math.e)


def _cost(cfg: FlashConfig, kernel: str, itemsize: int, batch: int) -> pl.CostEstimate:
    """Rough XLA cost hint of one kernel: matmul flops, exps and HBM bytes over visited tiles.

    Per tile: forward 2 matmuls + bq*bk exps, reading a k and a v tile; dK/dV 4 matmuls reading
    q, dO tiles; dQ 3 matmuls reading k, v tiles. The owned block is read/written once.
    """
    bq, bk, d = cfg.block_q, cfg.block_k, cfg.head_dim_pad
    tiles = common.visited_tiles(cfg) * batch * cfg.num_heads
    matmuls = {"fwd": 2, "dkdv": 4, "dq": 3}[kernel]
    streamed = 2 * (bq if kernel == "dkdv" else bk) * d * itemsize  # two [block, d] per tile
    rel = bq * bk * 4 if cfg.has_rel else 0
    owned = batch * cfg.num_heads * (cfg.lq_pad + cfg.lk_pad) * d * (itemsize + 4)
    return pl.CostEstimate(flops=int(tiles * matmuls * 2 * bq * bk * d),
                           transcendentals=int(tiles * bq * bk),
                           bytes_accessed=int(tiles * (streamed + rel) + owned))


def _call(cfg: FlashConfig, kernel, kind: str, names: list[str], args: dict, specs: dict,
          **kwargs):
    """`pallas_call` of one kernel ('fwd' | 'dkdv' | 'dq') on `args[n] for n in names`, grid
    (B, H, blocks the kernel owns: q blocks, or k blocks for 'dkdv')."""
    batch = args["q"].shape[0]
    return pl.pallas_call(
        functools.partial(kernel, cfg=cfg, names=names),
        grid=(batch, cfg.num_heads, cfg.nk if kind == "dkdv" else cfg.nq),
        in_specs=[specs[n] for n in names], interpret=cfg.interpret,
        compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        cost_estimate=_cost(cfg, kind, args["q"].dtype.itemsize, batch), **kwargs,
    )(*[args[n] for n in names])


def _only(names: list[str], *drop: str) -> list[str]:
    """The side-input names one kernel takes: all but `drop`."""
    return [n for n in names if n not in drop]


def _gpu_side(cfg: FlashConfig, side: dict, names: list[str]) -> tuple[dict, list[str]]:
    """Side inputs as the GPU kernels take them: the bucket table becomes the bias band (in the
    scores' units, divided by sm_scale: `common.logits_tile` adds it before scaling), segment
    ids add per-block loop bounds and each block's single id (`gpu_inputs.single_segment_blocks`:
    a tile inside one example skips the segment test)."""
    side = dict(side)
    if cfg.has_rel:
        side["relband"] = gpu_inputs.rel_band(cfg, side.pop("tab"), unit=1.0 / cfg.sm_scale)
        names = [n for n in names if n != "tab"] + ["relband"]
    if cfg.has_seg:
        side.update(gpu_inputs.segment_block_ranges(cfg, side["qseg"], side["kseg"]))
        side.update(qone=gpu_inputs.single_segment_blocks(side["qseg"], cfg.block_q, -1),
                    kone=gpu_inputs.single_segment_blocks(side["kseg"], cfg.block_k, -2))
        names = names + ["klo", "khi", "qlo", "qhi", "qone", "kone"]
    return side, names


def _exp2(cfg: FlashConfig, x: jax.Array) -> jax.Array:
    """2^x in f32 with denormals flushed (`ex2.approx.ftz.f32`, one MUFU.EX2 an element).
    Triton lowers `exp2` to `ex2.approx.f32`, which ptxas wraps in a range test and two
    multiplies for denormal results (4 SASS instructions an element); a softmax never needs
    2^x below 2^-126. Interpret mode (no PTX): `jnp.exp2`."""
    if cfg.interpret:
        return jnp.exp2(x)
    (out,) = plgpu.elementwise_inline_asm(
        "ex2.approx.ftz.f32 $0, $1;", args=[x], constraints="=f,f", pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(x.shape, jnp.float32)])
    return out


def _one_segment(cfg: FlashConfig, r: dict, row: str, n):
    """Whether the program's own block and looped-over block n (of `r[row]`, "kone" or
    "qone") hold one segment id between them: such a tile skips the segment test. None (test
    every tile) without segment ids, and where the branch spilled registers: with a dense bias
    (the sm_90 prefix forward, 28 B), and in dK/dV ("qone" rows) with a T5 table at head_dim
    128 (sm_80/86/89: 0.4-3.5 KB)."""
    if not cfg.has_seg or cfg.has_bias or (row == "qone" and cfg.has_rel
                                            and cfg.head_dim_pad > 64):
        return None
    own = r["qone" if row == "kone" else "kone"][...]
    return own == r[row][n]


def _rel_tile(cfg: FlashConfig, r: dict, q0, k0) -> jax.Array:
    """The tile's [bq, bk] T5 bias: a slice of the band `relband`."""
    start = pl.multiple_of(k0 - q0 + cfg.lq_pad, 16)  # blocks and lq_pad are multiples of 16
    return r["relband"][:, pl.ds(start, cfg.block_k)]


def _far_tile_sums(cfg: FlashConfig, ds: jax.Array, q0, k0, in_window: jax.Array,
                   far: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """`far` (left, right) [bq] plus this tile's row sums of dS when the tile is outside its q
    block's window (`gpu_inputs.near_window`): such a tile lies wholly on one side of the
    diagonal, beyond where the buckets saturate, all in that side's outermost bucket (left:
    offsets k - q below -reach; right: above reach, `gpu_inputs.window_reach`). Tiles in the
    window, which bucket boundaries cross, are stored instead and summed by offset after the
    kernel. Deterministic, no atomics."""
    rmin, _ = common.tile_offset_range(cfg.block_q, cfg.block_k, q0, k0)

    def add(lr):
        left, right = lr
        row = jnp.sum(ds, axis=1)
        is_right = rmin > 0  # a tile outside the window has no offset within reach
        return jnp.where(is_right, left, left + row), jnp.where(is_right, right + row, right)

    return jax.lax.cond(in_window, lambda lr: lr, add, far)  # no row sums for stored tiles


def _row_specs(cfg: FlashConfig, by_q_block: bool) -> dict[str, pl.BlockSpec]:
    """BlockSpecs of the per-token side inputs: the program's own block or the whole row."""
    bq, bk = cfg.block_q, cfg.block_k
    if by_q_block:  # grid axis 2 walks q blocks; k rows are looped over in-kernel
        q_row = pl.BlockSpec((None, bq), lambda b, h, i: (b, i))
        k_row = pl.BlockSpec((None, cfg.lk_pad), lambda b, h, i: (b, 0))
    else:
        q_row = pl.BlockSpec((None, cfg.lq_pad), lambda b, h, j: (b, 0))
        k_row = pl.BlockSpec((None, bk), lambda b, h, j: (b, j))
    specs = {}
    if cfg.has_seg:
        specs["qseg"], specs["kseg"] = q_row, k_row
        bound = pl.BlockSpec((None, None), lambda b, h, i: (b, i))  # this program's bounds
        specs.update(dict.fromkeys(("klo", "khi") if by_q_block else ("qlo", "qhi"), bound))
        # single ids: the program's own block's, the looped-over blocks' whole row
        own, row = ("qone", "kone") if by_q_block else ("kone", "qone")
        specs[own] = bound
        specs[row] = pl.BlockSpec((None, cfg.nk if by_q_block else cfg.nq),
                                  lambda b, h, i: (b, 0))
    if cfg.has_prefix:
        specs["pq"], specs["pk"] = q_row, k_row
        specs["plen"] = pl.BlockSpec((None,), lambda b, h, i: (b,))
    if cfg.has_rel:
        width = gpu_inputs.offset_row_width(cfg)
        specs["relband"] = pl.BlockSpec((None, bq, width), lambda b, h, i: (h, 0, 0))
    if cfg.has_bias:  # [bq, Lk] rows or [Lq, bk] columns; batch / head 0 when broadcast
        bb, bh = cfg.bias_batch > 1, cfg.bias_heads > 1
        specs["bias"] = pl.BlockSpec(
            (None, None, *((bq, cfg.lk_pad) if by_q_block else (cfg.lq_pad, bk))),
            lambda b, h, i: (b if bb else 0, h if bh else 0, *((i, 0) if by_q_block else (0, i))))
    return specs


def _at_least_one(lo, hi, n: int):
    """Loop bounds [lo, hi) over n blocks, widened to one block where empty, and whether the
    given range visits any (None: always). A loop that may run no trips makes ptxas serialize
    the sm_90 kernels' wgmmas (C7515: the zero-trip path's zeroed accumulators join the wait of
    the MMA left in flight across the back edge). The bounds cover every block with an allowed
    score, so the added block is fully masked: p = 0, and it adds exact zeros for finite k, v.
    In the forward and dQ a range is empty for a q block of padding, which then visits k block
    `klo` = 0, whose keys real queries see anyway; dK/dV zeroes its own k and v where the range
    was empty (keys no query sees), so not even a non-finite value there reaches dK, dV."""
    if isinstance(lo, int) and isinstance(hi, int):  # static: 0 .. n, never empty
        return lo, hi, None
    visits = hi > lo
    lo = jnp.minimum(lo, n - 1)
    return lo, jnp.maximum(hi, lo + 1), visits


def _unless_empty(visits, x: jax.Array) -> jax.Array:
    """x, or zeros where the program's loop range was empty (`_at_least_one`)."""
    return x if visits is None else jnp.where(visits, x, jnp.zeros_like(x))


def _q_loop_state(cfg: FlashConfig, r: dict, q0):
    """Per-q-block quantities for kernels whose program owns a q block: (q index vector, q
    segment ids, q prefix flags, and the k blocks to visit [lo, hi), never empty)."""
    q_idx = q0 + jnp.arange(cfg.block_q, dtype=jnp.int32)
    qseg = r["qseg"][...] if cfg.has_seg else None
    pq = r["pq"][...] if cfg.has_prefix else None
    plen = r["plen"][...] if cfg.has_prefix else None
    lo, hi = 0, (common.causal_k_blocks(cfg, q0, plen) if cfg.causal else cfg.nk)
    if cfg.has_seg:  # only k blocks sharing a segment with this q block
        lo, hi = r["klo"][...], jnp.minimum(hi, r["khi"][...])
    lo, hi, _ = _at_least_one(lo, hi, cfg.nk)
    return q_idx, qseg, pq, lo, hi


def _k_block_inputs(cfg: FlashConfig, r: dict, j):
    """Slice, index vector, side inputs and k, v tiles of k block j (in a q-block program)."""
    k0 = j * cfg.block_k
    ks = pl.ds(k0, cfg.block_k)
    k_idx = k0 + jnp.arange(cfg.block_k, dtype=jnp.int32)
    kseg = r["kseg"][ks] if cfg.has_seg else None
    pk = r["pk"][ks] if cfg.has_prefix else None
    bias = r["bias"][:, ks] if cfg.has_bias else None
    return ks, k_idx, kseg, pk, bias, r["k"][ks, :], r["v"][ks, :]


def _fwd_kernel(*refs, cfg: FlashConfig, names: list[str]):
    r = dict(zip(names + ["o", "lse"], refs, strict=True))
    q0 = pl.program_id(2) * cfg.block_q
    q = r["q"][...]
    q_idx, qseg, pq, lo, hi = _q_loop_state(cfg, r, q0)

    def body(j, carry):
        m, denom, acc = carry
        _, k_idx, kseg, pk, bias, k, v = _k_block_inputs(cfg, r, j)
        rel = _rel_tile(cfg, r, q0, j * cfg.block_k) if cfg.has_rel else None
        one = _one_segment(cfg, r, "kone", j)
        s, _ = common.logits_tile(cfg, dot(q, k, tb=True), q_idx, k_idx, qseg, kseg, pq, pk, None,
                                  bias, rel, unit=LOG2E, one_segment=one)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        m_safe = jnp.where(m_new == common.NEG_INF, 0.0, m_new)
        alpha = _exp2(cfg, m - m_safe)
        p = _exp2(cfg, s - m_safe[:, None])
        denom_new = denom * alpha + jnp.sum(p, axis=1)
        acc_new = acc * alpha[:, None] + dot(p.astype(v.dtype), v)
        return m_new, denom_new, acc_new

    bq, d = cfg.block_q, cfg.head_dim_pad
    init = (jnp.full((bq,), common.NEG_INF, jnp.float32), jnp.zeros((bq,), jnp.float32),
            jnp.zeros((bq, d), jnp.float32))
    m, denom, acc = jax.lax.fori_loop(lo, hi, body, init)
    empty = denom == 0.0  # fully-masked rows: output 0, lse 0 (finite: the backward stays finite)
    r["o"][...] = (acc / jnp.where(empty, 1.0, denom)[:, None]).astype(r["o"].dtype)
    r["lse"][...] = jnp.where(empty, 0.0, (m + jnp.log2(jnp.where(empty, 1.0, denom))) / LOG2E)


def _main_specs(cfg: FlashConfig, by_q_block: bool) -> dict[str, pl.BlockSpec]:
    d, g = cfg.head_dim_pad, cfg.group
    if by_q_block:
        own = pl.BlockSpec((None, cfg.block_q, None, d), lambda b, h, i: (b, i, h, 0))
        kv = pl.BlockSpec((None, cfg.lk_pad, None, d), lambda b, h, i: (b, 0, h // g, 0))
        vec = pl.BlockSpec((None, None, cfg.block_q), lambda b, h, i: (b, h, i))
        return {"q": own, "k": kv, "v": kv, "do": own, "lse": vec, "delta": vec}
    qfull = pl.BlockSpec((None, cfg.lq_pad, None, d), lambda b, h, j: (b, 0, h, 0))
    kv = pl.BlockSpec((None, cfg.block_k, None, d), lambda b, h, j: (b, j, h // g, 0))
    vec = pl.BlockSpec((None, None, cfg.lq_pad), lambda b, h, j: (b, h, 0))
    return {"q": qfull, "k": kv, "v": kv, "do": qfull, "lse": vec, "delta": vec}


def forward(cfg: FlashConfig, q, k, v, side: dict) -> tuple[jax.Array, jax.Array]:
    """o [B, Lq_pad, H, Dp] (q.dtype), lse [B, H, Lq_pad] f32."""
    side, names = _gpu_side(cfg, side, ["q", "k", "v"] + common.side_names(cfg))
    specs = {**_main_specs(cfg, True), **_row_specs(cfg, True)}
    return _call(
        cfg, _fwd_kernel, "fwd", _only(names, "qlo", "qhi"),
        {"q": q, "k": k, "v": v, **side}, specs, name="t5x_like_flash_fwd",
        out_shape=(jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((q.shape[0], cfg.num_heads, cfg.lq_pad), jnp.float32)),
        out_specs=(specs["q"], specs["lse"]))


def _dkdv_kernel(*refs, cfg: FlashConfig, names: list[str]):
    r = dict(zip(names + ["dk", "dv"], refs, strict=True))
    k0 = pl.program_id(2) * cfg.block_k
    k_idx = k0 + jnp.arange(cfg.block_k, dtype=jnp.int32)
    kseg = r["kseg"][...] if cfg.has_seg else None
    pk = r["pk"][...] if cfg.has_prefix else None
    lo = common.causal_first_q_block(cfg, k0, r["plen"][...] if cfg.has_prefix else None) \
        if cfg.causal else 0
    hi = cfg.nq
    if cfg.has_seg:  # only q blocks sharing a segment with this k block
        lo, hi = jnp.maximum(lo, r["qlo"][...]), r["qhi"][...]
    lo, hi, visits = _at_least_one(lo, hi, cfg.nq)
    # a k block no query sees still visits one q block: zero k, v make its dK, dV exactly 0
    k, v = (_unless_empty(visits, r[n][...]) for n in ("k", "v"))

    def body(i, carry):
        dk, dv = carry
        q0 = i * cfg.block_q
        qs = pl.ds(q0, cfg.block_q)
        q_idx = q0 + jnp.arange(cfg.block_q, dtype=jnp.int32)
        qseg = r["qseg"][qs] if cfg.has_seg else None
        pq = r["pq"][qs] if cfg.has_prefix else None
        bias = r["bias"][qs, :] if cfg.has_bias else None
        q = r["q"][qs, :]
        do = r["do"][qs, :]
        lse2 = r["lse"][qs] * LOG2E
        delta = r["delta"][qs]
        rel = _rel_tile(cfg, r, q0, k0) if cfg.has_rel else None
        one = _one_segment(cfg, r, "qone", i)
        s, _ = common.logits_tile(cfg, dot(q, k, tb=True), q_idx, k_idx, qseg, kseg, pq, pk, None,
                                  bias, rel, unit=LOG2E, one_segment=one)
        p = _exp2(cfg, s - lse2[:, None])
        dv = dv + dot(p.astype(do.dtype), do, ta=True)
        dp = dot(do, v, tb=True)
        ds = p * (dp - delta[:, None])
        dk = dk + dot(ds.astype(q.dtype), q, ta=True)
        return dk, dv

    zeros = jnp.zeros((cfg.block_k, cfg.head_dim_pad), jnp.float32)
    dk, dv = jax.lax.fori_loop(lo, hi, body, (zeros, zeros))
    r["dk"][...] = (dk * cfg.sm_scale if cfg.sm_scale != 1.0 else dk).astype(r["dk"].dtype)
    r["dv"][...] = dv.astype(r["dv"].dtype)


def _dq_kernel(*refs, cfg: FlashConfig, names: list[str], outs: list[str]):
    r = dict(zip(names + outs, refs, strict=True))
    q0 = pl.program_id(2) * cfg.block_q
    q = r["q"][...]
    do = r["do"][...]
    lse2 = r["lse"][...] * LOG2E
    delta = r["delta"][...]
    q_idx, qseg, pq, lo, hi = _q_loop_state(cfg, r, q0)
    if cfg.has_bias:  # tiles we skip must still read as a zero gradient

        def zero(j, c):
            r["dbias"][:, pl.ds(j * cfg.block_k, cfg.block_k)] = jnp.zeros(
                (cfg.block_q, cfg.block_k), jnp.float32)
            return c

        jax.lax.fori_loop(0, cfg.nk, zero, 0)

    if cfg.has_rel:  # the window of k blocks whose dS tiles are stored (near the diagonal)
        nwin = gpu_inputs.near_window(cfg)
        j0 = gpu_inputs.near_first_block(cfg, q0)

        def zero_band(j, c):  # window tiles the loop skips (causal, segments) read as zeros
            r["dsband"][:, pl.ds((j - j0) * cfg.block_k, cfg.block_k)] = jnp.zeros(
                (cfg.block_q, cfg.block_k), r["dsband"].dtype)
            return c

        jax.lax.fori_loop(j0, jnp.minimum(lo, j0 + nwin), zero_band, 0)
        jax.lax.fori_loop(jnp.maximum(hi, j0), j0 + nwin, zero_band, 0)

    def body(j, carry):
        dq, far = carry
        ks, k_idx, kseg, pk, bias, k, v = _k_block_inputs(cfg, r, j)
        k0 = j * cfg.block_k
        rel = _rel_tile(cfg, r, q0, k0) if cfg.has_rel else None
        one = _one_segment(cfg, r, "kone", j)
        s, _ = common.logits_tile(cfg, dot(q, k, tb=True), q_idx, k_idx, qseg, kseg, pq, pk, None,
                                  bias, rel, unit=LOG2E, one_segment=one)
        p = _exp2(cfg, s - lse2[:, None])
        ds = p * (dot(do, v, tb=True) - delta[:, None])
        ds_in = ds.astype(k.dtype)
        dq = dq + dot(ds_in, k)
        if cfg.has_rel:
            in_window = jnp.logical_and(j0 <= j, j < j0 + nwin)
            far = _far_tile_sums(cfg, ds, q0, k0, in_window, far)

            @pl.when(in_window)
            def _():
                r["dsband"][:, pl.ds((j - j0) * cfg.block_k, cfg.block_k)] = ds_in

        if cfg.has_bias:
            r["dbias"][:, ks] = ds
        return dq, far

    zero_rows = jnp.zeros((cfg.block_q,), jnp.float32)
    init = (jnp.zeros((cfg.block_q, cfg.head_dim_pad), jnp.float32), (zero_rows, zero_rows))
    dq, (left, right) = jax.lax.fori_loop(lo, hi, body, init)
    r["dq"][...] = (dq * cfg.sm_scale if cfg.sm_scale != 1.0 else dq).astype(r["dq"].dtype)
    if cfg.has_rel:  # per row; `gpu_inputs.window_table_gradient` sums them after the call
        r["dfar"][0, :] = left
        r["dfar"][1, :] = right


def backward(cfg: FlashConfig, q, k, v, side: dict, o, lse, do):
    """Returns (dq [B,Lq_pad,H,Dp], dk/dv per q head [B,Lk_pad,H,Dp] (`common.grad_dtypes`),
    dtab [H, NBp] f32 | None, dbias [B,H,Lq_pad,Lk_pad] f32 | None)."""
    cfg = cfg.for_backward()
    batch, heads, d = q.shape[0], cfg.num_heads, cfg.head_dim_pad
    delta = gpu_inputs.delta_of(o, do)
    side, names = _gpu_side(cfg, side, ["q", "k", "v", "do", "lse", "delta"]
                            + common.side_names(cfg))
    args = {"q": q, "k": k, "v": v, "do": do, "lse": lse, "delta": delta, **side}
    dkdv_names = _only(names, "klo", "khi")
    names = _only(names, "qlo", "qhi")

    dq_dtype, dkdv_dtype = common.grad_dtypes(cfg, q.dtype)
    per_head_kv = jax.ShapeDtypeStruct((batch, cfg.lk_pad, heads, d), dkdv_dtype)
    own_k = pl.BlockSpec((None, cfg.block_k, None, d), lambda b, h, j: (b, j, h, 0))
    dk, dv = _call(cfg, _dkdv_kernel, "dkdv", dkdv_names, args,
                   {**_main_specs(cfg, False), **_row_specs(cfg, False)},
                   out_shape=(per_head_kv, per_head_kv), out_specs=(own_k, own_k),
                   name="t5x_like_flash_bwd_dkdv")

    qspecs = {**_main_specs(cfg, True), **_row_specs(cfg, True)}
    outs = {"dq": (jax.ShapeDtypeStruct((batch, cfg.lq_pad, heads, d), dq_dtype), qspecs["q"])}
    if cfg.has_rel:
        outs["dfar"] = (
            jax.ShapeDtypeStruct((batch, heads, cfg.nq, 2, cfg.block_q), jnp.float32),
            pl.BlockSpec((None, None, None, 2, cfg.block_q), lambda b, h, i: (b, h, i, 0, 0)))
        band = (cfg.block_q, gpu_inputs.near_window(cfg) * cfg.block_k)
        outs["dsband"] = (jax.ShapeDtypeStruct((batch, heads, cfg.nq, *band), k.dtype),
                          pl.BlockSpec((None, None, None, *band), lambda b, h, i: (b, h, i, 0, 0)))
    if cfg.has_bias:
        outs["dbias"] = (
            jax.ShapeDtypeStruct((batch, heads, cfg.lq_pad, cfg.lk_pad), jnp.float32),
            pl.BlockSpec((None, None, cfg.block_q, cfg.lk_pad), lambda b, h, i: (b, h, i, 0)))
    res = _call(cfg, functools.partial(_dq_kernel, outs=list(outs)), "dq", names, args, qspecs,
                out_shape=tuple(shape for shape, _ in outs.values()),
                out_specs=tuple(spec for _, spec in outs.values()), name="t5x_like_flash_bwd_dq")
    res = dict(zip(outs, res, strict=True))
    dtab = gpu_inputs.window_table_gradient(cfg, res["dsband"], res["dfar"]) if cfg.has_rel \
        else None
    return res["dq"], dk, dv, dtab, res.get("dbias")
