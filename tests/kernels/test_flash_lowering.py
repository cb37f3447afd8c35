"""The real (non-interpret) lowerings, checked on CPU by cross-platform export.

`jax.export(..., platforms=['cuda'])` runs the Pallas -> Triton lowering of all three kernels
(forward, dK/dV, dQ) and `platforms=['tpu']` (with an abstract TPU device) the Pallas -> Mosaic
lowering, for a call using every feature at once. This catches kernels that only work in
interpret mode (unsupported ops, non-power-of-two Triton shapes, illegal Mosaic blocks). It does
not run the backend compilers (ptxas / libtpu) or the kernels themselves.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import pytest
from jax import export

from t5x_like.kernels import flash_attention

B, L, H, HKV, D = 2, 200, 4, 2, 64


def _loss_grad(backend: str, block_q: int, block_k: int):
    def loss(q, k, v, table, seg, prefix, bias):
        out = flash_attention(q, k, v, causal=True, rel_bias=table, rel_bidirectional=False,
                              q_segment_ids=seg, kv_segment_ids=seg, prefix_mask=prefix,
                              bias=bias, backend=backend, interpret=False, block_q=block_q,
                              block_k=block_k)
        return jnp.sum(out.astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 6)))


ARGS = (
    jax.ShapeDtypeStruct((B, L, H, D), jnp.bfloat16),
    jax.ShapeDtypeStruct((B, L, HKV, D), jnp.bfloat16),
    jax.ShapeDtypeStruct((B, L, HKV, D), jnp.bfloat16),
    jax.ShapeDtypeStruct((32, H), jnp.float32),
    jax.ShapeDtypeStruct((B, L), jnp.int32),
    jax.ShapeDtypeStruct((B, L), jnp.bool_),
    jax.ShapeDtypeStruct((1, H, L, L), jnp.bfloat16),
)


@pytest.mark.parametrize(
    "platform,backend,blocks,target",
    [("cuda", "triton", (64, 32), "__gpu$xla.gpu.triton"),
     ("tpu", "mosaic_tpu", (128, 128), "tpu_custom_call")],
)
def test_kernels_lower_for_real_hardware(platform, backend, blocks, target) -> None:
    context = contextlib.nullcontext()
    if platform == "tpu":
        device = jax.sharding.AbstractDevice("TPU v5 lite", 1, "tpu")
        mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
        context = jax.sharding.use_abstract_mesh(mesh)
    with context:
        exported = export.export(
            _loss_grad(backend, *blocks), platforms=[platform],
            disabled_checks=[export.DisabledSafetyCheck.custom_call(target)],
        )(*ARGS)
    text = exported.mlir_module()
    assert text.count(f"custom_call @{target}") == 3  # forward, dK/dV, dQ kernels
