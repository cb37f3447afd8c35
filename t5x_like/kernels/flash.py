"""Flash attention (forward + backward Pallas kernels): T5 relative bias, prefix and packed masks.

Entry point `flash_attention`, contract in DESIGN.md. This module validates arguments, pads
lengths / head_dim / the bucket table to what the kernels need, picks a backend, and wires the
kernels into `jax.custom_vjp`:

- `backend='triton'`: `_flash_triton.py` (Pallas on Triton, GPU; CPU runs it with `interpret=True`).
- `backend='mosaic_gpu'`: `_flash_mosaic_gpu.py`, Hopper (sm_90a) kernels in Pallas on Mosaic GPU
  (warp-specialised, TMA + wgmma; bf16, head_dim 64/128, no dense bias): forward, dK/dV and
  dQ (with the T5 table's gradient), one tile's bounds, mask and bias in `_mosaic_gpu_tiles.py`,
  the producer, barriers and ping-pong in `_mosaic_gpu_pipeline.py`; CPU runs them in Pallas'
  GPU interpreter. Opt-in until a train step with them is measured.
- `backend='mosaic_tpu'`: `_flash_tpu.py` (Pallas Mosaic TPU; CPU runs it in TPU interpret mode).
- `backend='auto'`: triton on GPU and CPU, mosaic_tpu on TPU.

Backend, interpret default and block sizes follow the *target*: the host's devices, or the one
set by `compile_target(platform, arch)` for ahead-of-time compilation on another machine. GPU
blocks come from `GPU_BLOCKS` (per compute capability, head_dim, forward / backward), picked by
`scripts/tune_flash_gpu.py` from real compiles; `scripts/check_gpu_kernels.py` is the CI guard
(no spills, fits shared memory, pipelined loads).

Memory is O(length): the kernels keep only `[block_q, block_k]` tiles, and the residuals are q, k,
v, o and the per-row logsumexp `[B, H, Lq]`. The only `[.., Lq, Lk]` arrays are the ones the
caller brings: a dense `bias` and its gradient. The GPU backward with a T5 table also writes dS
near the diagonal, `[B, H, Lq, W]` in the inputs' dtype with W about 2 x 91 + 3 blocks for T5's
buckets (6 of 8 blocks at T5's length of 512), transient, for the table gradient.

Bias-gradient design. The T5 table gradient is `d_table[n, h] = sum over (b, q, k) with
bucket(k - q) = n of dS[b, h, q, k]`. The TPU dQ kernel (one program per (b, h, q block), looping
over k blocks) already holds every dS tile of its row block, so it reduces each tile and writes the
result once per program into `[B, H, n_q_blocks, num_buckets]`; a tiny XLA sum outside gives
`[num_buckets, H]`. No atomics, deterministic, O(B·H·Lq/block_q·num_buckets) extra memory. On
GPUs a bucket boundary can only cross tiles near the diagonal, up to where the buckets saturate
(offset 91 for T5's 32 buckets up to max_distance 128: the last log bucket starts there;
`relpos.saturation_distance`), a window of about (2 x 91 + block_q) / block_k k blocks per q
block (`_flash_gpu_inputs.near_window`); a tile beyond it lies wholly in its side's outermost
bucket.
The GPU dQ kernels (Triton, Hopper) store the window's dS tiles (already in the inputs' dtype
for their dS·K product), which XLA sums over the batch, then by offset, then by bucket
(O(B·H·Lq·max_distance) memory at most, linear in length), and add a tile beyond the window to its
side's row sums. The Triton kernel's loop is 382 PTX instructions a tile at length 512 against
1,854 with the masked row sum per bucket run the kernel took before, and 294 without a table
(sm_90, d=64; `benchmarks/flash_instructions.md`). The tile's bias is a block
load from a precomputed band (`_flash_gpu_inputs.rel_band`; 1.28x faster T5 fwd+bwd at length
4096 on an H100 than per-tile bucket math, `benchmarks/h100/`). The
dense-bias gradient is dS itself, written tile by tile by the same kernel (and summed outside
over broadcast batch/head dims).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import re
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from t5x_like.kernels import _flash_triton
from t5x_like.kernels._flash_common import FlashConfig
from t5x_like.kernels._flash_reference import reference_rel_bias

BACKENDS = ("auto", "triton", "mosaic_gpu", "mosaic_tpu")
MAX_HEAD_DIM = 256
GPU_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90")
TPU_ARCHS = ("v4", "v5e", "v5p", "v6e")

# (block_q, block_k, num_warps, num_stages) per GPU arch, padded head_dim and kernel
# ("fwd" = forward, "bwd" = dK/dV and dQ). Picked by `scripts/tune_flash_gpu.py` from real
# deviceless compiles (registers, spills, shared memory, cp.async); the rule and every candidate
# are in `benchmarks/flash_gpu_blocks.{json,md}`, and a test checks this table equals its picks.
# head_dim 256 entries are not searched yet: small conservative tiles.
GPU_BLOCKS: dict[str, dict[int, dict[str, tuple[int, int, int, int]]]] = {
    "sm_80": {
        64: {"fwd": (128, 32, 4, 3), "bwd": (64, 32, 8, 2)},
        128: {"fwd": (64, 64, 4, 2), "bwd": (64, 32, 8, 2)},
        256: {"fwd": (64, 32, 8, 2), "bwd": (32, 32, 4, 1)},
    },
    "sm_86": {
        64: {"fwd": (128, 32, 4, 3), "bwd": (64, 32, 4, 2)},
        128: {"fwd": (64, 64, 4, 2), "bwd": (64, 32, 8, 2)},
        256: {"fwd": (64, 32, 8, 2), "bwd": (32, 32, 4, 1)},
    },
    "sm_90": {
        64: {"fwd": (128, 128, 8, 2), "bwd": (128, 64, 8, 2)},
        128: {"fwd": (128, 64, 8, 3), "bwd": (128, 64, 8, 2)},
        256: {"fwd": (64, 32, 8, 2), "bwd": (32, 32, 4, 1)},
    },
}
# sm_89 (L4, L40S, RTX 40xx): the same shared-memory limit (99 KB per block) and mma.sync code as
# sm_86, so the same table.
GPU_BLOCKS["sm_89"] = GPU_BLOCKS["sm_86"]
# GPUs older than sm_80 (no tuned table): small tiles that fit 48 KB of shared memory.
_GPU_FALLBACK = {"fwd": (64, 64, 4, 2), "bwd": (32, 32, 4, 1)}
_TPU_DEFAULTS = (128, 128)
_INTERPRET_DEFAULTS = (64, 64)


@dataclasses.dataclass(frozen=True)
class Target:
    """Where the kernels will run: platform 'gpu' | 'tpu' | 'cpu', and its arch (or None)."""

    platform: str
    arch: str | None = None


_TARGET_OVERRIDE: contextvars.ContextVar[Target | None] = contextvars.ContextVar(
    "flash_compile_target", default=None)


@contextlib.contextmanager
def compile_target(platform: str, arch: str | None = None) -> Iterator[Target]:
    """Make `flash_attention` lower for `platform`/`arch` instead of the host's devices.

    Used for ahead-of-time compilation on a machine without the accelerator: backend choice
    ('auto'), the interpret default and the default block sizes then follow the target, e.g.
    `with compile_target("gpu", "sm_90"): jax.jit(f).lower(...)`. `arch`: GPU 'sm_80',
    'sm_86', 'sm_89', 'sm_90' (any 'sm_XY'), TPU 'v4', 'v5e', 'v5p', 'v6e', or None.
    """
    if platform not in ("gpu", "tpu"):
        raise ValueError(f"compile_target platform must be 'gpu' or 'tpu'; got {platform!r}")
    if arch is not None:
        if platform == "gpu" and not re.fullmatch(r"sm_\d{2,3}a?", arch):
            raise ValueError(f"GPU arch must look like 'sm_80' (known: {GPU_ARCHS}); got {arch!r}")
        if platform == "tpu" and arch not in TPU_ARCHS:
            raise ValueError(f"TPU arch must be one of {TPU_ARCHS}; got {arch!r}")
    token = _TARGET_OVERRIDE.set(Target(platform, arch))
    try:
        yield _TARGET_OVERRIDE.get()
    finally:
        _TARGET_OVERRIDE.reset(token)


def gpu_arch_of(compute_capability: str) -> str:
    """'9.0' (a CUDA device's `compute_capability`) -> 'sm_90'."""
    major, _, minor = str(compute_capability).partition(".")
    if not (major.isdigit() and (minor or "0").isdigit()):
        raise ValueError(f"not a compute capability: {compute_capability!r}")
    return f"sm_{major}{minor or '0'}"


def current_target() -> Target:
    """The `compile_target` in effect, else the host's default backend (and GPU arch)."""
    override = _TARGET_OVERRIDE.get()
    if override is not None:
        return override
    platform = jax.default_backend()
    if platform in ("gpu", "cuda", "rocm"):
        cc = getattr(jax.devices()[0], "compute_capability", None)
        return Target("gpu", gpu_arch_of(cc) if cc else None)
    if platform == "tpu":
        return Target("tpu", tpu_arch_of(jax.devices()[0].device_kind))
    return Target(platform, None)


def tpu_arch_of(device_kind: str) -> str | None:
    """'TPU v5 lite' -> 'v5e', 'TPU v5p' / 'TPU v5' -> 'v5p', 'TPU v6 lite' -> 'v6e', ..."""
    kind = device_kind.lower()
    if "v6" in kind:
        return "v6e"
    if "v5" in kind:
        return "v5e" if ("lite" in kind or "v5e" in kind) else "v5p"
    if "v4" in kind:
        return "v4"
    return None


def _gpu_table(arch: str | None) -> dict[int, dict[str, tuple[int, int, int, int]]] | None:
    """Tuned table of an arch; unknown archs >= sm_80 use sm_86's (smallest shared memory of
    the tuned ones, 99 KB), older or unknown ones None (fallback blocks)."""
    if arch is None:
        return None
    arch = arch.removesuffix("a")
    if arch in GPU_BLOCKS:
        return GPU_BLOCKS[arch]
    cc = int(arch.removeprefix("sm_"))
    return GPU_BLOCKS["sm_86"] if cc >= 80 else None


def default_block_sizes(head_dim: int, backend: str, target: Target,
                        kernel: str = "fwd") -> tuple[int, int, int, int]:
    """(block_q, block_k, num_warps, num_stages) for a padded head_dim, backend and target;
    kernel 'fwd' (forward) or 'bwd' (the dK/dV and dQ kernels)."""
    if kernel not in ("fwd", "bwd"):
        raise ValueError(f"kernel must be 'fwd' or 'bwd'; got {kernel!r}")
    if backend == "mosaic_tpu":
        if target.platform != "tpu":
            return (*_TPU_DEFAULTS, 4, 2)
        from t5x_like.kernels import _flash_tpu

        fwd, bwd = _flash_tpu.default_blocks(target.arch, head_dim)  # ((bq, bk) fwd, (bq, bk) bwd)
        return (*(fwd if kernel == "fwd" else bwd), 4, 2)
    if target.platform != "gpu":
        return (*_INTERPRET_DEFAULTS, 4, 2)
    table = _gpu_table(target.arch)
    if table is None:
        return _GPU_FALLBACK[kernel]
    return table[min(key for key in table if key >= head_dim)][kernel]


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, 1 << (max(n, 1) - 1).bit_length())


