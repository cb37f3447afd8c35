"""TPU (Pallas Mosaic) flash-attention kernels: forward, dK/dV, dQ (+ bias gradients).

TPU style: the reduction axis is the innermost, sequential ("arbitrary") grid axis, the running
softmax state / gradient accumulators live in VMEM scratch, and the pipeline DMAs one
`[block, head_dim]` tile per step. Fully-masked tiles are skipped with `pl.when`; for plain causal
masks the index map also clamps the streamed block index to the last needed block, so skipped
steps re-use the resident tile instead of fetching a new one. Arrays are head-major
`[B, H, L, D]` (Mosaic tiles the last two dims); segment ids / prefix flags are passed as
`[B, L, 1]` columns for q and `[B, 1, L]` rows for k so their blocks are layout-legal.

The f32 per-row residuals (logsumexp, delta) are lane-major rows `[B, H, 1, Lq]` with `(1, bq)`
blocks: a `[B, H, Lq, 1]` column would be padded to 128 lanes in HBM (128x the bytes). Kernels
transpose the row to a `[bq, 1]` column once per tile. Every `pallas_call` carries a
`cost_estimate` (so XLA's cost analysis and scheduler see the kernel's work) and, on a TPU, a
`vmem_limit_bytes` from the blocks' VMEM footprint (`vmem_footprint`) and the chip's VMEM.

Numerics are checked in TPU interpret mode on CPU; the kernels compile with libtpu (deviceless)
for v4, v5e, v5p and v6e (`scripts/compile_tpu_kernels.py`); not yet run on a real TPU.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from t5x_like.kernels import _flash_common as common
from t5x_like.kernels._flash_common import FlashConfig, dot

MIB = 2**20
# Per TPU generation: (default scoped VMEM a kernel gets without vmem_limit_bytes, MXU width).
_CHIPS = {"v4": (16 * MIB, 128), "v5e": (16 * MIB, 128), "v5p": (16 * MIB, 128),
          "v6e": (32 * MIB, 256)}


def default_blocks(arch: str, head_dim: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """((block_q, block_k) forward, (block_q, block_k) backward) for a TPU generation.

    `arch`: 'v4', 'v5e', 'v5p', 'v6e' (unknown: v5e's). Blocks are multiples of the MXU width
    (128 up to v5, 256 on v6e) that fit the default scoped VMEM (16 MiB, 32 MiB on v6e) in
    every variant at head_dim 64 and 128, as libtpu compiled them
    (benchmarks/flash_tpu_compile.md); larger blocks compile with a raised `vmem_limit_bytes`.
    Not timed on a TPU: no speed claim.
    """
    mxu = _CHIPS.get(arch, _CHIPS["v5e"])[1]
    if head_dim > 128:
        return (mxu, mxu), (mxu, mxu)
    return (2 * mxu, mxu), (mxu, mxu)


def _tile_bytes(shape: tuple[int, ...], itemsize: int) -> int:
    """VMEM bytes of a block: the last two dims padded to the (8 * packing, 128) tile."""
    *lead, rows, cols = (1, *shape) if len(shape) == 1 else shape
    sub = 8 * max(1, 4 // itemsize)
    rows, cols = -(-rows // sub) * sub, -(-cols // 128) * 128
    return math.prod(lead) * rows * cols * itemsize


def vmem_footprint(blocks: list[tuple[tuple[int, ...], int]],
                   scratch: list[tuple[tuple[int, ...], int]], bq: int, bk: int) -> int:
    """Bytes of VMEM a kernel needs: double-buffered in/out blocks `(shape, itemsize)`, scratch,
    and ~6 live f32 `[bq, bk]` tile temporaries (scores, probabilities, dS, mask, bias)."""
    return (2 * sum(_tile_bytes(sh, n) for sh, n in blocks)
            + sum(_tile_bytes(sh, n) for sh, n in scratch) + 6 * _tile_bytes((bq, bk), 4))


def _chip() -> tuple[str, int] | None:
    """(generation, VMEM bytes per core) of the TPU being compiled for, or None (not a TPU)."""
    try:
        info = pltpu.get_tpu_info()
    except (ValueError, RuntimeError, AttributeError):
        return None
    return str(info.chip_version), info.vmem_capacity_bytes


def vmem_limit(footprint: int, chip: tuple[str, int] | None) -> int | None:
    """`vmem_limit_bytes` for a kernel: the footprint plus 25% and 2 MiB headroom, never below
    the chip's default scoped VMEM, and above that never more than 3/4 of its VMEM (the
    compiler keeps the rest for its own buffers)."""
    if chip is None:
        return None
    arch, capacity = chip
    default = _CHIPS.get(arch, (16 * MIB, 128))[0]
    need = -(-(footprint * 5 // 4 + 2 * MIB) // MIB) * MIB
    return max(default, min(need, capacity * 3 // 4))


def _call(cfg: FlashConfig, kernel, names: list[str], args: dict, specs: dict, *, matmuls: int,
          scratch: list[tuple[int, ...]], out_shape: tuple, out_specs: tuple, **kwargs):
    """`pallas_call` of `kernel` on `args[n] for n in names`, grid (b, h, outer, inner).

    `scratch`: shapes of its f32 VMEM scratch; with the in/out blocks (SMEM scalars excluded)
    they size the VMEM limit on a TPU. `matmuls` per tile entry for the cost estimate.
    """
    pairs = [(specs[n], args[n].dtype) for n in names] + [
        (spec, shape.dtype) for spec, shape in zip(out_specs, out_shape, strict=True)]
    blocks = [(tuple(x for x in spec.block_shape if x is not None), dtype.itemsize)
              for spec, dtype in pairs if spec.block_shape is not None]
    footprint = vmem_footprint(blocks, [(shape, 4) for shape in scratch], cfg.block_q, cfg.block_k)
    limit = None if cfg.interpret else vmem_limit(footprint, _chip())
    params = pltpu.CompilerParams(
        dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
        vmem_limit_bytes=limit)
    return pl.pallas_call(
        functools.partial(kernel, cfg=cfg, names=names), compiler_params=params,
        interpret=pltpu.InterpretParams() if cfg.interpret else False,
        cost_estimate=_cost(cfg, args["q"].shape[0], matmuls, [*args.values(), *out_shape]),
        out_shape=out_shape, in_specs=[specs[n] for n in names], out_specs=out_specs,
        scratch_shapes=[pltpu.VMEM(shape, jnp.float32) for shape in scratch], **kwargs,
    )(*[args[n] for n in names])


def visited_fraction(cfg: FlashConfig) -> float:
    """Share of the (q block, k block) tiles a kernel computes: 1, or under a plain causal mask
    only the tiles on or below the diagonal (prefix / segment skipping is data-dependent)."""
    return 1.0 if cfg.has_prefix else common.visited_tiles(cfg) / (cfg.nq * cfg.nk)


def _cost(cfg: FlashConfig, batch: int, matmuls: int, arrays: list) -> pl.CostEstimate:
    """XLA cost of a kernel: `matmuls` [bq, bk, D] products and one exponential per visited tile
    entry; bytes = the arrays it reads and writes once."""
    pairs = batch * cfg.num_heads * cfg.lq_pad * cfg.lk_pad * visited_fraction(cfg)
    nbytes = sum(int(x.size) * x.dtype.itemsize for x in arrays)
    return pl.CostEstimate(flops=int(2 * matmuls * pairs * cfg.head_dim_pad),
                           transcendentals=int(pairs), bytes_accessed=nbytes)


def _side_arrays(cfg: FlashConfig, side: dict) -> dict:
    """Side inputs in block-legal layouts (in `side_names` order): q-side ids / flags as
    `[B, Lq, 1]` columns, k-side ones as `[B, 1, Lk]` rows, the table as `[H, 1, NBp]`."""
    cols, rows = ("qseg", "pq"), ("kseg", "pk", "tab")
    return {n: side[n][:, :, None] if n in cols else side[n][:, None, :] if n in rows else side[n]
            for n in common.side_names(cfg)}


def _specs(cfg: FlashConfig, q_outer: bool) -> dict[str, pl.BlockSpec]:
    """BlockSpecs on grid (b, h, outer, inner); `q_outer` = q blocks on axis 2, k on axis 3."""
    bq, bk, d, g = cfg.block_q, cfg.block_k, cfg.head_dim_pad, cfg.group

    def block(a, c, which: int):  # q (0) or k (1) block of grid point (., ., a, c), clamped
        i, j = (a, c) if q_outer else (c, a)  # to the last needed one for plain causal masks
        if cfg.causal and not cfg.has_prefix:
            if q_outer:
                j = jnp.minimum(j, (i * bq + bq - 1) // bk)
            else:
                i = jnp.maximum(i, (j * bk) // bq)
        return (i, j)[which]

    specs = {
        "q": pl.BlockSpec((None, None, bq, d), lambda b, h, a, c: (b, h, block(a, c, 0), 0)),
        "k": pl.BlockSpec((None, None, bk, d), lambda b, h, a, c: (b, h // g, block(a, c, 1), 0)),
        "lse": pl.BlockSpec((None, None, 1, bq), lambda b, h, a, c: (b, h, 0, block(a, c, 0))),
        "qcol": pl.BlockSpec((None, bq, 1), lambda b, h, a, c: (b, block(a, c, 0), 0)),
        "krow": pl.BlockSpec((None, 1, bk), lambda b, h, a, c: (b, 0, block(a, c, 1))),
        "smem": pl.BlockSpec(memory_space=pltpu.SMEM),
        "tab": pl.BlockSpec((None, 1, cfg.num_buckets_pad), lambda b, h, a, c: (h, 0, 0)),
    }
    bb, bh = cfg.bias_batch > 1, cfg.bias_heads > 1
    specs["bias"] = pl.BlockSpec((None, None, bq, bk), lambda b, h, a, c: (
        b if bb else 0, h if bh else 0, block(a, c, 0), block(a, c, 1)))
    specs.update(v=specs["k"], do=specs["q"], delta=specs["lse"], qseg=specs["qcol"],
                 pq=specs["qcol"], kseg=specs["krow"], pk=specs["krow"], plen=specs["smem"])
    return specs


def _segment_range(seg: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(min nonzero, max) id of a segment-id block ([bq, 1] column or [1, bk] row), reduced
    over the whole 2-D block: a reduction of a sliced 1-D vector lowers to a sublane gather,
    which TPU v4 does not support. An all-padding block gives (big, 0)."""
    big = jnp.iinfo(jnp.int32).max
    return jnp.min(jnp.where(seg == 0, big, seg)), jnp.max(seg)


