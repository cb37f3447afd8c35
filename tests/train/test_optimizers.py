"""Schedules, T5's Adafactor settings, clipping, and gradient-accumulation equivalence."""

from __future__ import annotations

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t5x_like.train import train_state, train_step
from t5x_like.train.optimizers import (
    create_optimizer,
    rsqrt_schedule,
    warmup_cosine_schedule,
    warmup_linear_schedule,
)
from tests.train.conftest import sharded_plan
from tests.train.toy import ToyModel, toy_batch


def test_rsqrt_schedule_is_constant_during_warmup_then_decays() -> None:
    s = rsqrt_schedule(1.0, 10_000)
    assert float(s(0)) == pytest.approx(0.01)
    assert float(s(9_999)) == pytest.approx(0.01)
    assert float(s(40_000)) == pytest.approx(1 / 200)


def test_warmup_cosine_and_linear_schedules() -> None:
    cos = warmup_cosine_schedule(1e-3, 10, 110, 0.0)
    lin = warmup_linear_schedule(1e-3, 10, 110, 0.0)
    for s in (cos, lin):
        assert float(s(0)) == 0.0
        assert float(s(5)) == pytest.approx(5e-4)
        assert float(s(10)) == pytest.approx(1e-3)
        assert float(s(110)) == pytest.approx(0.0, abs=1e-9)
    assert float(cos(60)) == pytest.approx(5e-4, rel=1e-3)
    assert float(lin(60)) == pytest.approx(5e-4, rel=1e-3)


def test_adafactor_is_factored_without_momentum_and_gin_configurable() -> None:
    params = {"w": jnp.ones((256, 384)), "b": jnp.ones((384,))}
    opt = create_optimizer("adafactor")
    state = opt.tx.init(params)
    shapes = sorted({tuple(x.shape) for x in jax.tree.leaves(state)})
    assert (256,) in shapes and (384,) in shapes  # row / column second moments
    assert (256, 384) not in shapes  # neither a full second moment nor momentum
    with gin.unlock_config():
        gin.parse_config("adafactor.decay_rate = 0.5\ncreate_optimizer.name = 'adamw'")
    try:
        assert gin.query_parameter("adafactor.decay_rate") == 0.5
        opt = create_optimizer()
        is_adam = lambda x: isinstance(x, optax.ScaleByAdamState)
        assert any(is_adam(s) for s in jax.tree.leaves(opt.tx.init(params), is_leaf=is_adam))
    finally:
        gin.clear_config()
    with pytest.raises(ValueError, match="choose one of"):
        create_optimizer("sgdd")


def test_global_norm_clipping_bounds_the_update() -> None:
    opt = create_optimizer("adamw", schedule=lambda s: 1.0, grad_clip_norm=0.5)
    params = {"w": jnp.zeros((4,))}
    grads = {"w": jnp.array([30.0, 40.0, 0.0, 0.0])}
    clip = optax.clip_by_global_norm(0.5)
    clipped, _ = clip.update(grads, clip.init(params))
    assert float(optax.global_norm(clipped)) == pytest.approx(0.5)
    updates, _ = opt.tx.update(grads, opt.tx.init(params), params)
    assert np.all(np.isfinite(np.asarray(updates["w"])))


def test_gradient_accumulation_equals_full_batch_update() -> None:
    model, opt = ToyModel(), create_optimizer("adamw", schedule=lambda s: 1e-2)
    mesh, rules, plan = sharded_plan(model, opt, model.example_batch(4, {"targets": 8}),
                                     (2, 2, 1), "fsdp")
    batch = toy_batch(jax.random.key(3), batch=16)
    # Ragged token counts per microbatch: a naive mean of microbatch means would differ.
    assert len({int(batch["decoder_loss_weights"][i::4].sum()) for i in range(4)}) > 1
    out = []
    for n in (1, 4):
        state = train_state.create_state(plan, jax.random.key(0), mesh, rules)
        step = train_step.jit_train_step(
            train_step.make_train_step(model, opt, num_microbatches=n), plan, mesh, rules)
        state, m = step(state, batch, jax.random.key(1))
        out.append((jax.device_get(state.params), {k: float(v) for k, v in m.items()}))
    (p1, m1), (p4, m4) = out
    for key in ("loss", "grad_norm", "accuracy", "num_tokens"):
        assert m1[key] == pytest.approx(m4[key], rel=1e-5), key
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), p1, p4)


def test_skip_policy_keeps_params_on_nonfinite_loss() -> None:
    model, opt = ToyModel(), create_optimizer("adamw", schedule=lambda s: 1e-2)
    mesh, rules, plan = sharded_plan(model, opt, model.example_batch(1, {"targets": 8}),
                                     (1, 1, 1), "data_parallel")
    state = train_state.create_state(plan, jax.random.key(0), mesh, rules)
    before = jax.device_get(state.params)
    state = state.replace(params={**state.params, "scale": state.params["scale"] * jnp.nan})
    bad = jax.device_get(state.params)
    step = train_step.jit_train_step(
        train_step.make_train_step(model, opt, on_nonfinite="skip"), plan, mesh, rules)
    state, m = step(state, toy_batch(jax.random.key(1)), jax.random.key(1))
    assert float(m["finite"]) == 0.0 and int(state.step) == 1
    np.testing.assert_array_equal(jax.device_get(state.params)["wi"], bad["wi"])
    np.testing.assert_array_equal(bad["wi"], before["wi"])
    with pytest.raises(ValueError, match="on_nonfinite"):
        train_step.make_train_step(model, opt, on_nonfinite="ignore")