def _blocks(default: tuple[int, int, int, int], block_q: int | None, block_k: int | None,
            lq: int, lk: int, prefix: str = "") -> tuple[int, int, int, int]:
    """Validated (block_q, block_k, warps, stages): explicit blocks, else the defaults shrunk to
    the (power-of-two rounded) lengths."""
    dbq, dbk, warps, stages = default
    for name, blk in ((prefix + "block_q", block_q), (prefix + "block_k", block_k)):
        if blk is not None and (blk < 16 or blk & (blk - 1)):
            raise ValueError(f"{name} must be a power of two >= 16; got {blk}")
    bq = block_q or min(dbq, _pow2_at_least(lq, 16))
    bk = block_k or min(dbk, _pow2_at_least(lk, 16))
    return bq, bk, warps, stages


def _pad_axis(x: jax.Array, axis: int, size: int, value=0) -> jax.Array:
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def _validate(q, k, v, causal, q_segment_ids, kv_segment_ids, prefix_mask, rel_bias, bias,
              backend) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be [batch, length, heads, head_dim]; got ndim "
                         f"{q.ndim}, {k.ndim}, {v.ndim}")
    b, lq, h, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {k.shape} vs {v.shape}")
    if k.shape[0] != b:
        raise ValueError(f"batch mismatch: q has {b}, k/v have {k.shape[0]}")
    if k.shape[3] != d:
        raise ValueError(f"head_dim mismatch: q has {d}, k/v have {k.shape[3]}")
    hkv = k.shape[2]
    if hkv == 0 or h % hkv:
        raise ValueError(f"num q heads ({h}) must be a multiple of num kv heads ({hkv})")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim {d} out of range [1, {MAX_HEAD_DIM}]")
    if lq == 0 or k.shape[1] == 0:
        raise ValueError("sequence lengths must be positive")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype not in (jnp.bfloat16, jnp.float32):
            raise ValueError(f"unsupported dtype for {name}: {x.dtype} (bfloat16 or float32)")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    lk = k.shape[1]
    for name, seg, length in (("q_segment_ids", q_segment_ids, lq),
                              ("kv_segment_ids", kv_segment_ids, lk)):
        if seg is not None:
            if seg.shape != (b, length):
                raise ValueError(f"{name} must have shape {(b, length)}; got {seg.shape}")
            if not jnp.issubdtype(seg.dtype, jnp.integer):
                raise ValueError(f"{name} must be integer; got {seg.dtype}")
    if prefix_mask is not None:
        if not causal:
            raise ValueError("prefix_mask needs causal=True (prefix = bidirectional part of a "
                             "causal mask)")
        if lq != lk:
            raise ValueError(f"prefix_mask needs Lq == Lk; got {lq} vs {lk}")
        if prefix_mask.shape != (b, lq):
            raise ValueError(f"prefix_mask must have shape {(b, lq)}; got {prefix_mask.shape}")
    if rel_bias is not None:
        if rel_bias.ndim != 2 or rel_bias.shape[1] != h or rel_bias.shape[0] < 2:
            raise ValueError(f"rel_bias must be [num_buckets >= 2, heads={h}]; got "
                             f"{rel_bias.shape}")
        if not jnp.issubdtype(rel_bias.dtype, jnp.floating):
            raise ValueError(f"rel_bias must be floating; got {rel_bias.dtype}")
    if bias is not None:
        ok = (bias.ndim == 4 and bias.shape[0] in (1, b) and bias.shape[1] in (1, h)
              and bias.shape[2:] == (lq, lk))
        if not ok:
            raise ValueError(f"bias must be [{b}|1, {h}|1, {lq}, {lk}]; got {bias.shape}")
        if not jnp.issubdtype(bias.dtype, jnp.floating):
            raise ValueError(f"bias must be floating; got {bias.dtype}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {BACKENDS}")