def _kernel_setup(cfg: FlashConfig, refs, names: list[str], q_outer: bool, init: dict):
    """The start of every kernel: refs by name, the step's q block i and k block j (`q_outer`: i
    on grid axis 2 and j on the inner axis 3, else swapped), the scratch `init` {name: value} set
    on the first inner step, the tile's index vectors and side inputs, and 'tile has work'."""
    r = dict(zip(names, refs, strict=True))
    outer, inner = pl.program_id(2), pl.program_id(3)
    i, j = (outer, inner) if q_outer else (inner, outer)

    @pl.when(inner == 0)
    def _init():
        for name, value in init.items():
            r[name][...] = jnp.full(r[name].shape, value, jnp.float32)

    b = pl.program_id(0)
    q0, k0 = i * cfg.block_q, j * cfg.block_k
    q_idx = q0 + jnp.arange(cfg.block_q, dtype=jnp.int32)
    k_idx = k0 + jnp.arange(cfg.block_k, dtype=jnp.int32)
    qseg = r["qseg"][:, 0] if cfg.has_seg else None
    kseg = r["kseg"][0, :] if cfg.has_seg else None
    pq = r["pq"][:, 0] if cfg.has_prefix else None
    pk = r["pk"][0, :] if cfg.has_prefix else None
    plen = r["plen"][b] if cfg.has_prefix else None
    tab = r["tab"][0, :].astype(jnp.float32) if cfg.has_rel else None
    bias = r["bias"][...] if cfg.has_bias else None
    needed = jnp.bool_(True)
    if cfg.causal:
        needed = j < common.causal_k_blocks(cfg, q0, plen)
    if cfg.has_seg:
        needed &= common.segments_overlap(_segment_range(r["qseg"][...]),
                                      _segment_range(r["kseg"][...]))
    return r, i, j, (q_idx, k_idx, qseg, kseg, pq, pk, tab, bias), needed


