"""GPU kernel configuration: compile targets, per-arch block tables, separate backward blocks,
and the pieces the Triton kernels precompute (T5 bias bands, segment loop bounds).

Numerics run the Triton kernels in Pallas interpret mode on CPU against the XLA reference.
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like.kernels import _flash_common, _flash_gpu_inputs, flash
from t5x_like.kernels._flash_common import FlashConfig
from t5x_like.kernels._flash_reference import reference_attention
from t5x_like.kernels.relpos import relative_position_bucket

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_code_table_equals_tuner_picks() -> None:
    """GPU_BLOCKS must be what scripts/tune_flash_gpu.py picked (benchmarks/flash_gpu_blocks)."""
    doc = json.loads((ROOT / "benchmarks" / "flash_gpu_blocks.json").read_text())
    picks = {arch: {int(d): {kern: tuple(p["blocks"]) for kern, p in by_k.items()}
                    for d, by_k in by_d.items()} for arch, by_d in doc["picks"].items()}
    for arch, by_d in picks.items():
        for d, by_k in by_d.items():
            assert flash.GPU_BLOCKS[arch][d] == by_k, (arch, d)
    assert set(picks) == set(flash.GPU_ARCHS) - {"sm_89"}
    assert flash.GPU_BLOCKS["sm_89"] == flash.GPU_BLOCKS["sm_86"]  # same smem limit and MMA code


def test_compile_target_drives_backend_and_blocks() -> None:
    assert flash.current_target().platform == "cpu"
    with flash.compile_target("gpu", "sm_86") as target:
        assert flash.current_target() == target == flash.Target("gpu", "sm_86")
        fwd = flash.default_block_sizes(128, "triton", target, "fwd")
        bwd = flash.default_block_sizes(128, "triton", target, "bwd")
        assert (fwd, bwd) == (flash.GPU_BLOCKS["sm_86"][128]["fwd"],
                              flash.GPU_BLOCKS["sm_86"][128]["bwd"])
        with flash.compile_target("tpu", "v5e"):
            assert flash.current_target() == flash.Target("tpu", "v5e")
        assert flash.current_target().arch == "sm_86"
    assert flash.current_target().platform == "cpu"


def test_unknown_archs_fall_back_safely() -> None:
    # Newer than the table: the smallest-shared-memory tuned table; older: small tiles.
    assert flash.default_block_sizes(64, "triton", flash.Target("gpu", "sm_120")) == \
        flash.GPU_BLOCKS["sm_86"][64]["fwd"]
    old = flash.default_block_sizes(64, "triton", flash.Target("gpu", "sm_75"), "bwd")
    assert old[0] * old[1] <= 64 * 64
    assert flash.default_block_sizes(64, "triton", flash.Target("gpu", "sm_90a")) == \
        flash.GPU_BLOCKS["sm_90"][64]["fwd"]


@pytest.mark.parametrize("bad", [("cuda", None), ("gpu", "a100"), ("tpu", "v3")])
def test_compile_target_rejects_bad_input(bad) -> None:
    with pytest.raises(ValueError, match="platform|arch"):
        with flash.compile_target(*bad):
            pass


def test_tpu_targets_use_the_tpu_kernel_table() -> None:
    from t5x_like.kernels import _flash_tpu

    fwd, bwd = _flash_tpu.default_blocks("v6e", 128)
    target = flash.Target("tpu", "v6e")
    assert flash.default_block_sizes(128, "mosaic_tpu", target, "fwd")[:2] == fwd
    assert flash.default_block_sizes(128, "mosaic_tpu", target, "bwd")[:2] == bwd
    assert flash.tpu_arch_of("TPU v5 lite") == "v5e" and flash.tpu_arch_of("TPU v5p") == "v5p"
    assert flash.tpu_arch_of("TPU v4") == "v4" and flash.tpu_arch_of("TPU v6 lite") == "v6e"


def test_gpu_arch_of() -> None:
    assert flash.gpu_arch_of("9.0") == "sm_90"
    assert flash.gpu_arch_of("8.6") == "sm_86"
    with pytest.raises(ValueError, match="compute capability"):
        flash.gpu_arch_of("hopper")


def _cfg(**kw) -> FlashConfig:
    base = dict(backend="triton", interpret=True, causal=True, has_seg=False, has_prefix=False,
                has_rel=True, has_bias=False, bias_batch=1, bias_heads=1, sm_scale=1.0,
                block_q=32, block_k=16, lq=80, lk=80, lq_pad=96, lk_pad=96, head_dim_pad=32,
                num_heads=2, group=1, num_buckets=32, num_buckets_pad=32,
                rel_bidirectional=False, rel_max_distance=24, kv_pad_mask=True, num_warps=4,
                num_stages=2, bwd_block_q=16, bwd_block_k=32, bwd_num_warps=4,
                bwd_num_stages=1)
    return FlashConfig(**{**base, **kw})


def test_padding_must_divide_every_block() -> None:
    with pytest.raises(ValueError, match="bwd_block_k"):
        _cfg(lk_pad=80, block_k=16, bwd_block_k=32)
    back = _cfg().for_backward()
    assert (back.block_q, back.block_k, back.nq, back.nk) == (16, 32, 6, 3)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_rel_band_tiles_are_the_table_lookup(bidirectional: bool) -> None:
    """Every [bq, bk] tile sliced from the bands equals table[bucket(k - q)]."""
    cfg = _cfg(rel_bidirectional=bidirectional)
    table = jnp.asarray(np.random.default_rng(0).standard_normal((2, 32)), jnp.float32)
    relband = _flash_gpu_inputs.rel_band(cfg, table)
    bq, bk = cfg.block_q, cfg.block_k
    for q0 in range(0, cfg.lq_pad, bq):
        for k0 in range(0, cfg.lk_pad, bk):
            rel = np.arange(k0, k0 + bk)[None, :] - np.arange(q0, q0 + bq)[:, None]
            want = relative_position_bucket(jnp.asarray(rel), bidirectional=bidirectional,
                                            num_buckets=32, max_distance=24)
            c = k0 - q0 + cfg.lq_pad
            np.testing.assert_array_equal(relband[1, :, c:c + bk], table[1][want])


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (32, 24), (8, 16), (4, 8)])
def test_bucket_order_follows_the_offset_axis(bidirectional: bool, num_buckets: int,
                                              max_distance: int) -> None:
    """Along r = k - q the buckets come in runs, in `bucket_order`'s order (a bucket no offset
    reaches aside), from the outermost bucket on the left to the one on the right."""
    cfg = _cfg(rel_bidirectional=bidirectional, num_buckets=num_buckets,
               num_buckets_pad=max(num_buckets, 8), rel_max_distance=max_distance)
    order = _flash_common.bucket_order(cfg)
    assert sorted(order) == list(range(num_buckets))
    rel = np.arange(-4 * max_distance, 4 * max_distance)
    bucket = np.asarray(relative_position_bucket(jnp.asarray(rel), bidirectional=bidirectional,
                                                 num_buckets=num_buckets,
                                                 max_distance=max_distance))
    runs = [int(x) for i, x in enumerate(bucket) if i == 0 or x != bucket[i - 1]]
    assert runs == [n for n in order if n in runs]
    assert (runs[0], runs[-1]) == (order[0], order[-1])


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("lq,lk,block_q,block_k,max_distance",
                         [(256, 256, 32, 16, 24), (96, 480, 16, 32, 40), (512, 96, 64, 32, 24),
                          (512, 512, 128, 64, 128)])
def test_tiles_outside_the_near_window_lie_in_one_outermost_bucket(
        bidirectional: bool, lq: int, lk: int, block_q: int, block_k: int,
        max_distance: int) -> None:
    """The Triton dQ kernel adds a tile outside its q block's window to one of the two
    outermost buckets by whole rows (`_far_tile_sums`: right of the diagonal when its least
    offset is positive): every offset of such a tile must be in that bucket. The window
    stays within the k blocks and is narrower than all of them once the length exceeds about
    2 max_distance."""
    cfg = _cfg(rel_bidirectional=bidirectional, lq=lq, lk=lk, lq_pad=lq, lk_pad=lk,
               block_q=block_q, block_k=block_k, bwd_block_q=block_q, bwd_block_k=block_k,
               rel_max_distance=max_distance)
    order = _flash_common.bucket_order(cfg)
    nwin = _flash_gpu_inputs.near_window(cfg)
    assert 1 <= nwin <= cfg.nk
    if min(lq, lk) > 2 * max_distance + block_q + 2 * block_k:
        assert nwin < cfg.nk
    far = 0
    for i in range(cfg.nq):
        j0 = int(_flash_gpu_inputs.near_first_block(cfg, i * block_q))
        assert 0 <= j0 <= cfg.nk - nwin
        for j in set(range(cfg.nk)) - set(range(j0, j0 + nwin)):
            q0, k0 = i * block_q, j * block_k
            rel = np.arange(k0, k0 + block_k)[None, :] - np.arange(q0, q0 + block_q)[:, None]
            bucket = np.asarray(relative_position_bucket(
                jnp.asarray(rel), bidirectional=bidirectional, num_buckets=32,
                max_distance=max_distance))
            rmin, _ = _flash_common.tile_offset_range(block_q, block_k, q0, k0)
            side = order[-1] if rmin > 0 else order[0]
            assert np.all(bucket == side), (i, j)
            far += 1
    assert far > 0 or nwin == cfg.nk


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance", [
    (bidirectional, n, m) for bidirectional in (False, True) for n in (8, 16, 32, 64, 128)
    for m in (16, 24, 40, 100, 128, 256, 1000)
    if m > (n // 2 if bidirectional else n) // 2])  # else no log-spaced buckets
def test_buckets_are_constant_beyond_the_window_reach(bidirectional: bool, num_buckets: int,
                                                      max_distance: int) -> None:
    """The window's reach comes from where the float64 bucket formula saturates plus one offset
    of margin; the float32 function the kernels and the band use must agree: every offset
    beyond +-reach is in its side's outermost bucket. The reach is where T5's buckets saturate,
    not max_distance: 91 against 129 for T5's own (32 buckets, 128, bidirectional)."""
    cfg = _cfg(rel_bidirectional=bidirectional, num_buckets=num_buckets,
               num_buckets_pad=num_buckets, rel_max_distance=max_distance)
    reach = _flash_gpu_inputs.window_reach(cfg)
    assert 0 <= reach <= max_distance + 1
    rel = np.arange(-4 * max_distance - 64, 4 * max_distance + 64)
    bucket = np.asarray(relative_position_bucket(jnp.asarray(rel), bidirectional=bidirectional,
                                                 num_buckets=num_buckets,
                                                 max_distance=max_distance))
    order = _flash_common.bucket_order(cfg)
    assert np.all(bucket[rel > reach] == order[-1])
    assert np.all(bucket[rel < -reach] == order[0])
    inner = rel[(bucket != order[-1]) & (bucket != order[0])]
    assert reach - 2 <= max(-inner.min(), inner.max(), 0)  # the margin is one offset, no more
    if (bidirectional, num_buckets, max_distance) == (True, 32, 128):
        assert reach == 91


