"""`multi_tensor`: optimizer math on stacks of same-shaped parameters equals it leaf by leaf,
keeps the transformation's own state, and compiles to fewer reductions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t5x_like.train import multi_tensor
from t5x_like.train.optimizers import adafactor, adamw, constant_schedule, create_optimizer

# Repeated shapes (as in a Transformer's layers), vectors, an unfactored table, and keys that
# end alike at different depths ('b' / 'a'.'b'): a state leaf must find its own parameter.
SHAPES = {"a": {"b": (256, 128), "s": (256,)}, "b": (256, 128),
          "layers": {"0": {"q": (256, 128), "s": (256,)}, "1": {"q": (256, 128), "s": (256,)}},
          "emb": (512, 256), "rel": (32, 4)}


def _tree(rng: np.random.Generator, scale: float = 1.0) -> dict:
    return jax.tree.map(lambda s: jnp.asarray(scale * rng.standard_normal(s), jnp.float32),
                        SHAPES, is_leaf=lambda x: isinstance(x, tuple))


@pytest.mark.parametrize("make", [adafactor, adamw], ids=["adafactor", "adamw"])
def test_by_shape_equals_leaf_by_leaf(make) -> None:
    """Five steps of T5's Adafactor (factored, clipped, parameter-scaled) and of masked AdamW:
    the same parameters and state to float rounding, in the same state structure."""
    rng = np.random.default_rng(0)
    tx = make(constant_schedule(1e-2))
    ours = multi_tensor.by_shape(tx)
    params = _tree(rng)
    ref_p, our_p = params, params
    ref_s, our_s = tx.init(params), ours.init(params)
    ref_up, our_up = jax.jit(tx.update), jax.jit(ours.update)
    for _ in range(5):
        grads = _tree(rng, 0.1)
        u, ref_s = ref_up(grads, ref_s, ref_p)
        ref_p = optax.apply_updates(ref_p, u)
        u, our_s = our_up(grads, our_s, our_p)
        our_p = optax.apply_updates(our_p, u)
    assert jax.tree.structure(our_s) == jax.tree.structure(ref_s)
    for got, want in zip(jax.tree.leaves((our_p, our_s)), jax.tree.leaves((ref_p, ref_s)),
                         strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    moved = max(float(jnp.abs(a - b).max()) for a, b in
                zip(jax.tree.leaves(our_p), jax.tree.leaves(params), strict=True))
    assert moved > 1e-3  # the steps did something


def test_by_shape_compiles_fewer_reductions() -> None:
    """Six parameters of two shapes: the optimizer's reductions run once per shape."""
    rng = np.random.default_rng(1)
    params = {f"w{i}": jnp.asarray(rng.standard_normal((256, 128)), jnp.float32)
              for i in range(4)}
    params.update(v0=jnp.ones((256,)), v1=jnp.ones((256,)))
    tx = adafactor(constant_schedule(1e-2))

    def reductions(t: optax.GradientTransformation) -> int:
        text = jax.jit(t.update).lower(params, t.init(params), params).as_text()
        return text.count("stablehlo.reduce")

    assert reductions(multi_tensor.by_shape(tx)) * 2 < reductions(tx)


def test_global_norm_and_errors() -> None:
    tree = _tree(np.random.default_rng(2))
    assert float(multi_tensor.global_norm(tree)) == pytest.approx(
        float(optax.global_norm(tree)), rel=1e-6)
    assert float(multi_tensor.global_norm({})) == 0.0
    opt = create_optimizer("adafactor", multi_tensor=True)
    with pytest.raises(ValueError, match="needs params"):
        opt.tx.update(tree, opt.tx.init(tree))
    plain = create_optimizer("adafactor")  # leaf by leaf unless asked
    updates, _ = plain.tx.update(tree, plain.tx.init(tree), tree)
    assert jax.tree.structure(updates) == jax.tree.structure(tree)


def test_trainer_step_on_an_fsdp_mesh_equals_leaf_by_leaf() -> None:
    """The real train step (a tiny T5 v1.1 whose matrices Adafactor factors, parameters split
    over a 4-way `fsdp` axis): two steps give the same metrics and parameters either way."""
    from t5x_like.models import TransformerConfig, make_model
    from t5x_like.train import train_state, train_step
    from tests.models.test_families import TINY, make_batch
    from tests.train.conftest import sharded_plan

    cfg = TransformerConfig(**{**TINY, "emb_dim": 128, "mlp_dim": 256, "num_heads": 4,
                               "head_dim": 32, "mlp_activations": ("gelu", "linear")})
    model, batch = make_model(cfg), make_batch(cfg, packed=True)
    batch = {k: np.concatenate([v, v]) for k, v in batch.items()}  # 4 examples over 4 shards
    out = []
    for grouped in (False, True):
        opt = create_optimizer("adafactor", schedule=constant_schedule(1e-2),
                               multi_tensor=grouped)
        mesh, rules, plan = sharded_plan(model, opt, batch, (1, 4, 1), "fsdp")
        state = train_state.create_state(plan, jax.random.key(0), mesh, rules)
        step = train_step.jit_train_step(train_step.make_train_step(model, opt), plan, mesh,
                                         rules)
        for i in range(2):
            state, metrics = step(state, batch, jax.random.key(i))
        out.append((jax.device_get(state.params), {k: float(v) for k, v in metrics.items()}))
    (p0, m0), (p1, m1) = out
    for key in ("loss", "grad_norm", "param_norm"):
        assert m1[key] == pytest.approx(m0[key], rel=1e-6), key
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), p1, p0)