def _fwd_kernel(*refs, cfg: FlashConfig, names: list[str]):
    r, _, j, tile, needed = _kernel_setup(cfg, refs, names + ["o", "lse", "m", "l", "acc"], True,
                                          {"m": common.NEG_INF, "l": 0.0, "acc": 0.0})

    @pl.when(needed)
    def _compute():
        q, k, v = r["q"][...], r["k"][...], r["v"][...]
        s, _ = common.logits_tile(cfg, dot(q, k, tb=True), *tile)
        m = r["m"][:, 0]
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        m_safe = jnp.where(m_new == common.NEG_INF, 0.0, m_new)
        alpha = jnp.exp(m - m_safe)
        p = jnp.exp(s - m_safe[:, None])
        r["l"][...] = (r["l"][:, 0] * alpha + jnp.sum(p, axis=1))[:, None]
        r["acc"][...] = r["acc"][...] * alpha[:, None] + dot(p.astype(v.dtype), v)
        r["m"][...] = m_new[:, None]

    @pl.when(j == cfg.nk - 1)
    def _finish():
        denom, m = r["l"][...], r["m"][...]
        empty = denom == 0.0
        r["o"][...] = (r["acc"][...] / jnp.where(empty, 1.0, denom)).astype(r["o"].dtype)
        lse = jnp.where(empty, 0.0, m + jnp.log(jnp.where(empty, 1.0, denom)))  # [bq, 1]
        r["lse"][...] = jnp.transpose(lse)  # lane-major row [1, bq]