def test_far_tiles_are_summed_on_their_side() -> None:
    """Both dQ kernels' far-tile sums (Hopper `far_tile_sums`, Triton `_far_tile_sums`) on T5's
    own buckets (32, 128), every tile outside its q block's window: the row sums go to the side
    (left, right) whose outermost bucket holds the whole tile. Tiles whose least offset lies
    between the reach (91) and max_distance (128) occur here (the Hopper warpgroup's 64 rows
    against 32-key tiles; Triton's 128 rows), the ones a test against max_distance would put
    on the wrong side."""
    from t5x_like.kernels import _flash_triton, _mosaic_gpu_tiles

    block_k = 32  # 64-key tiles' least offsets are 1, 65, 129, ...: none in (91, 128]
    cfg = _cfg(rel_bidirectional=True, num_buckets=32, num_buckets_pad=32, lq=768, lk=768,
               lq_pad=768, lk_pad=768, block_q=128, block_k=block_k, bwd_block_q=128,
               bwd_block_k=block_k, rel_max_distance=128)
    order, nwin = _flash_common.bucket_order(cfg), _flash_gpu_inputs.near_window(cfg)

    def hopper(q0: int, k0: int, ds: jax.Array) -> tuple:  # a warpgroup's 64 rows
        zero = jnp.zeros((64,), jnp.float32)
        return _mosaic_gpu_tiles.far_tile_sums(cfg, (zero, zero), ds, q0, k0)

    def triton(q0: int, k0: int, ds: jax.Array) -> tuple:  # the program's 128 rows
        zero = jnp.zeros((128,), jnp.float32)
        return _flash_triton._far_tile_sums(cfg, ds, q0, k0, jnp.bool_(False), (zero, zero))

    between = 0
    for i in range(cfg.nq):
        j0 = int(_flash_gpu_inputs.near_first_block(cfg, i * 128))
        for j in set(range(cfg.nk)) - set(range(j0, j0 + nwin)):
            k0 = j * block_k
            for q0, rows, fn in [(i * 128, 64, hopper), (i * 128 + 64, 64, hopper),
                                 (i * 128, 128, triton)]:
                rel = np.arange(k0, k0 + block_k)[None, :] - np.arange(q0, q0 + rows)[:, None]
                bucket = np.asarray(relative_position_bucket(jnp.asarray(rel)))
                assert len(set(bucket.ravel())) == 1
                side = [order[0], order[-1]].index(int(bucket[0, 0]))
                got = np.stack(fn(q0, k0, jnp.ones((rows, block_k), jnp.float32)))
                np.testing.assert_array_equal(got[side], block_k)
                np.testing.assert_array_equal(got[1 - side], 0)
                between += 91 < rel.min() <= 128
    assert between > 0


