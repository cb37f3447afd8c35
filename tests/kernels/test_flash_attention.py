"""Flash-attention kernel vs a float64 numpy reference (CPU, Pallas interpret mode).

Criterion per output (o, dq, dk, dv, d rel table, d dense bias): the kernel's max error against the
f64 reference is at most 2x the error of plain XLA attention computed in the same dtype, plus a
tiny floor (1e-5 x the output's scale); NaN/inf never passes. Inputs are random from the
`test_seed` fixture (fixed per test; T5X_LIKE_TEST_SEED=N re-runs with the seed a failure prints).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from t5x_like.kernels import flash_attention
from t5x_like.kernels._flash_reference import reference_attention
from tests.kernels.reference_np import attention_f64

FLOOR = 1e-5
# Absolute tolerance of a float32 kernel against plain XLA attention: exact-f32 dots on CPU; on a
# GPU both sides' float32 dots run in TF32 (10-bit mantissa), rounded differently (7e-4 seen on
# an H100).
F32_ATOL = 2e-5 if jax.default_backend() == "cpu" else 2e-3


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    dtype: str = "float32"
    b: int = 2
    lq: int = 37
    lk: int = 37
    h: int = 4
    hkv: int = 4
    d: int = 32
    causal: bool = False
    # none | padding | packed | long (two examples, each over many blocks) | head (one short
    # example, then blocks of padding) | cross | kv_only (encoder padding only)
    segments: str = "none"
    prefix: bool = False
    rel: str = "none"  # none | bidirectional | causal
    bias: tuple[int, int] | None = None  # (B|1, H|1) of a dense bias
    max_distance: int = 24  # the T5 table's
    sm_scale: float = 1.0
    backend: str = "triton"


CASES = [
    Case("full_gqa_rel_kv_padding_odd_lengths", lq=37, lk=45, hkv=2, d=24, rel="bidirectional",
         segments="kv_only"),
    Case("causal_mqa_packed_rel_bf16", dtype="bfloat16", lq=48, lk=48, hkv=1, causal=True,
         segments="packed", rel="causal", d=64),
    Case("prefix_lm_padding", lq=35, lk=35, d=40, causal=True, prefix=True, segments="padding",
         rel="causal", sm_scale=0.125),
    Case("packed_cross_bias_bf16", dtype="bfloat16", lq=33, lk=29, hkv=2, segments="cross",
         bias=(1, 4)),
    # max_distance 16 with 128 tokens in 16-blocks: tiles far from the diagonal (a row sum) and
    # near it (stored dS tiles) on both sides, windows moved back from the last k block.
    Case("rel_far_tiles_packed_bf16", dtype="bfloat16", b=1, lq=128, lk=128, h=2, hkv=2, d=32,
         segments="packed", rel="bidirectional", max_distance=16),
    Case("causal_short_q_bias_rel", lq=24, lk=40, causal=True, rel="causal", bias=(2, 1)),
    # Two long examples a row: tiles inside one skip the segment test (`logits_tile`'s
    # one_segment), the tiles across the boundary or the padding keep it.
    Case("long_segments_causal_rel_bf16", dtype="bfloat16", lq=96, lk=96, hkv=2, d=32,
         causal=True, segments="long", rel="causal"),
    # Blocks of padding only: their programs' loop ranges are empty, and the GPU kernels visit
    # one fully-masked block anyway (`_flash_triton._at_least_one`), which must add nothing.
    Case("head_example_causal_rel_padding_blocks", lq=80, lk=80, d=32, causal=True,
         segments="head", rel="causal"),
    Case("tpu_prefix_packed_rel_bias", b=1, lq=35, lk=35, h=2, hkv=1, causal=True, prefix=True,
         segments="packed", rel="causal", bias=(1, 2), backend="mosaic_tpu"),
    # The Hopper kernels (forward, dK/dV) under Pallas' GPU interpreter (warpgroups, TMA and
    # barriers simulated): more than two blocks so the two-slot rings wrap, both warpgroups of
    # a CTA, head_dim 64 and 128 (dK/dV streams 64- or 32-row q tiles).
    Case("mgpu_causal_mqa_packed_rel", dtype="bfloat16", b=1, lq=200, lk=200, h=2, hkv=1,
         d=64, causal=True, segments="packed", rel="causal", backend="mosaic_gpu"),
    Case("mgpu_prefix_padding_rel", dtype="bfloat16", b=1, lq=150, lk=150, h=2, hkv=2, d=72,
         causal=True, prefix=True, segments="padding", rel="causal", sm_scale=0.125,
         backend="mosaic_gpu"),
    Case("mgpu_cross_gqa_rel_kv_padding", dtype="bfloat16", b=1, lq=100, lk=190, h=2, hkv=1,
         d=128, segments="kv_only", rel="bidirectional", backend="mosaic_gpu"),
    # Tiles wholly beyond max_distance on both sides: their band tiles are not streamed (the
    # outermost buckets' values added instead) in all three kernels.
    Case("mgpu_rel_far_tiles_packed", dtype="bfloat16", b=1, lq=384, lk=384, h=1, hkv=1, d=64,
         segments="packed", rel="bidirectional", max_distance=16, backend="mosaic_gpu"),
    # Two long examples a row: tiles inside one (no segment test, `tiles.masked`'s
    # one_segment) beside tiles across the boundary or the padding, in all three kernels.
    Case("mgpu_long_segments_rel", dtype="bfloat16", b=2, lq=384, lk=384, h=1, hkv=1, d=64,
         segments="long", rel="bidirectional", backend="mosaic_gpu"),
    # No table: dQ from the Hopper dQ kernel too.
    Case("mgpu_prefix_lm_packed_mqa", dtype="bfloat16", b=1, lq=150, lk=150, h=2, hkv=1, d=128,
         causal=True, prefix=True, segments="packed", backend="mosaic_gpu"),
]


def _segments(rng, b: int, length: int, kind: str, n_segments: int = 3) -> np.ndarray:
    """Per-example random segment boundaries; 'padding' = one segment then zeros; 'packed' also
    leaves internal padding (a zero run) between segments and trailing padding."""
    out = np.zeros((b, length), np.int32)
    for i in range(b):
        if kind == "long":  # two examples, the boundary drawn, then a tenth of padding
            cut = rng.integers(length // 3, 2 * length // 3)
            out[i, :cut], out[i, cut: length - length // 10] = 1, 2
            continue
        if kind == "padding":
            out[i, : rng.integers(length // 2, length)] = 1
            continue
        if kind == "head":
            out[i, : rng.integers(1, length // 4)] = 1
            continue
        cuts = np.sort(rng.choice(np.arange(1, length), n_segments, replace=False))
        ids = np.searchsorted(cuts, np.arange(length), side="right")
        out[i] = np.where(ids < n_segments, ids + 1, 0)
        if kind == "packed":
            gap = rng.integers(1, length - 1)
            out[i, gap : gap + 2] = 0
    return out


def _make(case: Case, seed: int):
    rng = np.random.default_rng(seed)
    dt = jnp.dtype(case.dtype)
    rnd = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    q = jnp.asarray(rnd(case.b, case.lq, case.h, case.d), dt)
    k = jnp.asarray(rnd(case.b, case.lk, case.hkv, case.d), dt)
    v = jnp.asarray(rnd(case.b, case.lk, case.hkv, case.d), dt)
    do = jnp.asarray(rnd(case.b, case.lq, case.h, case.d), dt)
    floats, ints = {}, {"causal": case.causal, "sm_scale": case.sm_scale}
    if case.rel != "none":
        floats["rel_bias"] = jnp.asarray(rnd(32, case.h), dt)
        ints.update(rel_bidirectional=case.rel == "bidirectional",
                    rel_max_distance=case.max_distance)
    if case.bias is not None:
        floats["bias"] = jnp.asarray(rnd(*case.bias, case.lq, case.lk), dt)
    if case.segments in ("padding", "packed", "long", "head"):
        seg = _segments(rng, case.b, case.lq, case.segments)
        ints.update(q_segment_ids=jnp.asarray(seg), kv_segment_ids=jnp.asarray(seg))
    elif case.segments == "cross":
        ints.update(q_segment_ids=jnp.asarray(_segments(rng, case.b, case.lq, "cross")),
                    kv_segment_ids=jnp.asarray(_segments(rng, case.b, case.lk, "cross")))
    elif case.segments == "kv_only":
        ints["kv_segment_ids"] = jnp.asarray(_segments(rng, case.b, case.lk, "padding"))
    if case.prefix:
        lengths = rng.integers(1, case.lq, size=case.b)
        ints["prefix_mask"] = jnp.asarray(np.arange(case.lq)[None, :] < lengths[:, None])
    return (q, k, v), do, floats, ints


def _vjp(fn, qkv, floats, do):
    out, pull = jax.vjp(fn, *qkv, floats)
    dq, dk, dv, dfloats = pull(do)
    res = {"o": out, "dq": dq, "dk": dk, "dv": dv}
    res.update({"drel": dfloats.get("rel_bias"), "dbias": dfloats.get("bias")})
    return {key: np.asarray(val, np.float64) for key, val in res.items() if val is not None}


def _run_case(case: Case, seed: int) -> dict[str, np.ndarray]:
    qkv, do, floats, ints = _make(case, seed)

    # Mosaic GPU takes 128-row q blocks (two warpgroups); its backward (Triton) keeps 16.
    blocks = ({"bwd_block_q": 16, "bwd_block_k": 16} if case.backend == "mosaic_gpu"
              else {"block_q": 16, "block_k": 16})

    def kernel(q, k, v, fl):
        return flash_attention(q, k, v, **fl, **ints, **blocks, backend=case.backend)

    def xla(q, k, v, fl):
        return reference_attention(q, k, v, **fl, **ints)

    ours = _vjp(jax.jit(kernel), qkv, floats, do)
    plain = _vjp(jax.jit(xla), qkv, floats, do)
    as64 = lambda x: np.asarray(jnp.asarray(x, jnp.float32), np.float64)
    truth = attention_f64(*(as64(x) for x in qkv), as64(do),
                          **{key: as64(val) for key, val in floats.items()}, **ints)
    assert set(ours) == set(truth), (set(ours), set(truth))
    msg = f"{case.name} seed={seed}"
    for key, ref in truth.items():
        got = ours[key]
        assert got.shape == ref.shape, (msg, key, got.shape, ref.shape)
        assert np.all(np.isfinite(got)), f"{msg}: non-finite {key}"
        err = np.max(np.abs(got - ref))
        err_xla = np.max(np.abs(plain[key] - ref))
        bound = 2 * err_xla + FLOOR * max(1.0, np.max(np.abs(ref)))
        assert err <= bound, f"{msg}: {key} err {err:.3g} > bound {bound:.3g} (xla {err_xla:.3g})"
    return ours


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_matches_f64_reference(case: Case, test_seed: int) -> None:
    seed = test_seed
    ours = _run_case(case, seed)
    if case.segments in ("padding", "packed", "long", "head"):  # padded rows: zero out and dq
        _, _, _, ints = _make(case, seed)
        pad = np.asarray(ints["q_segment_ids"]) == 0
        assert pad.any()
        assert np.all(ours["o"][pad] == 0) and np.all(ours["dq"][pad] == 0), f"seed={seed}"


def test_tpu_backend_under_force_interpret_mode(test_seed: int) -> None:
    """The Mosaic TPU kernel also runs when selected through `force_tpu_interpret_mode`."""
    seed = test_seed
    (q, k, v), _, _, _ = _make(Case("tiny", lq=20, lk=20, d=32), seed)
    with pltpu.force_tpu_interpret_mode():
        got = flash_attention(q, k, v, causal=True, backend="mosaic_tpu", interpret=False,
                              block_q=16, block_k=16)
    want = reference_attention(q, k, v, causal=True)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=F32_ATOL, err_msg=f"{seed}")


def test_mosaic_gpu_kernels_have_no_data_races(test_seed: int) -> None:
    """The Hopper forward's and dK/dV kernel's TMA rings under the GPU interpreter's
    happens-before race detector: no slot is refilled while a compute warpgroup may still read
    it (the interpreter also fails any barrier phase completed twice before a waiter saw it)."""
    from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call

    from t5x_like.kernels import _mosaic_gpu_pipeline

    rng = np.random.default_rng(test_seed)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 200, 2, 64)), jnp.bfloat16) for _ in range(3))
    with _mosaic_gpu_pipeline.interpreter_options(detect_races=True):
        out, pull = jax.vjp(lambda q, k, v: flash_attention(
            q, k, v, causal=True, backend="mosaic_gpu"), q, k, v)
        grads = jax.block_until_ready(pull(jnp.ones_like(out)))
    assert not interpret_pallas_call.get_races().races_found, f"seed={test_seed}"
    for x in (out, *grads):  # values: test_matches_f64_reference
        assert np.all(np.isfinite(np.asarray(x, np.float32)))


def test_skipped_blocks_are_never_read(test_seed: int) -> None:
    """Blocks past the causal diagonal / in non-overlapping segments hold NaN: a kernel that only
    masked them (instead of skipping them) would return NaN. (The dK/dV program of a k block no
    query sees still runs one fully-masked tile, `_at_least_one`, on zeroed k and v.)"""
    seed = test_seed
    (q, k, v), do, _, _ = _make(Case("skip", b=1, lq=32, lk=64, h=2, hkv=2), seed)
    poison = jnp.arange(64)[None, :, None, None] >= 32
    kn, vn = jnp.where(poison, jnp.nan, k), jnp.where(poison, jnp.nan, v)
    # Causal: no query (q <= 31) can see keys >= 32, so those k blocks must never be visited.
    fn = lambda q, k, v: flash_attention(q, k, v, causal=True, block_q=16, block_k=16)
    out, pull = jax.vjp(jax.jit(fn), q, kn, vn)
    dq, dk, dv = pull(do)
    want = reference_attention(q, k[:, :32], v[:, :32], causal=True)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=F32_ATOL, err_msg=f"{seed}")
    for name, grad in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert np.all(np.isfinite(np.asarray(grad))), f"{name} non-finite, seed={seed}"
    assert np.all(np.asarray(dk[:, 32:]) == 0) and np.all(np.asarray(dv[:, 32:]) == 0)
    # Segments: q uses segments 1, 2; kv blocks of segment 3 and padding (poisoned) are skipped.
    qseg = jnp.asarray([[1] * 16 + [2] * 16])
    kseg = jnp.asarray([[1] * 16 + [2] * 16 + [3] * 16 + [0] * 16])
    fn = lambda q, k, v: flash_attention(q, k, v, q_segment_ids=qseg, kv_segment_ids=kseg,
                                         block_q=16, block_k=16)
    out, pull = jax.vjp(jax.jit(fn), q, kn, vn)
    dq, dk, dv = pull(do)
    want = reference_attention(q, k[:, :32], v[:, :32], q_segment_ids=qseg,
                               kv_segment_ids=kseg[:, :32])
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=F32_ATOL, err_msg=f"{seed}")
    for name, grad in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert np.all(np.isfinite(np.asarray(grad))), f"segments: {name} non-finite, seed={seed}"
    assert np.all(np.asarray(dk[:, 32:]) == 0) and np.all(np.asarray(dv[:, 32:]) == 0)


def _qkv(b=1, lq=8, lk=8, h=2, hkv=2, d=32, dtype=jnp.float32):
    return (jnp.ones((b, lq, h, d), dtype), jnp.ones((b, lk, hkv, d), dtype),
            jnp.ones((b, lk, hkv, d), dtype))


INVALID = [
    ("batch mismatch", lambda: flash_attention(*_qkv()[:1], *_qkv(b=2)[1:])),
    ("multiple of num kv heads", lambda: flash_attention(*_qkv(h=3, hkv=2))),
    ("head_dim 300 out of range", lambda: flash_attention(*_qkv(d=300))),
    ("unsupported dtype", lambda: flash_attention(*_qkv(dtype=jnp.float16))),
    ("prefix_mask needs causal", lambda: flash_attention(
        *_qkv(), prefix_mask=jnp.ones((1, 8), bool))),
    ("prefix_mask needs Lq == Lk", lambda: flash_attention(
        *_qkv(lk=9), causal=True, prefix_mask=jnp.ones((1, 8), bool))),
    ("bias must be", lambda: flash_attention(*_qkv(), bias=jnp.zeros((1, 2, 8, 7)))),
    ("rel_bias must be", lambda: flash_attention(*_qkv(), rel_bias=jnp.zeros((32, 3)))),
    ("q_segment_ids must have shape", lambda: flash_attention(
        *_qkv(), q_segment_ids=jnp.ones((1, 7), jnp.int32),
        kv_segment_ids=jnp.ones((1, 8), jnp.int32))),
    ("power of two", lambda: flash_attention(*_qkv(), block_q=24)),
    ("unknown backend", lambda: flash_attention(*_qkv(), backend="cuda")),
    ("sm_scale must be finite and nonzero", lambda: flash_attention(*_qkv(), sm_scale=0.0)),
    ("'mosaic_gpu' cannot run this call: it takes bfloat16", lambda: flash_attention(
        *_qkv(), backend="mosaic_gpu")),
    ("'mosaic_gpu' cannot run this call: a dense bias", lambda: flash_attention(
        *_qkv(dtype=jnp.bfloat16), bias=jnp.zeros((1, 2, 8, 8)), backend="mosaic_gpu")),
    ("'mosaic_gpu' cannot run this call: its tiles need 232,960 B", lambda: flash_attention(
        *_qkv(lq=256, lk=256, d=128, dtype=jnp.bfloat16), causal=True, block_k=128,
        rel_bias=jnp.zeros((32, 2)), prefix_mask=jnp.ones((1, 256), bool),
        q_segment_ids=jnp.ones((1, 256), jnp.int32), kv_segment_ids=jnp.ones((1, 256), jnp.int32),
        backend="mosaic_gpu")),
]


@pytest.mark.parametrize("match,call", INVALID, ids=[m for m, _ in INVALID])
def test_invalid_arguments_raise(match: str, call) -> None:
    with pytest.raises(ValueError, match=match):
        call()