def _column(ref) -> jax.Array:
    """A `[1, bq]` row block (logsumexp / delta) as the `[bq, 1]` column the tile math needs."""
    return jnp.transpose(ref[...])


def _to_head_major(x: jax.Array) -> jax.Array:
    return jnp.transpose(x, (0, 2, 1, 3))


def forward(cfg: FlashConfig, q, k, v, side: dict) -> tuple[jax.Array, jax.Array]:
    """o [B, Lq_pad, H, Dp] (q.dtype), lse [B, H, 1, Lq_pad] f32 (lane-major rows)."""
    batch, heads, bq, d = q.shape[0], cfg.num_heads, cfg.block_q, cfg.head_dim_pad
    args = {"q": _to_head_major(q), "k": _to_head_major(k), "v": _to_head_major(v),
            **_side_arrays(cfg, side)}
    specs = _specs(cfg, q_outer=True)
    o, lse = _call(
        cfg, _fwd_kernel, ["q", "k", "v"] + common.side_names(cfg), args, specs, matmuls=2,
        scratch=[(bq, 1), (bq, 1), (bq, d)], grid=(batch, heads, cfg.nq, cfg.nk),
        out_shape=(jax.ShapeDtypeStruct(args["q"].shape, q.dtype),
                   jax.ShapeDtypeStruct((batch, heads, 1, cfg.lq_pad), jnp.float32)),
        out_specs=(specs["q"], specs["lse"]), name="t5x_like_flash_fwd_tpu")
    return _to_head_major(o), lse


def _dkdv_kernel(*refs, cfg: FlashConfig, names: list[str]):
    r, i, _, tile, needed = _kernel_setup(cfg, refs, names + ["dk", "dv", "dk_acc", "dv_acc"],
                                          False, {"dk_acc": 0.0, "dv_acc": 0.0})

    @pl.when(needed)
    def _compute():
        q, k, v, do = r["q"][...], r["k"][...], r["v"][...], r["do"][...]
        s, _ = common.logits_tile(cfg, dot(q, k, tb=True), *tile)
        p = jnp.exp(s - _column(r["lse"]))
        r["dv_acc"][...] += dot(p.astype(do.dtype), do, ta=True)
        ds = p * (dot(do, v, tb=True) - _column(r["delta"]))
        r["dk_acc"][...] += dot(ds.astype(q.dtype), q, ta=True)

    @pl.when(i == cfg.nq - 1)
    def _finish():
        r["dk"][...] = r["dk_acc"][...] * cfg.sm_scale
        r["dv"][...] = r["dv_acc"][...]


def _rel_grad_tile(cfg: FlashConfig, bucket: jax.Array, ds: jax.Array) -> jax.Array:
    """Table-gradient row [1, num_buckets_pad] of one tile: the sum of dS [bq, bk] per bucket.

    Each bucket's sum is one whole-tile reduction and the result stays 2-D: reducing a
    row-reduced vector again lowers to a sublane gather (not on TPU v4).
    """
    lo, hi = common.bucket_range(bucket)
    ids = jax.lax.broadcasted_iota(jnp.int32, (1, cfg.num_buckets_pad), 1)

    def body(n, acc):
        return acc + jnp.where(ids == n, jnp.sum(jnp.where(bucket == n, ds, 0.0)), 0.0)

    return jax.lax.fori_loop(lo, hi + 1, body, jnp.zeros(ids.shape, jnp.float32))


