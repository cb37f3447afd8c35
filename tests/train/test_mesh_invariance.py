"""One real train step (real model, real span-corruption batch) gives the same loss on any mesh."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from t5x_like.models import make_model
from t5x_like.train import train_state, train_step
from t5x_like.train.optimizers import create_optimizer
from tests.train.conftest import sharded_plan, tiny_config

SEQ = {"inputs": 32, "targets": 8}


@pytest.fixture(scope="module")
def batch() -> dict[str, np.ndarray]:
    from t5x_like.data import get_dataset

    ds = get_dataset("c4like_span_corruption", split="train", sequence_length=SEQ, batch_size=8,
                     model_family="encoder_decoder", vocabulary="c4like_8k", seed=0,
                     shuffle=False)
    return {k: np.asarray(v) for k, v in next(iter(ds)).items()}


def _one_step(batch, mesh_shape, preset):
    model = make_model(tiny_config())
    opt = create_optimizer("adafactor")
    mesh, rules, plan = sharded_plan(model, opt, model.example_batch(8, SEQ, packed=True),
                                     mesh_shape, preset)
    state = train_state.create_state(plan, jax.random.key(0), mesh, rules)
    step = train_step.jit_train_step(train_step.make_train_step(model, opt), plan, mesh, rules)
    losses = []
    state, metrics = step(state, batch, jax.random.key(1))
    losses.append(float(metrics["loss"]))
    losses.append(float(metrics["grad_norm"]))
    emb = state.params["token_embedder"]["embedding"]
    return losses, np.asarray(jax.device_get(emb)), emb.sharding.spec


def test_loss_is_the_same_whatever_the_mesh(batch) -> None:
    assert batch["encoder_input_tokens"].shape == (8, 32)
    ref_losses, ref_emb, _ = _one_step(batch, (1, 1, 1), "data_parallel")
    assert 8.0 < ref_losses[0] < 10.5  # ~ln(8192) at init; [loss, grad_norm]
    for shape, preset, expect_spec in [
        ((2, 4, 1), "fsdp", (None, "fsdp")),
        ((2, 2, 2), "tensor_parallel_2d", ("model", "fsdp")),
    ]:
        losses, emb, spec = _one_step(batch, shape, preset)
        assert tuple(spec) == expect_spec
        np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)
        np.testing.assert_allclose(emb, ref_emb, rtol=1e-4, atol=1e-6)
