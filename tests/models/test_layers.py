"""Building blocks: projections, relative buckets, RoPE, norms, MLP naming."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like.models import TransformerConfig
from t5x_like.models.layers import (
    MlpBlock,
    RMSNorm,
    apply_rope,
    gated_activation,
    project,
    relative_bias,
    rope_frequencies,
)


def _buckets(rel: list[int], bidirectional: bool) -> list[int]:
    """Bucket ids through `relative_bias` with a table whose entry b is b (one head)."""
    table = jnp.arange(32, dtype=jnp.float32)[None]  # [heads=1, buckets=32]
    k_index = jnp.asarray(rel, jnp.int32)[None]  # query at 0: relative position = k
    bias = relative_bias(
        table, jnp.zeros((1, 1), jnp.int32), k_index, bidirectional=bidirectional, max_distance=128
    )
    return [int(b) for b in bias[0, 0, 0]]


def test_bidirectional_buckets_match_hand_computed_values():
    # 16 buckets per direction, 8 exact; beyond: 8 + floor(8 * log(d / 8) / log(128 / 8)).
    rel = [0, -1, -7, -8, -11, -12, -17, -100, -128, -1000, 1, 7, 8, 17, 1000]
    expected = [0, 1, 7, 8, 8, 9, 10, 15, 15, 15, 17, 23, 24, 26, 31]
    assert _buckets(rel, bidirectional=True) == expected


def test_causal_buckets_match_hand_computed_values():
    # Future keys share bucket 0; 16 exact; beyond: 16 + floor(16 * log(d / 16) / log(8)).
    rel = [5, 0, -3, -15, -16, -32, -64, -127, -200]
    expected = [0, 0, 3, 15, 16, 21, 26, 31, 31]
    assert _buckets(rel, bidirectional=False) == expected


def test_relative_bias_shape_and_offsets():
    table = jax.random.normal(jax.random.PRNGKey(0), (3, 32))
    idx = jnp.arange(5)[None]
    bias = relative_bias(table, idx, idx, bidirectional=True, max_distance=128)
    assert bias.shape == (1, 3, 5, 5)
    np.testing.assert_allclose(bias[0, :, 2, 2], table[:, 0])  # same position: bucket 0
    np.testing.assert_allclose(bias[0, :, 3, 1], bias[0, :, 4, 2])  # translation invariant


@pytest.mark.parametrize("scaling", ["none", "linear", "yarn"])
def test_rope_scores_depend_only_on_relative_position(scaling):
    cfg = TransformerConfig(
        head_dim=16, position_encoding="rope", rope_scaling=scaling, rope_scaling_factor=4.0
    )
    q, k = jax.random.normal(jax.random.PRNGKey(1), (2, 1, 1, 1, 16))

    def score(m, n):
        qm = apply_rope(q, jnp.full((1, 1), m), cfg)
        kn = apply_rope(k, jnp.full((1, 1), n), cfg)
        return float(jnp.sum(qm * kn))

    assert score(7, 3) == pytest.approx(score(104, 100), rel=1e-4, abs=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 5), rel=1e-3)


def test_rope_linear_scaling_interpolates_positions():
    plain = TransformerConfig(head_dim=8, position_encoding="rope")
    linear = plain.replace(rope_scaling="linear", rope_scaling_factor=4.0)
    x = jax.random.normal(jax.random.PRNGKey(2), (1, 3, 2, 8))
    pos = jnp.asarray([[0, 5, 9]])
    np.testing.assert_allclose(
        apply_rope(x, pos * 4, linear), apply_rope(x, pos, plain), rtol=1e-5, atol=1e-5
    )


def test_yarn_keeps_high_frequencies_and_interpolates_low_ones():
    cfg = TransformerConfig(
        head_dim=64, rope_scaling="yarn", rope_scaling_factor=8.0, rope_original_max_length=256
    )
    base, _ = rope_frequencies(cfg.replace(rope_scaling="none"))
    yarn, mscale = rope_frequencies(cfg)
    assert yarn[0] == pytest.approx(base[0])  # fastest pair: many rotations, untouched
    assert yarn[-1] == pytest.approx(base[-1] / 8.0)  # slowest pair: fully interpolated
    assert np.all(yarn <= base + 1e-12) and mscale == pytest.approx(0.1 * np.log(8.0) + 1.0)


def test_rmsnorm_normalises_scale_only():
    x = jnp.asarray([[1.0, 2.0, 3.0, 4.0]])
    y, _ = RMSNorm().init_with_output(jax.random.PRNGKey(0), x)
    np.testing.assert_allclose(y, x / np.sqrt(np.mean(np.square(x)) + 1e-6), rtol=1e-6)


@pytest.mark.parametrize(
    "acts,names", [(("relu",), {"wi", "wo"}), (("silu", "linear"), {"wi_0", "wi_1", "wo"})]
)
def test_mlp_parameter_names(acts, names):
    cfg = TransformerConfig(emb_dim=8, mlp_dim=16, mlp_activations=acts, dtype="float32")
    params = MlpBlock(cfg).init(jax.random.PRNGKey(0), jnp.ones((1, 2, 8)), True)["params"]
    assert set(params) == names
    assert nn.get_partition_spec(params)["wo"]["kernel"] == jax.sharding.PartitionSpec(
        "mlp", "embed"
    )


def test_gated_activation_keeps_only_its_inputs_for_the_backward():
    """GeGLU's backward recomputes gelu(a) from the projections: the vjp holds a and b, not
    gelu(a) or its derivative's pieces; values and gradients are autodiff's."""
    rng = np.random.default_rng(0)
    a, b, dy = (jnp.asarray(rng.standard_normal((2, 4, 16)), jnp.float32) for _ in range(3))
    plain = lambda a, b: nn.gelu(a, approximate=True) * b  # noqa: E731
    ours = lambda a, b: gated_activation(("gelu", "linear"), a, b)  # noqa: E731
    (y0, vjp0), (y1, vjp1) = jax.vjp(plain, a, b), jax.vjp(ours, a, b)
    kept = lambda vjp: [r for r in jax.tree.leaves(vjp) if jnp.shape(r) == a.shape]  # noqa: E731
    assert len(kept(vjp0)) > 2 and len(kept(vjp1)) == 2
    np.testing.assert_array_equal(y1, y0)
    for g1, g0 in zip(vjp1(dy), vjp0(dy), strict=True):
        np.testing.assert_allclose(g1, g0, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_project_matches_jnp_dot_and_its_gradients(dtype):
    """`project`'s hand-written backward pass is autodiff's of `jnp.dot`, in the input dtype."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(2, 5, 8)), dtype)
    kernel = jnp.asarray(rng.normal(size=(8, 3)), dtype)
    cotangent = jnp.asarray(rng.normal(size=(2, 5, 3)), dtype)

    def loss(fn):
        return lambda a, b: jnp.sum((fn(a, b) * cotangent).astype(jnp.float32))

    tol = 1e-6 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(np.asarray(project(x, kernel), np.float32),
                               np.asarray(jnp.dot(x, kernel), np.float32), rtol=tol, atol=tol)
    ours = jax.grad(loss(project), argnums=(0, 1))(x, kernel)
    ref = jax.grad(loss(jnp.dot), argnums=(0, 1))(x, kernel)
    for a, b in zip(ours, ref, strict=True):
        assert a.dtype == b.dtype == dtype
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=tol, atol=tol)
