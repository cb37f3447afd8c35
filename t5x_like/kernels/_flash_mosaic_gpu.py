"""Hopper (sm_90a) flash-attention forward in Pallas on Mosaic GPU: warp-specialised, TMA + wgmma.

One CTA per (head, q block of `block_q` = 128 rows, batch), three warpgroups:

- two **compute** warpgroups, each owning 64 query rows (one wgmma M);
- one **producer** warpgroup that streams each k block's tiles with TMA into a ring of
  `num_stages` shared-memory slots: K and V `[block_k, D]`, the T5 bias tile `[128, block_k]`
  f32 (a slice of the bias bands `_flash_triton._rel_bands` builds: no bucket math in the loop),
  and the keys' segment ids and prefix flags `[block_k]`.

Every stream has a "ready" barrier per slot (its TMA completes it); both compute warpgroups
arrive on the slot's "free" barrier after their P·V, and the producer waits on it before it
refills the slot. Both compute warpgroups walk the same k blocks (the CTA's range: causal,
prefix and segment bounds are computed per 128-row block), so every barrier phase is waited
on by every warpgroup that uses it. Per k block, in base 2 with the scale folded in:

    s  = q kᵀ · (scale · log2 e) + bias · log2 e, masked to -inf        [64, block_k] f32
    m' = max(m, rowmax s);  p = 2^(s - m');  l = l · 2^(m - m') + rowsum p
    acc = acc · 2^(m - m') + p v                                      [64, D] f32

and at the end o = acc / l, lse = (m + log2 l) · ln 2 (rows with no allowed key: o = 0,
lse = 0, as the Triton kernel). The backward is the Triton one (`_flash_triton.backward`),
which takes the same residuals.

**Interpret mode** (the CPU tests) runs this kernel under Pallas' GPU interpreter, which
simulates the warpgroups, shared memory, TMA and barriers (and checks that every barrier phase
is observed) but lacks three things the compiled kernel uses. `_Ops` swaps each for an
equivalent that moves data differently and computes the same: kᵀ comes from a transposed copy
of k in HBM instead of a transposed view of the K slot; p goes through shared memory instead of
registers (there a wgmma operand must be a ref); layouts are not cast.
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

from t5x_like.kernels import _flash_triton
from t5x_like.kernels._flash_common import NEG_INF, FlashConfig

ROWS = 64  # query rows per compute warpgroup: one wgmma M
COMPUTE_WGS = 2
BLOCK_Q = ROWS * COMPUTE_WGS
HEAD_DIMS = (64, 128)
BLOCK_KS = (64, 128)
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
SMEM_LIMIT = 232_448  # bytes of shared memory a block may opt into on sm_90
SMEM_SLACK = 8_192  # what Mosaic adds to `smem_bytes`: barriers, alignment (2.6-3.7 KB seen)


def smem_bytes(cfg: FlashConfig) -> int:
    """Shared memory of one CTA (the compiled kernel's buffers, `_scratch`; barriers aside): q/o
    tiles, and per ring slot the streamed K, V, bias and key-side tiles."""
    d, bk, itemsize = cfg.head_dim_pad, cfg.block_k, 2
    own = BLOCK_Q * (d * itemsize + 4 + 4 * cfg.has_seg + 4 * cfg.has_prefix)  # q/o, lse, ids
    slot = 2 * bk * d * itemsize + bk * (4 * cfg.has_seg + 4 * cfg.has_prefix)
    slot += BLOCK_Q * bk * 4 * cfg.has_rel
    return own + cfg.num_stages * slot


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


@dataclasses.dataclass(frozen=True)
class _Ops:
    """The operations that differ between the compiled kernel and Pallas' GPU interpreter."""

    interpret: bool

    def layout(self, x: jax.Array, layout) -> jax.Array:
        return x if self.interpret else plgpu.layout_cast(x, layout)

    def load(self, ref, layout) -> jax.Array:
        return ref[...] if self.interpret else plgpu.load(ref, (), layout=layout)

    def iota(self, shape: tuple[int, int], dim: int) -> jax.Array:
        if self.interpret:
            return lax.broadcasted_iota(jnp.int32, shape, dim)
        return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=plgpu.Layout.WGMMA)

    def k_operand(self, k_slot):
        """kᵀ [D, block_k] for q kᵀ: the interpreter's K slot already holds kᵀ."""
        return k_slot if self.interpret else plgpu.transpose_ref(k_slot, (1, 0))

    def scores(self, q_smem, k_slot, block_k: int) -> jax.Array:
        """q kᵀ [64, block_k] f32."""

        def run(acc):
            plgpu.wgmma(acc, q_smem, self.k_operand(k_slot))
            return acc[...]

        return pl.run_scoped(run, plgpu.ACC((ROWS, block_k), jnp.float32))

    def add_pv(self, acc: jax.Array, p: jax.Array, v_slot, p_smem) -> jax.Array:
        """acc + p v, p [64, block_k] in v's dtype, v [block_k, D]."""
        if not self.interpret:  # accumulate in place, p from registers
            return pl.run_state(lambda ref: plgpu.wgmma(ref, p, v_slot))(plgpu.ACC.init(acc))
        p_smem[...] = p

        def run(ref):
            plgpu.wgmma(ref, p_smem, v_slot)
            return ref[...]

        return acc + pl.run_scoped(run, plgpu.ACC(acc.shape, jnp.float32))


