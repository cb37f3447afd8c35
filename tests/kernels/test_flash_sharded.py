"""`attention_impl='pallas'` on a multi-device mesh: the flash kernel runs inside `jax.shard_map`.

Pallas kernels are custom calls XLA cannot partition (Mosaic refuses outright on a multi-chip
TPU mesh), so `_attend_pallas` splits them over the mesh axes the logical rules give the batch
and the heads. Checked on 8 fake CPU devices (tests/conftest.py) in interpret mode: a real model's
loss and parameter gradients on data-parallel, FSDP and tensor-parallel meshes equal the
single-device XLA-attention result, and the traced step really contains the shard_map.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh

from t5x_like.models import TransformerConfig, make_model
from t5x_like.models.attention import PallasShards, pallas_shards
from t5x_like.train import partitioning
from tests.kernels.test_flash_models import TINY, _batch, assert_same_loss_and_grads

AXES = ("data", "fsdp", "model")


@pytest.mark.parametrize(
    "shape,preset,dims,want",
    [
        ((8, 1, 1), "data_parallel", (8, 4, 4), PallasShards(("data", "fsdp"), (), 1, ())),
        ((2, 4, 1), "fsdp", (8, 4, 4), PallasShards(("data", "fsdp"), (), 1, ())),
        ((2, 1, 4), "tensor_parallel", (8, 4, 4), PallasShards(("data", "fsdp"), ("model",), 1,
                                                                ())),
        # GQA: 2 kv heads over 4 model shards -> repeated to lcm(2, 4) = 4 heads first.
        ((2, 1, 4), "tensor_parallel", (8, 8, 2), PallasShards(("data", "fsdp"), ("model",), 2,
                                                                ())),
        # MQA: the single kv head is repeated to one per model shard.
        ((2, 1, 4), "tensor_parallel", (8, 8, 1), PallasShards(("data", "fsdp"), ("model",), 4,
                                                                ())),
        # Batch 6 is not divisible by fsdp=4 after data=2; heads 6 not by model=4.
        ((2, 4, 1), "fsdp", (6, 6, 6), PallasShards(("data",), (), 1, ("fsdp",))),
        ((1, 2, 4), "tensor_parallel", (6, 6, 6), PallasShards(("data", "fsdp"), (), 1,
                                                                ("model",))),
    ],
)
def test_shard_plan_follows_the_logical_rules(shape, preset, dims, want) -> None:
    mesh = AbstractMesh(shape, AXES)
    with nn.logical_axis_rules(partitioning.logical_axis_rules(preset)):
        assert pallas_shards(mesh, *dims) == want


def test_no_mesh_or_one_device_calls_the_kernel_directly() -> None:
    with nn.logical_axis_rules(partitioning.logical_axis_rules("tensor_parallel")):
        assert pallas_shards(AbstractMesh((), ()), 8, 4, 4) is None
        assert pallas_shards(AbstractMesh((1, 1, 1), AXES), 8, 4, 4) is None


def _loss_and_grads(family, impl, batch, params, mesh_shape=None, preset=None, kv_heads=None):
    model = make_model(TransformerConfig(family=family, attention_impl=impl,
                                         num_kv_heads=kv_heads, **TINY))
    fn = jax.jit(jax.value_and_grad(lambda p: model.loss_fn(p, batch, None)[0]))
    if mesh_shape is None:
        return fn(params), None
    mesh = partitioning.create_mesh(mesh_shape, devices=jax.devices()[: int(np.prod(mesh_shape))])
    with partitioning.partitioning_context(mesh, partitioning.logical_axis_rules(preset)):
        jaxpr = str(jax.make_jaxpr(fn)(params))
        return fn(params), jaxpr


@pytest.mark.parametrize(
    "family,mesh_shape,preset,kv_heads",
    [
        ("encoder_decoder", (8, 1, 1), "data_parallel", None),
        ("encoder_decoder", (2, 4, 1), "fsdp", None),
        ("encoder_decoder", (2, 1, 4), "tensor_parallel", None),
        ("prefix_lm", (2, 2, 2), "tensor_parallel_2d", 1),
    ],
)
def test_sharded_pallas_model_matches_single_device_xla(family, mesh_shape, preset,
                                                        kv_heads, test_seed) -> None:
    assert len(jax.devices()) >= 8, "tests/conftest.py should give 8 fake CPU devices"
    seed = test_seed
    rng = np.random.default_rng(seed)
    batch = {k: jnp.asarray(v) for k, v in _batch(family, rng, b=8).items()}
    model = make_model(TransformerConfig(family=family, num_kv_heads=kv_heads, **TINY))
    params = nn.unbox(model.init_variables(jax.random.PRNGKey(seed % 1000), batch))["params"]
    xla, _ = _loss_and_grads(family, "xla", batch, params, kv_heads=kv_heads)
    pallas, jaxpr = _loss_and_grads(family, "pallas", batch, params, mesh_shape, preset, kv_heads)
    assert "shard_map" in jaxpr, "the flash kernel was not wrapped in shard_map"
    if preset.startswith("tensor_parallel"):
        assert "'model'" in jaxpr  # heads split over the model axis inside the shard_map
    assert_same_loss_and_grads(xla, pallas, seed)
