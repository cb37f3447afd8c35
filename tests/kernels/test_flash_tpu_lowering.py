"""What the Mosaic TPU kernels hand the TPU compiler, checked by cross-platform export on CPU.

Every `pallas_call` carries a cost estimate (XLA's cost analysis otherwise counts zero FLOPs
inside the kernels) and a scoped-VMEM limit sized from its blocks; the logsumexp residual is a
lane-major `[B, H, 1, Lq]` row (a `[B, H, Lq, 1]` column is padded to 128 lanes in HBM).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from t5x_like.kernels import _flash_tpu, flash_attention
from t5x_like.kernels._flash_common import FlashConfig

B, L, H, D = 2, 512, 4, 128
MIB = 2**20


def _export(device_kind: str, blocks: tuple[int, int, int, int]) -> str:
    def loss(q, k, v, table):
        out = flash_attention(q, k, v, causal=True, rel_bias=table, rel_bidirectional=False,
                              backend="mosaic_tpu", interpret=False, block_q=blocks[0],
                              block_k=blocks[1], bwd_block_q=blocks[2], bwd_block_k=blocks[3])
        return jnp.sum(out.astype(jnp.float32))

    qkv = jax.ShapeDtypeStruct((B, L, H, D), jnp.bfloat16)
    mesh = jax.sharding.AbstractMesh(
        (1,), ("x",), abstract_device=jax.sharding.AbstractDevice(device_kind, 1, "tpu"))
    with jax.sharding.use_abstract_mesh(mesh):
        exported = export.export(
            jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))), platforms=["tpu"],
            disabled_checks=[export.DisabledSafetyCheck.custom_call("tpu_custom_call")],
        )(qkv, qkv, qkv, jax.ShapeDtypeStruct((32, H), jnp.float32))
    return exported.mlir_module()


def _configs(text: str) -> list[str]:
    return re.findall(r"custom_call @tpu_custom_call\(.*?backend_config = \"(.*?)\"", text)


@pytest.mark.parametrize(
    "kind,blocks,expect_mib",
    [("TPU v5 lite", (128, 128, 128, 128), [16, 16, 16]),  # fits v5e's default 16 MiB
     ("TPU v5 lite", (1024, 1024, 512, 512), None),  # the fwd needs more: limit raised
     ("TPU v6 lite", (256, 256, 256, 256), [32, 32, 32])],  # v6e's default is 32 MiB
)
def test_every_kernel_has_cost_and_vmem_limit(kind, blocks, expect_mib) -> None:
    configs = _configs(_export(kind, blocks))
    assert len(configs) == 3  # forward, dK/dV, dQ
    limits = []
    for cfg in configs:
        flops = re.search(r"cost_estimate\\22: \{[^}]*?flops\\22:(\d+)", cfg)
        assert flops and int(flops.group(1)) > 0
        size = re.search(r"scoped_memory_configs\\22: \[\{.*?size\\22: (\d+)", cfg)
        assert size, "no vmem_limit_bytes"
        limits.append(int(size.group(1)) // MIB)
    if expect_mib is not None:
        assert limits == expect_mib
    else:
        assert limits[0] > 16 and limits[0] <= 96, limits


def test_vmem_limit_follows_the_footprint() -> None:
    v5e, v4 = ("v5e", 128 * MIB), ("v4", 16 * MIB)
    assert _flash_tpu.vmem_limit(4 * MIB, v5e) == 16 * MIB  # the default scoped VMEM
    assert _flash_tpu.vmem_limit(40 * MIB, v5e) == 52 * MIB  # 40 * 1.25 + 2
    assert _flash_tpu.vmem_limit(200 * MIB, v5e) == 96 * MIB  # capped at 3/4 of VMEM
    assert _flash_tpu.vmem_limit(40 * MIB, v4) == 16 * MIB  # never below the default
    assert _flash_tpu.vmem_limit(4 * MIB, None) is None  # not a TPU (interpret mode)


@pytest.mark.parametrize("arch", ["v4", "v5e", "v5p", "v6e"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_default_blocks_are_mxu_multiples(arch, head_dim) -> None:
    (fq, fk), (bq, bk) = _flash_tpu.default_blocks(arch, head_dim)
    mxu = 256 if arch == "v6e" else 128
    assert all(b % mxu == 0 for b in (fq, fk, bq, bk))


def _cfg(lq: int, bq: int, bk: int, causal: bool) -> FlashConfig:
    return FlashConfig(
        backend="mosaic_tpu", interpret=True, causal=causal, has_seg=False, has_prefix=False,
        has_rel=False, has_bias=False, bias_batch=1, bias_heads=1, sm_scale=1.0, block_q=bq,
        block_k=bk, lq=lq, lk=lq, lq_pad=lq, lk_pad=lq, head_dim_pad=64, num_heads=2, group=1,
        num_buckets=0, num_buckets_pad=0, rel_bidirectional=True, rel_max_distance=128,
        kv_pad_mask=False, num_warps=4, num_stages=2, bwd_block_q=bq, bwd_block_k=bk,
        bwd_num_warps=4, bwd_num_stages=2)


def test_visited_fraction_counts_causal_tiles() -> None:
    assert _flash_tpu.visited_fraction(_cfg(512, 128, 128, False)) == 1.0
    assert _flash_tpu.visited_fraction(_cfg(512, 128, 128, True)) == 10 / 16
    ones = np.tril(np.ones((512, 512)))  # the element-level share tends to 1/2 with small tiles
    assert abs(_flash_tpu.visited_fraction(_cfg(512, 16, 16, True)) - ones.mean()) < 0.02


def test_logsumexp_residual_is_a_lane_major_row() -> None:
    cfg = _cfg(256, 128, 128, False)
    q = jax.ShapeDtypeStruct((B, 256, 2, 64), jnp.float32)
    _, lse = jax.eval_shape(lambda q: _flash_tpu.forward(cfg, q, q, q, {}), q)
    assert lse.shape == (B, 2, 1, 256)


def test_backward_blocks_differ_from_forward_blocks(test_seed: int) -> None:
    """The row residuals do not depend on the blocks: fwd (32, 16) and bwd (16, 32) tiles give
    the reference gradients (TPU interpret mode, f32, packed segments + causal T5 table)."""
    from t5x_like.kernels._flash_reference import reference_attention

    seed = test_seed
    rng = np.random.default_rng(seed)
    q, k, v, do = (jnp.asarray(rng.standard_normal((1, 64, 2, 32)), jnp.float32)
                   for _ in range(4))
    table = jnp.asarray(rng.standard_normal((16, 2)), jnp.float32)
    seg = jnp.asarray(np.repeat([[1, 2, 2, 0]], 16, axis=1))
    common = dict(causal=True, rel_bidirectional=False, rel_max_distance=20, q_segment_ids=seg,
                  kv_segment_ids=seg)

    def ours(q, k, v, t):
        return flash_attention(q, k, v, rel_bias=t, block_q=32, block_k=16, bwd_block_q=16,
                               bwd_block_k=32, backend="mosaic_tpu", **common)

    def ref(q, k, v, t):
        return reference_attention(q, k, v, rel_bias=t, **common)

    got_o, pull = jax.vjp(jax.jit(ours), q, k, v, table)
    want_o, pull_ref = jax.vjp(ref, q, k, v, table)
    np.testing.assert_allclose(got_o, want_o, atol=2e-5, err_msg=f"seed={seed}")
    for name, got, want in zip(("dq", "dk", "dv", "dtable"), pull(do), pull_ref(do),
                               strict=True):
        scale = max(1.0, float(jnp.max(jnp.abs(want))))
        np.testing.assert_allclose(got, want, atol=5e-5 * scale, err_msg=f"{name} seed={seed}")