def test_near_window_bucket_sums_add_each_stored_element_to_its_bucket() -> None:
    """The window tiles' table gradient against a loop over their elements."""
    cfg = _cfg(rel_bidirectional=True, lq=160, lk=160, lq_pad=160, lk_pad=160, block_q=32,
               block_k=16, rel_max_distance=20)
    nwin = _flash_gpu_inputs.near_window(cfg)
    band = np.random.default_rng(1).standard_normal((2, 2, cfg.nq, 32, nwin * 16))
    got = _flash_gpu_inputs.near_window_bucket_sums(cfg, jnp.asarray(band, jnp.float32))
    want = np.zeros((2, cfg.num_buckets_pad))
    for i in range(cfg.nq):
        j0 = int(_flash_gpu_inputs.near_first_block(cfg, i * 32))
        rel = j0 * 16 + np.arange(nwin * 16)[None, :] - (i * 32 + np.arange(32)[:, None])
        bucket = np.asarray(relative_position_bucket(jnp.asarray(rel), bidirectional=True,
                                                     num_buckets=32, max_distance=20))
        for h in range(2):
            np.add.at(want[h], bucket, band[:, h, i].sum(axis=0))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("causal", [True, False])
def test_t5_table_gradient_over_many_tiles(causal: bool) -> None:
    """T5's own buckets (32, max_distance 128) over 300 positions in 32-wide tiles: tiles beyond
    max_distance, tiles a run boundary crosses and the diagonal's, against XLA's gradient."""
    rng = np.random.default_rng(3)
    b, length, h, d = 1, 300, 2, 16
    q, k, v, do = (jnp.asarray(rng.standard_normal((b, length, h, d)), jnp.float32)
                   for _ in range(4))
    table = jnp.asarray(rng.standard_normal((32, h)), jnp.float32)
    kw = dict(causal=causal, rel_bidirectional=not causal, rel_max_distance=128)

    def ours(t):
        return flash.flash_attention(q, k, v, rel_bias=t, block_q=32, block_k=32,
                                     backend="triton", **kw)

    def ref(t):
        return reference_attention(q, k, v, rel_bias=t, **kw)

    got = jax.vjp(ours, table)[1](do)[0]
    want = jax.vjp(ref, table)[1](do)[0]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    assert np.abs(np.asarray(want)).max() > 1.0