def _causal_end(cfg: FlashConfig, r: dict, b, q0, rows: int) -> jax.Array:
    """One past the last k block that query rows [q0, q0 + rows) can see under a causal mask:
    the diagonal's block, or the prefix's last when the rows start inside the prefix."""
    hi = (q0 + rows - 1) // cfg.block_k + 1
    if cfg.has_prefix:
        plen = r["plen"][b]
        hi = jnp.where(q0 < plen, jnp.maximum(hi, (plen + cfg.block_k - 1) // cfg.block_k), hi)
    return jnp.minimum(hi, cfg.nk)


def _k_range(cfg: FlashConfig, r: dict, b, i) -> tuple[jax.Array, jax.Array]:
    """[lo, hi) k blocks the CTA of q block i streams: up to the diagonal (or the prefix's end)
    when causal, within the blocks sharing a segment with it (`_segment_block_ranges`)."""
    lo, hi = jnp.int32(0), jnp.int32(cfg.nk)
    if cfg.causal:
        hi = _causal_end(cfg, r, b, i * cfg.block_q, cfg.block_q)
    if cfg.has_seg:
        lo, hi = r["klo"][b, i], jnp.minimum(hi, r["khi"][b, i])
    return lo, jnp.maximum(hi, lo)


def _streams(cfg: FlashConfig) -> list[str]:
    """The per-k-block tiles the producer streams, in issue order."""
    return (["k", "v"] + (["rel"] if cfg.has_rel else []) + (["kseg"] if cfg.has_seg else [])
            + (["pk"] if cfg.has_prefix else []))


def _scratch(cfg: FlashConfig, dtype, ops: _Ops) -> tuple[dict, dict]:
    """Shared-memory buffers and barriers of one CTA."""
    s, bk, d = cfg.num_stages, cfg.block_k, cfg.head_dim_pad
    tiled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    smem = {
        "q": plgpu.SMEM((COMPUTE_WGS, ROWS, d), dtype, transforms=tiled),  # then o
        "k": plgpu.SMEM((s, d, bk) if ops.interpret else (s, bk, d), dtype, transforms=tiled),
        "v": plgpu.SMEM((s, bk, d), dtype, transforms=tiled),
        "lse": plgpu.SMEM((COMPUTE_WGS, ROWS), jnp.float32),
    }
    if cfg.has_rel:
        smem["rel"] = plgpu.SMEM((s, BLOCK_Q, bk), jnp.float32, transforms=(
            plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128)))
    if cfg.has_seg:
        smem["qseg"] = plgpu.SMEM((COMPUTE_WGS, ROWS), jnp.int32)
        smem["kseg"] = plgpu.SMEM((s, bk), jnp.int32)
    if cfg.has_prefix:
        smem["pq"] = plgpu.SMEM((COMPUTE_WGS, ROWS), jnp.int32)
        smem["pk"] = plgpu.SMEM((s, bk), jnp.int32)
    if ops.interpret:
        smem["p"] = plgpu.SMEM((COMPUTE_WGS, ROWS, bk), dtype)
    own = ["q"] + (["qseg"] if cfg.has_seg else []) + (["pq"] if cfg.has_prefix else [])
    barriers = {f"own_{n}": plgpu.Barrier(num_barriers=COMPUTE_WGS) for n in own}
    barriers.update({n: plgpu.Barrier(num_barriers=s) for n in _streams(cfg)})
    barriers["free"] = plgpu.Barrier(num_arrivals=COMPUTE_WGS, num_barriers=s)
    return smem, barriers


def _producer(cfg: FlashConfig, r: dict, smem: dict, bars: dict, b, h, i, lo, hi, ops: _Ops):
    """Streams k blocks [lo, hi) into the slots, each once both compute warpgroups freed it."""
    if not ops.interpret:
        plgpu.set_max_registers(40, action="decrease")
    s, bk = cfg.num_stages, cfg.block_k
    hk = lax.div(h, jnp.int32(cfg.group))

    @pl.loop(lo, hi)
    def _(j):
        n = j - lo
        slot = lax.rem(n, jnp.int32(s))

        @pl.when(n >= s)
        def _():
            plgpu.barrier_wait(bars["free"].at[slot])

        k0 = j * bk
        ks = pl.ds(k0, bk)
        src = {"v": r["v"].at[b, ks, hk]}
        src["k"] = r["kt"].at[b, hk, :, ks] if ops.interpret else r["k"].at[b, ks, hk]
        if cfg.has_rel:  # the band's columns for offsets k - q of this tile
            src["rel"] = r["relband"].at[h, :, pl.ds(k0 - i * cfg.block_q + cfg.lq_pad, bk)]
        if cfg.has_seg:
            src["kseg"] = r["kseg"].at[b, ks]
        if cfg.has_prefix:
            src["pk"] = r["pk"].at[b, ks]
        for name in _streams(cfg):
            plgpu.copy_gmem_to_smem(src[name], smem[name].at[slot], bars[name].at[slot])

    for slot in range(s):  # wait for the last use of each slot (every phase is observed)
        pl.when(hi - lo > slot)(functools.partial(plgpu.barrier_wait, bars["free"].at[slot]))


def _consumer(cfg: FlashConfig, r: dict, smem: dict, bars: dict, b, h, i, lo, hi, wg, ops: _Ops):
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
    for name, src in own.items():
        plgpu.copy_gmem_to_smem(src, smem[name].at[wg], bars[f"own_{name}"].at[wg])
    for name in own:
        plgpu.barrier_wait(bars[f"own_{name}"].at[wg])
    row_layout, col_layout = plgpu.Layout.WGMMA.reduce(1), plgpu.Layout.WGMMA.reduce(0)
    shape = (ROWS, bk)
    rows_of = lambda x: lax.broadcast_in_dim(x, shape, [0])  # noqa: E731
    cols_of = lambda x: lax.broadcast_in_dim(x, shape, [1])  # noqa: E731
    q_idx = ops.iota(shape, 0) + q0 if cfg.causal else None
    qseg = rows_of(ops.load(smem["qseg"].at[wg], row_layout)) if cfg.has_seg else None
    pq = rows_of(ops.load(smem["pq"].at[wg], row_layout)) if cfg.has_prefix else None
    q_smem = smem["q"].at[wg]
    scale = cfg.sm_scale * LOG2E

    def step(j, carry):
        m, denom, acc = carry
        slot = lax.rem(j - lo, jnp.int32(s))
        for name in _streams(cfg):
            if name != "v":
                plgpu.barrier_wait(bars[name].at[slot])
        x = ops.scores(q_smem, smem["k"].at[slot], bk) * scale
        if cfg.has_rel:
            x = x + ops.load(smem["rel"].at[slot, pl.ds(wg * ROWS, ROWS)],
                             plgpu.Layout.WGMMA) * LOG2E
        allowed = None
        if cfg.has_seg:
            kseg = cols_of(ops.load(smem["kseg"].at[slot], col_layout))
            allowed = (qseg == kseg) & (qseg != 0)
        if cfg.causal or cfg.kv_pad_mask:
            k_idx = ops.iota(shape, 1) + j * bk
        if cfg.causal:
            visible = k_idx <= q_idx
            if cfg.has_prefix:
                pk = cols_of(ops.load(smem["pk"].at[slot], col_layout))
                visible = visible | ((pq != 0) & (pk != 0))
            allowed = visible if allowed is None else allowed & visible
        if cfg.kv_pad_mask:
            allowed = (k_idx < cfg.lk) if allowed is None else allowed & (k_idx < cfg.lk)
        if allowed is not None:
            x = jnp.where(allowed, x, NEG_INF)
        m_new = jnp.maximum(m, x.max(axis=1))
        m_use = jnp.where(m_new == NEG_INF, 0.0, m_new)  # rows with no allowed key yet
        alpha = jnp.exp2(m - m_use)
        p = jnp.exp2(x - rows_of(m_use))
        denom = denom * alpha + p.sum(axis=1)
        acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
        plgpu.barrier_wait(bars["v"].at[slot])
        acc = ops.add_pv(acc, p.astype(dtype), smem["v"].at[slot],
                         smem["p"].at[wg] if ops.interpret else None)
        plgpu.barrier_arrive(bars["free"].at[slot])
        return m_new, denom, acc

    def drain(j, carry):  # a block this warpgroup's rows cannot see: release it unread
        slot = lax.rem(j - lo, jnp.int32(s))
        for name in _streams(cfg):
            plgpu.barrier_wait(bars[name].at[slot])
        plgpu.barrier_arrive(bars["free"].at[slot])
        return carry

    init = (ops.layout(jnp.full((ROWS,), NEG_INF, jnp.float32), row_layout),
            ops.layout(jnp.zeros((ROWS,), jnp.float32), row_layout),
            ops.layout(jnp.zeros((ROWS, d), jnp.float32), plgpu.Layout.WGMMA))
    # Causal: the first warpgroup's rows end a block earlier than the CTA's (block_k = 64).
    own_hi = jnp.clip(_causal_end(cfg, r, b, q0, ROWS), lo, hi) if cfg.causal else hi
    m, denom, acc = lax.fori_loop(lo, own_hi, step, init)
    lax.fori_loop(own_hi, hi, drain, 0)
    empty = denom == 0.0
    denom = jnp.where(empty, 1.0, denom)
    q_smem[...] = (acc * lax.broadcast_in_dim(1.0 / denom, acc.shape, [0])).astype(dtype)
    smem["lse"].at[wg][...] = jnp.where(empty, 0.0, (m + jnp.log2(denom)) * LN2)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(q_smem, r["o"].at[b, rows, h])
    plgpu.copy_smem_to_gmem(smem["lse"].at[wg], r["lse"].at[b, h, rows])
    plgpu.wait_smem_to_gmem(0)


def _kernel(*refs, cfg: FlashConfig, names: list[str], ops: _Ops):
    r = dict(zip(names + ["o", "lse"], refs, strict=True))
    b, h, i = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("q")
    lo, hi = _k_range(cfg, r, b, i)

    def body(smem, bars):
        wg = lax.axis_index("wg")
        pl.when(wg < COMPUTE_WGS)(
            lambda: _consumer(cfg, r, smem, bars, b, h, i, lo, hi, wg, ops))
        pl.when(wg == COMPUTE_WGS)(lambda: _producer(cfg, r, smem, bars, b, h, i, lo, hi, ops))

    pl.run_scoped(body, *_scratch(cfg, r["q"].dtype, ops), collective_axes="wg")


def forward(cfg: FlashConfig, q, k, v, side: dict) -> tuple[jax.Array, jax.Array]:
    """o [B, Lq_pad, H, Dp] (q.dtype), lse [B, H, Lq_pad] f32, as `_flash_triton.forward`."""
    reason = unsupported(cfg, q.dtype)
    if reason:
        raise ValueError(f"backend 'mosaic_gpu' cannot run this call: {reason}")
    ops = _Ops(cfg.interpret)
    args = {"q": q, "v": v}
    if ops.interpret:
        args["kt"] = jnp.transpose(k, (0, 2, 3, 1))  # [B, Hkv, D, Lk]
    else:
        args["k"] = k
    if cfg.has_rel:
        args["relband"] = _flash_triton._rel_bands(cfg, side["tab"])[0]
    if cfg.has_seg:
        args.update(qseg=side["qseg"], kseg=side["kseg"])
        bounds = _flash_triton._segment_block_ranges(cfg, side["qseg"], side["kseg"])
        args.update(klo=bounds["klo"], khi=bounds["khi"])
    if cfg.has_prefix:
        args.update(pq=side["pq"], pk=side["pk"], plen=side["plen"])
    names = list(args)
    batch = q.shape[0]
    params = {}
    if ops.interpret:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

        params["interpret"] = InterpretGPUParams()
    else:
        params["compiler_params"] = plgpu.CompilerParams(approx_math=True)
    call = plgpu.kernel(
        functools.partial(_kernel, cfg=cfg, names=names, ops=ops),
        out_type=(jax.ShapeDtypeStruct(q.shape, q.dtype),
                  jax.ShapeDtypeStruct((batch, cfg.num_heads, cfg.lq_pad), jnp.float32)),
        grid=(cfg.num_heads, cfg.nq, batch), grid_names=("h", "q", "b"),
        num_threads=COMPUTE_WGS + 1, thread_name="wg", kernel_name="t5x_like_flash_fwd_hopper",
        **params)
    return call(*args.values())


def backward(cfg: FlashConfig, q, k, v, side: dict, o, lse, do):
    """The Triton backward (same residuals): see `_flash_triton.backward`."""
    return _flash_triton.backward(cfg, q, k, v, side, o, lse, do)
