"""Mesh construction, logical rules, sharded init, and mesh invariance of a train step."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from t5x_like.train import partitioning, train_state, train_step
from t5x_like.train.optimizers import create_optimizer, rsqrt_schedule
from tests.train.conftest import sharded_plan
from tests.train.toy import ToyModel, toy_batch

# The real model under the fsdp and 2-D presets: tests/train/test_mesh_invariance.py.
MESHES = [
    ((8, 1, 1), "data_parallel"),
    ((2, 1, 4), "tensor_parallel"),
]


def test_resolve_mesh_shape_fills_minus_one_and_checks_product() -> None:
    assert partitioning.resolve_mesh_shape((-1, 2, 1), 8) == (4, 2, 1)
    assert partitioning.resolve_mesh_shape((1, -1, 4), 8) == (1, 2, 4)
    with pytest.raises(ValueError, match="uses 4 devices"):
        partitioning.resolve_mesh_shape((2, 2, 1), 8)
    with pytest.raises(ValueError, match="at most one -1"):
        partitioning.resolve_mesh_shape((-1, -1, 1), 8)


def test_rules_map_logical_names_and_drop_indivisible_axes() -> None:
    mesh = partitioning.create_mesh((2, 2, 2))
    tp = partitioning.logical_axis_rules("tensor_parallel_2d")
    spec = partitioning.mesh_spec
    assert spec(("embed", "mlp"), (16, 32), mesh, tp) == PartitionSpec("fsdp", "model")
    assert spec(("embed", "mlp"), (15, 32), mesh, tp) == PartitionSpec(None, "model")
    fsdp = partitioning.logical_axis_rules("fsdp")
    # embed takes fsdp first; mlp falls back to unsharded in the same array.
    assert spec(("embed", "mlp"), (16, 32), mesh, fsdp) == PartitionSpec("fsdp", None)
    assert partitioning.batch_sharding(mesh, fsdp).spec == PartitionSpec(("data", "fsdp"), None)
    with pytest.raises(ValueError, match="preset"):
        partitioning.logical_axis_rules("zero9")


def _plan(mesh_shape, preset, optimizer=None):
    opt = optimizer or create_optimizer("adamw", schedule=lambda s: 1e-2)
    model = ToyModel()
    mesh, rules, plan = sharded_plan(model, opt, model.example_batch(8, {"targets": 8}),
                                     mesh_shape, preset)
    return model, opt, mesh, rules, plan


def test_state_is_created_sharded_and_optimizer_state_follows_params() -> None:
    opt = create_optimizer("adafactor", schedule=rsqrt_schedule(1.0, 10))
    _, opt, mesh, rules, plan = _plan((1, 8, 1), "fsdp", opt)
    state = train_state.create_state(plan, jax.random.key(0), mesh, rules)
    emb = state.params["embedding"]
    assert emb.sharding.spec == PartitionSpec(None, "fsdp")
    # Each device holds 1/8 of the embedding: no full copy anywhere.
    assert {s.data.shape for s in emb.addressable_shards} == {(64, 2)}
    shardings = jax.tree.leaves(plan.shardings.opt_state)
    assert any("fsdp" in str(s.spec) for s in shardings)


def _two_steps(batch, shape, preset):
    model, opt, mesh, rules, plan = _plan(shape, preset)
    state = train_state.create_state(plan, jax.random.key(0), mesh, rules)
    step = train_step.jit_train_step(train_step.make_train_step(model, opt), plan, mesh, rules)
    losses = []
    for _ in range(2):
        state, m = step(state, batch, jax.random.key(2))
        losses.append(float(m["loss"]))
    return losses, jax.device_get(state.params)


@pytest.fixture(scope="module")
def reference():
    batch = toy_batch(jax.random.key(1))
    return batch, _two_steps(batch, (1, 1, 1), "data_parallel")


@pytest.mark.parametrize(("mesh_shape", "preset"), MESHES)
def test_two_steps_are_mesh_invariant(reference, mesh_shape, preset) -> None:
    batch, (ref_losses, ref_params) = reference
    losses, params = _two_steps(batch, mesh_shape, preset)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 params, ref_params)
