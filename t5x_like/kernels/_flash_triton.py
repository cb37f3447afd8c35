"""GPU (Pallas on Triton) flash-attention kernels: forward, dK/dV, and dQ (+ bias gradients).

Grid `(B, H, n_blocks)`; each program owns one q block (forward, dQ) or one k block (dK/dV) and
loops over the other axis with `fori_loop`, so skipped blocks are never loaded or computed:
causal programs stop at the diagonal (or at the end of the prefix), and with segment ids a
`cond` skips k/q blocks whose segment ranges do not overlap (packing, padding). The kv head of a
q head is chosen in the BlockSpec index map (`h // group`), so GQA/MQA never repeats k/v.

All array arguments are already padded by `flash_attention.py`: lengths to block multiples,
head_dim to a power of two, the bucket table to `[H, num_buckets_pad]`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from t5x_like.kernels import _flash_common as fc
from t5x_like.kernels._flash_common import FlashConfig, dot


def _compiler_params(cfg: FlashConfig):
    return plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


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
    if cfg.has_prefix:
        specs["pq"], specs["pk"] = q_row, k_row
        specs["plen"] = pl.BlockSpec((None,), lambda b, h, i: (b,))
    if cfg.has_rel:
        specs["tab"] = pl.BlockSpec((None, cfg.num_buckets_pad), lambda b, h, i: (h, 0))
    if cfg.has_bias:
        bb, bh = cfg.bias_batch > 1, cfg.bias_heads > 1
        if by_q_block:
            specs["bias"] = pl.BlockSpec(
                (None, None, bq, cfg.lk_pad),
                lambda b, h, i: (b if bb else 0, h if bh else 0, i, 0),
            )
        else:
            specs["bias"] = pl.BlockSpec(
                (None, None, cfg.lq_pad, bk),
                lambda b, h, j: (b if bb else 0, h if bh else 0, 0, j),
            )
    return specs


def _q_loop_state(cfg: FlashConfig, r: dict, q0):
    """Per-q-block quantities for kernels whose program owns a q block."""
    q_idx = q0 + jnp.arange(cfg.block_q, dtype=jnp.int32)
    qseg = r["qseg"][...] if cfg.has_seg else None
    pq = r["pq"][...] if cfg.has_prefix else None
    plen = r["plen"][...] if cfg.has_prefix else None
    tab = r["tab"][...].astype(jnp.float32) if cfg.has_rel else None
    hi = fc.causal_k_blocks(cfg, q0, plen) if cfg.causal else cfg.nk
    return q_idx, qseg, pq, tab, hi


def _k_block_inputs(cfg: FlashConfig, r: dict, j):
    k0 = j * cfg.block_k
    ks = pl.ds(k0, cfg.block_k)
    k_idx = k0 + jnp.arange(cfg.block_k, dtype=jnp.int32)
    kseg = r["kseg"][ks] if cfg.has_seg else None
    pk = r["pk"][ks] if cfg.has_prefix else None
    bias = r["bias"][:, ks] if cfg.has_bias else None
    return ks, k_idx, kseg, pk, bias


def _maybe_skip(cfg: FlashConfig, qseg, kseg, compute, carry):
    """Run `compute(carry)` unless segment ranges prove the tile fully masked."""
    if not cfg.has_seg:
        return compute(carry)
    overlap = fc.segments_overlap(fc.segment_range(qseg), fc.segment_range(kseg))
    return jax.lax.cond(overlap, compute, lambda c: c, carry)


def _fwd_kernel(*refs, cfg: FlashConfig, names: list[str]):
    r = dict(zip(names + ["o", "lse"], refs, strict=True))
    q0 = pl.program_id(2) * cfg.block_q
    q = r["q"][...]
    q_idx, qseg, pq, tab, hi = _q_loop_state(cfg, r, q0)

    def body(j, carry):
        ks, k_idx, kseg, pk, bias = _k_block_inputs(cfg, r, j)

        def compute(c):
            m, denom, acc = c
            k = r["k"][ks, :]
            v = r["v"][ks, :]
            s, _ = fc.logits_tile(cfg, dot(q, k, tb=True), q_idx, k_idx, qseg, kseg, pq, pk,
                                  tab, bias)
            m_new = jnp.maximum(m, jnp.max(s, axis=1))
            m_safe = jnp.where(m_new == fc.NEG_INF, 0.0, m_new)
            alpha = jnp.exp(m - m_safe)
            p = jnp.exp(s - m_safe[:, None])
            denom_new = denom * alpha + jnp.sum(p, axis=1)
            acc_new = acc * alpha[:, None] + dot(p.astype(v.dtype), v)
            return m_new, denom_new, acc_new

        return _maybe_skip(cfg, qseg, kseg, compute, carry)

    bq, d = cfg.block_q, cfg.head_dim_pad
    init = (
        jnp.full((bq,), fc.NEG_INF, jnp.float32),
        jnp.zeros((bq,), jnp.float32),
        jnp.zeros((bq, d), jnp.float32),
    )
    m, denom, acc = jax.lax.fori_loop(0, hi, body, init)
    empty = denom == 0.0  # fully-masked rows: output 0, lse 0 (finite: the backward stays finite)
    r["o"][...] = (acc / jnp.where(empty, 1.0, denom)[:, None]).astype(r["o"].dtype)
    r["lse"][...] = jnp.where(empty, 0.0, m + jnp.log(jnp.where(empty, 1.0, denom)))


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
    batch = q.shape[0]
    names = ["q", "k", "v"] + fc.side_names(cfg)
    specs = {**_main_specs(cfg, True), **_row_specs(cfg, True)}
    out_shape = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct((batch, cfg.num_heads, cfg.lq_pad), jnp.float32),
    )
    out_specs = (specs["q"], specs["lse"])
    args = {"q": q, "k": k, "v": v, **side}
    return pl.pallas_call(
        functools.partial(_fwd_kernel, cfg=cfg, names=names),
        out_shape=out_shape,
        grid=(batch, cfg.num_heads, cfg.nq),
        in_specs=[specs[n] for n in names],
        out_specs=out_specs,
        interpret=cfg.interpret,
        compiler_params=_compiler_params(cfg),
        name="t5x_like_flash_fwd",
    )(*[args[n] for n in names])


def _dkdv_kernel(*refs, cfg: FlashConfig, names: list[str]):
    r = dict(zip(names + ["dk", "dv"], refs, strict=True))
    k0 = pl.program_id(2) * cfg.block_k
    k = r["k"][...]
    v = r["v"][...]
    k_idx = k0 + jnp.arange(cfg.block_k, dtype=jnp.int32)
    kseg = r["kseg"][...] if cfg.has_seg else None
    pk = r["pk"][...] if cfg.has_prefix else None
    tab = r["tab"][...].astype(jnp.float32) if cfg.has_rel else None
    lo = fc.causal_first_q_block(cfg, k0, r["plen"][...] if cfg.has_prefix else None) \
        if cfg.causal else 0

    def body(i, carry):
        q0 = i * cfg.block_q
        qs = pl.ds(q0, cfg.block_q)
        q_idx = q0 + jnp.arange(cfg.block_q, dtype=jnp.int32)
        qseg = r["qseg"][qs] if cfg.has_seg else None
        pq = r["pq"][qs] if cfg.has_prefix else None
        bias = r["bias"][qs, :] if cfg.has_bias else None

        def compute(c):
            dk, dv = c
            q = r["q"][qs, :]
            do = r["do"][qs, :]
            s, _ = fc.logits_tile(cfg, dot(q, k, tb=True), q_idx, k_idx, qseg, kseg, pq, pk,
                                  tab, bias)
            p = jnp.exp(s - r["lse"][qs][:, None])
            dv = dv + dot(p.astype(do.dtype), do, ta=True)
            dp = dot(do, v, tb=True)
            ds = p * (dp - r["delta"][qs][:, None])
            dk = dk + dot(ds.astype(q.dtype), q, ta=True)
            return dk, dv

        return _maybe_skip(cfg, qseg, kseg, compute, carry)

    zeros = jnp.zeros((cfg.block_k, cfg.head_dim_pad), jnp.float32)
    dk, dv = jax.lax.fori_loop(lo, cfg.nq, body, (zeros, zeros))
    scale = cfg.sm_scale
    r["dk"][...] = (dk * scale if scale != 1.0 else dk).astype(r["dk"].dtype)
    r["dv"][...] = dv.astype(r["dv"].dtype)


def _dq_kernel(*refs, cfg: FlashConfig, names: list[str], outs: list[str]):
    r = dict(zip(names + outs, refs, strict=True))
    q0 = pl.program_id(2) * cfg.block_q
    q = r["q"][...]
    do = r["do"][...]
    lse = r["lse"][...]
    delta = r["delta"][...]
    q_idx, qseg, pq, tab, hi = _q_loop_state(cfg, r, q0)
    if cfg.has_bias:  # tiles we skip must still read as a zero gradient

        def zero(j, c):
            r["dbias"][:, pl.ds(j * cfg.block_k, cfg.block_k)] = jnp.zeros(
                (cfg.block_q, cfg.block_k), jnp.float32)
            return c

        jax.lax.fori_loop(0, cfg.nk, zero, 0)

    def body(j, carry):
        ks, k_idx, kseg, pk, bias = _k_block_inputs(cfg, r, j)

        def compute(c):
            dq, dtab = c
            k = r["k"][ks, :]
            v = r["v"][ks, :]
            s, bucket = fc.logits_tile(cfg, dot(q, k, tb=True), q_idx, k_idx, qseg, kseg, pq,
                                       pk, tab, bias)
            p = jnp.exp(s - lse[:, None])
            ds = p * (dot(do, v, tb=True) - delta[:, None])
            dq = dq + dot(ds.astype(k.dtype), k)
            if cfg.has_rel:
                dtab = dtab + fc.rel_grad_tile(cfg, bucket, ds)
            if cfg.has_bias:
                r["dbias"][:, ks] = ds
            return dq, dtab

        return _maybe_skip(cfg, qseg, kseg, compute, carry)

    init = (
        jnp.zeros((cfg.block_q, cfg.head_dim_pad), jnp.float32),
        jnp.zeros((cfg.num_buckets_pad,), jnp.float32),
    )
    dq, dtab = jax.lax.fori_loop(0, hi, body, init)
    r["dq"][...] = (dq * cfg.sm_scale if cfg.sm_scale != 1.0 else dq).astype(r["dq"].dtype)
    if cfg.has_rel:
        r["dtab"][...] = dtab


def backward(cfg: FlashConfig, q, k, v, side: dict, o, lse, do):
    """Returns (dq [B,Lq_pad,H,Dp] f32, dk/dv per q head [B,Lk_pad,H,Dp] f32,
    dtab partials [B,H,nq,NBp] f32 | None, dbias [B,H,Lq_pad,Lk_pad] f32 | None)."""
    batch, heads, d = q.shape[0], cfg.num_heads, cfg.head_dim_pad
    delta = jnp.einsum("blhd,blhd->bhl", o.astype(jnp.float32), do.astype(jnp.float32))
    args = {"q": q, "k": k, "v": v, "do": do, "lse": lse, "delta": delta, **side}
    names = ["q", "k", "v", "do", "lse", "delta"] + fc.side_names(cfg)

    kspecs = {**_main_specs(cfg, False), **_row_specs(cfg, False)}
    per_head_kv = jax.ShapeDtypeStruct((batch, cfg.lk_pad, heads, d), jnp.float32)
    own_k = pl.BlockSpec((None, cfg.block_k, None, d), lambda b, h, j: (b, j, h, 0))
    dk, dv = pl.pallas_call(
        functools.partial(_dkdv_kernel, cfg=cfg, names=names),
        out_shape=(per_head_kv, per_head_kv),
        grid=(batch, heads, cfg.nk),
        in_specs=[kspecs[n] for n in names],
        out_specs=(own_k, own_k),
        interpret=cfg.interpret,
        compiler_params=_compiler_params(cfg),
        name="t5x_like_flash_bwd_dkdv",
    )(*[args[n] for n in names])

    qspecs = {**_main_specs(cfg, True), **_row_specs(cfg, True)}
    outs = ["dq"]
    out_shape = [jax.ShapeDtypeStruct((batch, cfg.lq_pad, heads, d), jnp.float32)]
    out_specs = [qspecs["q"]]
    if cfg.has_rel:
        outs.append("dtab")
        out_shape.append(
            jax.ShapeDtypeStruct((batch, heads, cfg.nq, cfg.num_buckets_pad), jnp.float32))
        out_specs.append(
            pl.BlockSpec((None, None, None, cfg.num_buckets_pad), lambda b, h, i: (b, h, i, 0)))
    if cfg.has_bias:
        outs.append("dbias")
        out_shape.append(
            jax.ShapeDtypeStruct((batch, heads, cfg.lq_pad, cfg.lk_pad), jnp.float32))
        out_specs.append(
            pl.BlockSpec((None, None, cfg.block_q, cfg.lk_pad), lambda b, h, i: (b, h, i, 0)))
    res = pl.pallas_call(
        functools.partial(_dq_kernel, cfg=cfg, names=names, outs=outs),
        out_shape=tuple(out_shape),
        grid=(batch, heads, cfg.nq),
        in_specs=[qspecs[n] for n in names],
        out_specs=tuple(out_specs),
        interpret=cfg.interpret,
        compiler_params=_compiler_params(cfg),
        name="t5x_like_flash_bwd_dq",
    )(*[args[n] for n in names])
    res = dict(zip(outs, res, strict=True))
    return res["dq"], dk, dv, res.get("dtab"), res.get("dbias")