def flash_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = False,
    q_segment_ids: jax.Array | None = None, kv_segment_ids: jax.Array | None = None,
    prefix_mask: jax.Array | None = None, rel_bias: jax.Array | None = None,
    rel_bidirectional: bool = True, rel_max_distance: int = 128, bias: jax.Array | None = None,
    sm_scale: float = 1.0, block_q: int | None = None, block_k: int | None = None,
    bwd_block_q: int | None = None, bwd_block_k: int | None = None, backend: str = "auto",
    interpret: bool | None = None,
) -> jax.Array:
    """softmax(sm_scale·q kᵀ + T5 rel bias + bias, masked) v, computed blockwise.

    Args:
      q: [B, Lq, H, D]; k, v: [B, Lk, Hkv, D] with H % Hkv == 0 (GQA/MQA); bf16 or fp32.
      causal: key k visible to query q only if k <= q (top-left aligned when Lq != Lk).
      q_segment_ids, kv_segment_ids: [B, Lq], [B, Lk] ints; attention only within equal nonzero
        ids, 0 = padding. Only one given: just that side's padding (id 0) is masked.
      prefix_mask: [B, Lq] bool; prefix tokens attend to each other bidirectionally (causal=True).
      rel_bias: [num_buckets, H] T5 table, bias = table[bucket(k - q)] per tile.
      bias: dense additive [B|1, H|1, Lq, Lk]. With `rel_bias` too, the table is added to it
        first (one dense bias in the kernel).
      block_q, block_k: tile sizes (powers of two >= 16); None = per-target defaults
        (`compile_target`, else the host's devices).
      bwd_block_q, bwd_block_k: tile sizes of the backward kernels; None = block_q / block_k
        when those are given, else the per-target backward defaults.
    Returns:
      [B, Lq, H, D] in q's dtype; fully-masked query rows are 0 (and get 0 gradients).
    """
    _validate(q, k, v, causal, q_segment_ids, kv_segment_ids, prefix_mask, rel_bias, bias,
              backend)
    if not (math.isfinite(sm_scale) and sm_scale != 0):  # the GPU bias band is bias / sm_scale
        raise ValueError(f"sm_scale must be finite and nonzero, got {sm_scale}")
    if rel_bias is not None and bias is not None:
        # No kernel carries both (with both, the dQ or dK/dV kernel spilled registers on sm_80
        # and sm_90): the caller already pays O(Lq·Lk) for `bias`, so the table joins it as a
        # [1, H, Lq, Lk] bias (dtypes promoted); its gradient flows back through the lookup.
        bias = bias + reference_rel_bias(rel_bias, q.shape[1], k.shape[1],
                                         bidirectional=rel_bidirectional,
                                         max_distance=rel_max_distance)
        rel_bias = None
    target = current_target()
    if backend == "auto":
        backend = "mosaic_tpu" if target.platform == "tpu" else "triton"
    if interpret is None:
        interpret = target.platform != ("tpu" if backend == "mosaic_tpu" else "gpu")
    b, lq, h, d = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    dp = _pow2_at_least(d, 64 if backend == "mosaic_gpu" else 32)
    fwd = _blocks(default_block_sizes(dp, backend, target, "fwd"), block_q, block_k, lq, lk)
    k_unit = 0
    if backend == "mosaic_gpu":  # fixed 128-row q blocks (two warpgroups) and dK/dV key blocks
        from t5x_like.kernels import _flash_mosaic_gpu  # jax's Mosaic GPU modules: 0.8 s import

        has_seg = q_segment_ids is not None or kv_segment_ids is not None
        fwd = (block_q or _flash_mosaic_gpu.BLOCK_Q, block_k or _flash_mosaic_gpu.default_block_k(
            dp, 2, has_seg, prefix_mask is not None, rel_bias is not None), 4, 2)
        k_unit = _flash_mosaic_gpu.DKDV_KEYS
    bwd = _blocks(default_block_sizes(dp, backend, target, "bwd"), bwd_block_q or block_q,
                  bwd_block_k or block_k, lq, lk, "bwd_" if bwd_block_q or bwd_block_k else "")
    bq, bk, warps, stages = fwd
    # Every kernel's blocks divide the padded lengths (blocks are powers of two).
    k_unit = max(bk, bwd[1], k_unit)
    lq_pad, lk_pad = -(-lq // max(bq, bwd[0])) * max(bq, bwd[0]), -(-lk // k_unit) * k_unit

    side, has_seg, num_buckets, nb_pad = _side_inputs(
        q_segment_ids, kv_segment_ids, prefix_mask, rel_bias, bias, lq, lk, lq_pad, lk_pad)
    cfg = FlashConfig(
        backend=backend, interpret=bool(interpret), causal=bool(causal), has_seg=has_seg,
        has_prefix=prefix_mask is not None, has_rel=rel_bias is not None, has_bias=bias is not None,
        bias_batch=bias.shape[0] if bias is not None else 1,
        bias_heads=bias.shape[1] if bias is not None else 1,
        sm_scale=float(sm_scale), block_q=bq, block_k=bk, lq=lq, lk=lk, lq_pad=lq_pad,
        lk_pad=lk_pad, head_dim_pad=dp, num_heads=h, group=h // hkv, num_buckets=num_buckets,
        num_buckets_pad=nb_pad, rel_bidirectional=bool(rel_bidirectional),
        rel_max_distance=int(rel_max_distance), kv_pad_mask=(lk_pad != lk) and not has_seg,
        num_warps=warps, num_stages=stages, bwd_block_q=bwd[0], bwd_block_k=bwd[1],
        bwd_num_warps=bwd[2], bwd_num_stages=bwd[3],
    )
    qp, kp, vp = (_pad_axis(_pad_axis(x, 1, length), 3, dp)
                  for x, length in ((q, lq_pad), (k, lk_pad), (v, lk_pad)))
    return _flash_core(cfg, qp, kp, vp, side)[:, :lq, :, :d]


def _side_inputs(q_segment_ids, kv_segment_ids, prefix_mask, rel_bias, bias, lq: int, lk: int,
                 lq_pad: int, lk_pad: int) -> tuple[dict[str, jax.Array], bool, int, int]:
    """The kernels' side inputs, padded to the tiles: (side, has segments, num_buckets, padded
    num_buckets). side: 'qseg' [B, Lq_pad] / 'kseg' [B, Lk_pad] int32; prefix 'pq', 'pk' and
    'plen' [B] (prefix length); 'tab' the bias table [H, nb_pad]; 'bias' [B|1, H|1, Lq_pad,
    Lk_pad]."""
    # With one side's ids missing, only the given side's padding (id 0) is masked: encode that
    # as ones vs (ids != 0), so the kernels always see the two-sided rule.
    if q_segment_ids is None and kv_segment_ids is not None:
        kv_segment_ids = (kv_segment_ids != 0).astype(jnp.int32)
        q_segment_ids = jnp.ones((kv_segment_ids.shape[0], lq), jnp.int32)
    elif kv_segment_ids is None and q_segment_ids is not None:
        q_segment_ids = (q_segment_ids != 0).astype(jnp.int32)
        kv_segment_ids = jnp.ones((q_segment_ids.shape[0], lk), jnp.int32)
    has_seg = q_segment_ids is not None
    side = {}
    if has_seg:
        side["qseg"] = _pad_axis(q_segment_ids.astype(jnp.int32), 1, lq_pad)
        side["kseg"] = _pad_axis(kv_segment_ids.astype(jnp.int32), 1, lk_pad)
    if prefix_mask is not None:
        pm = prefix_mask.astype(jnp.int32)
        side["pq"] = _pad_axis(pm, 1, lq_pad)
        side["pk"] = _pad_axis(pm, 1, lk_pad)
        positions = jnp.arange(1, lq + 1, dtype=jnp.int32)
        side["plen"] = jnp.max(jnp.where(pm != 0, positions, 0), axis=1)
    num_buckets = nb_pad = 0
    if rel_bias is not None:
        num_buckets = rel_bias.shape[0]
        nb_pad = _pow2_at_least(num_buckets, 16)
        side["tab"] = _pad_axis(rel_bias.T, 1, nb_pad)
    if bias is not None:
        side["bias"] = _pad_axis(_pad_axis(bias, 2, lq_pad), 3, lk_pad)
    return side, has_seg, num_buckets, nb_pad


def _backend_module(cfg: FlashConfig):
    if cfg.backend == "mosaic_gpu":
        from t5x_like.kernels import _flash_mosaic_gpu

        return _flash_mosaic_gpu
    if cfg.backend == "mosaic_tpu":
        from t5x_like.kernels import _flash_tpu

        return _flash_tpu
    return _flash_triton


@functools.cache
def _jitted(cfg: FlashConfig, name: str):
    """The backend's `forward` / `backward` under `jax.jit` (cfg static): every call site with
    the same config and shapes (a model's layers) reuses one trace and one lowering instead of
    lowering the kernels again per layer (T5-base's 36 attention layers: the Hopper kernels'
    Mosaic lowering took most of the step's 53 s build on an H200; 8 layers lower in 1.3 s
    instead of 5.5 s here)."""
    return jax.jit(getattr(_backend_module(cfg), name), static_argnums=0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash_core(cfg: FlashConfig, q, k, v, side: dict) -> jax.Array:
    return _jitted(cfg, "forward")(cfg, q, k, v, side)[0]


def _flash_core_fwd(cfg: FlashConfig, q, k, v, side: dict):
    o, lse = _jitted(cfg, "forward")(cfg, q, k, v, side)
    return o, (q, k, v, side, o, lse)


def _flash_core_bwd(cfg: FlashConfig, res, do):
    q, k, v, side, o, lse = res
    dq, dk_h, dv_h, dtab, dbias = _jitted(cfg, "backward")(cfg, q, k, v, side, o, lse, do)
    b, lk_pad, h, dp = dk_h.shape
    # dK/dV come per q head; the kv head's gradient is the sum over its group.
    if cfg.group > 1:
        dk_h, dv_h = (g.reshape(b, lk_pad, h // cfg.group, cfg.group, dp).sum(3)
                      for g in (dk_h, dv_h))
    dk, dv = dk_h.astype(k.dtype), dv_h.astype(v.dtype)
    dside = {}
    for name, x in side.items():
        if name == "tab":
            dside[name] = dtab.astype(x.dtype)
        elif name == "bias":
            g = dbias
            if cfg.bias_batch == 1:
                g = g.sum(axis=0, keepdims=True)
            if cfg.bias_heads == 1:
                g = g.sum(axis=1, keepdims=True)
            dside[name] = g.astype(x.dtype)
        else:  # integer side inputs (segments, prefix) have no gradient
            dside[name] = np.zeros(x.shape, dtype=jax.dtypes.float0)
    return dq.astype(q.dtype), dk, dv, dside


_flash_core.defvjp(_flash_core_fwd, _flash_core_bwd)