def _dq_kernel(*refs, cfg: FlashConfig, names: list[str], outs: list[str]):
    r, _, j, tile, needed = _kernel_setup(cfg, refs, names + outs + ["dq_acc", "dtab_acc"], True,
                                          {"dq_acc": 0.0, "dtab_acc": 0.0})
    if cfg.has_bias:  # every (i, j) dbias block is an output block: skipped ones are zero

        @pl.when(jnp.logical_not(needed))
        def _zero():
            r["dbias"][...] = jnp.zeros(r["dbias"].shape, jnp.float32)

    @pl.when(needed)
    def _compute():
        q, k, v, do = r["q"][...], r["k"][...], r["v"][...], r["do"][...]
        s, bucket = common.logits_tile(cfg, dot(q, k, tb=True), *tile)
        p = jnp.exp(s - _column(r["lse"]))
        ds = p * (dot(do, v, tb=True) - _column(r["delta"]))
        r["dq_acc"][...] += dot(ds.astype(k.dtype), k)
        if cfg.has_rel:
            r["dtab_acc"][...] += _rel_grad_tile(cfg, bucket, ds)
        if cfg.has_bias:
            r["dbias"][...] = ds

    @pl.when(j == cfg.nk - 1)
    def _finish():
        r["dq"][...] = r["dq_acc"][...] * cfg.sm_scale
        if cfg.has_rel:
            r["dtab"][...] = r["dtab_acc"][...]


def backward(cfg: FlashConfig, q, k, v, side: dict, o, lse, do):
    """Same outputs as `_flash_triton.backward` (dq, per-q-head dk/dv, dtab [H, NBp], dbias).

    Runs with the backward blocks (`cfg.for_backward()`); `lse` [B, H, 1, Lq_pad] from `forward`.
    """
    cfg = cfg.for_backward()
    batch, heads, bq, bk, d = q.shape[0], cfg.num_heads, cfg.block_q, cfg.block_k, cfg.head_dim_pad
    delta = jnp.einsum("blhd,blhd->bhl", o.astype(jnp.float32), do.astype(jnp.float32))
    args = {"q": _to_head_major(q), "k": _to_head_major(k), "v": _to_head_major(v),
            "do": _to_head_major(do), "lse": lse, "delta": delta[:, :, None, :],
            **_side_arrays(cfg, side)}
    names = ["q", "k", "v", "do", "lse", "delta"] + common.side_names(cfg)

    per_head = jax.ShapeDtypeStruct((batch, heads, cfg.lk_pad, d), jnp.float32)
    own_k = pl.BlockSpec((None, None, bk, d), lambda b, h, j, i: (b, h, j, 0))
    dk, dv = _call(cfg, _dkdv_kernel, names, args, _specs(cfg, q_outer=False), matmuls=4,
                   scratch=[(bk, d), (bk, d)], grid=(batch, heads, cfg.nk, cfg.nq),
                   out_shape=(per_head, per_head), out_specs=(own_k, own_k),
                   name="t5x_like_flash_bwd_dkdv_tpu")

    nbp = max(cfg.num_buckets_pad, 1)
    outs = {"dq": (jax.ShapeDtypeStruct((batch, heads, cfg.lq_pad, d), jnp.float32),
                   pl.BlockSpec((None, None, bq, d), lambda b, h, i, j: (b, h, i, 0)))}
    if cfg.has_rel:
        outs["dtab"] = (jax.ShapeDtypeStruct((batch, heads, cfg.nq, 1, nbp), jnp.float32),
                        pl.BlockSpec((None, None, None, 1, nbp),
                                     lambda b, h, i, j: (b, h, i, 0, 0)))
    if cfg.has_bias:
        outs["dbias"] = (jax.ShapeDtypeStruct((batch, heads, cfg.lq_pad, cfg.lk_pad), jnp.float32),
                         pl.BlockSpec((None, None, bq, bk), lambda b, h, i, j: (b, h, i, j)))
    res = _call(cfg, functools.partial(_dq_kernel, outs=list(outs)), names, args,
                _specs(cfg, q_outer=True), matmuls=3, scratch=[(bq, d), (1, nbp)],
                grid=(batch, heads, cfg.nq, cfg.nk), out_shape=tuple(x for x, _ in outs.values()),
                out_specs=tuple(spec for _, spec in outs.values()),
                name="t5x_like_flash_bwd_dq_tpu")
    res = dict(zip(outs, res, strict=True))
    dtab = res["dtab"].sum(axis=(0, 2, 3)) if cfg.has_rel else None
    return (_to_head_major(res["dq"]), _to_head_major(dk), _to_head_major(dv), dtab,
            res.get("dbias"))