def test_segment_loop_bounds_cover_exactly_the_overlapping_blocks() -> None:
    cfg = _cfg(has_seg=True, block_q=16, block_k=16, bwd_block_q=16, bwd_block_k=16)
    rng = np.random.default_rng(1)
    seg = np.sort(rng.integers(0, 5, size=(3, 96)), axis=1)
    seg[0, 60:] = 0  # trailing padding
    seg[2] = rng.integers(0, 4, size=96)  # unsorted: bounds may be a superset
    got = _flash_gpu_inputs.segment_block_ranges(cfg, jnp.asarray(seg), jnp.asarray(seg))
    blocks = seg.reshape(3, 6, 16)
    ids = [[set(b[b != 0]) for b in row] for row in blocks]
    for b in range(3):
        for i in range(6):
            hits = [j for j in range(6) if ids[b][i] & ids[b][j]]
            lo, hi = int(got["klo"][b, i]), int(got["khi"][b, i])
            assert all(lo <= j < hi for j in hits), (b, i, hits, lo, hi)
            if b < 2:  # sorted ids: exact
                assert (lo, hi) == ((hits[0], hits[-1] + 1) if hits else (0, 0))


def test_single_segment_blocks_name_the_one_id_or_none() -> None:
    """A block's id where all its positions share one nonzero id; the sentinel where ids differ
    or any is padding (0), so such a block never matches the other side's."""
    seg = jnp.asarray([[1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0],
                       [3, 3, 3, 3, 0, 3, 3, 3, 4, 4, 4, 4, 0, 0, 0, 0]], jnp.int32)
    got = np.asarray(_flash_gpu_inputs.single_segment_blocks(seg, 4, -1))
    np.testing.assert_array_equal(got, [[1, -1, 2, -1], [3, -1, 4, -1]])
    got = np.asarray(_flash_gpu_inputs.single_segment_blocks(seg, 8, -2))
    np.testing.assert_array_equal(got, [[-2, -2], [-2, -2]])


@pytest.mark.parametrize("causal", [True, False])
def test_separate_backward_blocks_match_reference(causal: bool) -> None:
    """Forward blocks (32, 16), backward blocks (16, 32): same values and gradients as XLA."""
    rng = np.random.default_rng(2)
    b, length, h, d = 2, 100, 2, 32
    q, k, v, do = (jnp.asarray(rng.standard_normal((b, length, h, d)), jnp.float32)
                   for _ in range(4))
    table = jnp.asarray(rng.standard_normal((32, h)), jnp.float32)
    seg = np.repeat(np.arange(1, 6), 20)[None].repeat(b, 0)
    seg[1, 85:] = 0
    kw = dict(causal=causal, q_segment_ids=jnp.asarray(seg), kv_segment_ids=jnp.asarray(seg),
              rel_bidirectional=not causal, rel_max_distance=24)

    def ours(q, k, v, t):
        return flash.flash_attention(q, k, v, rel_bias=t, block_q=32, block_k=16, bwd_block_q=16,
                                  bwd_block_k=32, backend="triton", **kw)

    def ref(q, k, v, t):
        return reference_attention(q, k, v, rel_bias=t, **kw)

    got, pull = jax.vjp(ours, q, k, v, table)
    want, pull_ref = jax.vjp(ref, q, k, v, table)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
    for g, w in zip(pull(do), pull_ref(do), strict=True):
        np.testing.assert_allclose(g, w, atol=5e-5, rtol=5e-5)


def test_a_table_with_a_dense_bias_reaches_the_kernels_as_one_dense_bias(monkeypatch) -> None:
    """No kernel carries both biases: the table is added to the dense bias first (values and
    both biases' gradients as XLA's)."""
    rng = np.random.default_rng(3)
    b, length, h, d = 2, 40, 2, 16
    q, k, v, do = (jnp.asarray(rng.standard_normal((b, length, h, d)), jnp.float32)
                   for _ in range(4))
    table = jnp.asarray(rng.standard_normal((32, h)), jnp.float32)
    bias = jnp.asarray(rng.standard_normal((1, 1, length, length)), jnp.float32)
    kw = dict(causal=True, rel_bidirectional=False, rel_max_distance=24)
    configs = []
    core = flash._flash_core
    monkeypatch.setattr(flash, "_flash_core", lambda cfg, *a: configs.append(cfg) or core(cfg, *a))

    got, pull = jax.vjp(lambda t, bb: flash.flash_attention(
        q, k, v, rel_bias=t, bias=bb, block_q=16, block_k=16, backend="triton", **kw), table, bias)
    want, pull_ref = jax.vjp(lambda t, bb: reference_attention(
        q, k, v, rel_bias=t, bias=bb, **kw), table, bias)
    assert [(c.has_rel, c.has_bias, c.bias_heads) for c in configs] == [(False, True, h)]
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
    for g, w in zip(pull(do), pull_ref(do), strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=5e-5, rtol=5e-5)
