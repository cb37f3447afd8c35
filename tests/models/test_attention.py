"""The attention entry point: mask semantics and agreement of the implementations."""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like.models import attention
from t5x_like.models.attention import dense_mask, make_mask_spec


def test_dense_mask_packed_prefix_lm():
    seg = jnp.asarray([[1, 1, 1, 2, 2, 0]])
    prefix = jnp.asarray([[1, 1, 0, 1, 0, 0]], bool)
    spec = make_mask_spec(q_segment_ids=seg, kv_segment_ids=seg, causal=True, prefix_mask=prefix)
    expected = np.array(
        [
            [1, 1, 0, 0, 0, 0],  # prefix token sees the whole prefix of its segment
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],  # target: causal
            [0, 0, 0, 1, 0, 0],  # second segment starts: nothing from the first
            [0, 0, 0, 1, 1, 0],
            [0, 0, 0, 0, 0, 0],  # padding sees nothing
        ],
        bool,
    )
    np.testing.assert_array_equal(dense_mask(spec)[0, 0], expected)


def test_dense_mask_cross_attention_and_decode_index():
    q_seg, kv_seg = jnp.asarray([[1, 2, 0]]), jnp.asarray([[1, 1, 2, 0]])
    cross = make_mask_spec(q_segment_ids=q_seg, kv_segment_ids=kv_seg)
    np.testing.assert_array_equal(
        dense_mask(cross)[0, 0], [[1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]]
    )
    step = make_mask_spec(
        q_segment_ids=None,
        kv_segment_ids=None,
        causal=True,
        q_index=jnp.asarray([[1], [3]]),
        k_index=jnp.arange(5)[None],
    )
    np.testing.assert_array_equal(dense_mask(step)[:, 0, 0], [[1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])


def _inputs(seed, b=2, lq=12, lk=12, h=4, hkv=2, d=16):
    """Random q, k, v and a relative-bias table (numpy: no compilation)."""
    rng = np.random.RandomState(seed)
    normal = lambda *shape: rng.normal(size=shape).astype(np.float32)
    return normal(b, lq, h, d), normal(b, lk, hkv, d), normal(b, lk, hkv, d), normal(h, 32)


def _self_spec(impl, table, causal, prefix, length=12):
    """Example 0: two packed segments and padding; example 1: one full segment."""
    n = length - 5
    seg = jnp.asarray([[1] * n + [2] * 4 + [0], [1] * length])
    pm = jnp.asarray([[1] * 3 + [0] * (n - 3) + [1, 1, 0, 0, 0], [1] * 5 + [0] * n], bool)
    return make_mask_spec(
        q_segment_ids=seg,
        kv_segment_ids=seg,
        causal=causal,
        prefix_mask=pm if prefix else None,
        rel_table=table,
        rel_bidirectional=not causal,
        impl=impl,
    )


@functools.partial(jax.jit, static_argnames=("impl", "causal", "prefix", "length", "rate",
                                             "backend"))
def _self_attention(q, k, v, table, impl, causal, prefix, length=12, rate=0.0, rng=None,
                    backend="auto"):
    """Spec + attention in one compiled program; also returns the spec."""
    spec = _self_spec(impl, table, causal, prefix, length)
    out = attention.attend(q, k, v, spec, impl=impl, scale=0.25, dropout_rate=rate,
                           dropout_rng=rng, flash_backend=backend)
    return out, spec


def _reference(q, k, v, spec, scale):
    """Dense numpy softmax attention, heads repeated for GQA."""
    rep = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) * scale + np.asarray(spec.dense_bias)
    logits = np.where(np.asarray(spec.dense_mask), logits, -1e10)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", probs, v)


@pytest.mark.parametrize("causal,prefix", [(False, False), (True, True)])
def test_xla_and_cudnn_agree_with_reference(causal, prefix):
    q, k, v, table = _inputs(0)
    for impl in ("xla", "cudnn"):
        out, spec = _self_attention(q, k, v, table, impl, causal, prefix)
        ref = _reference(q, k, v, spec, 0.25)
        np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5, err_msg=impl)


@functools.partial(jax.jit, static_argnames="impl")
def _cross_attention(q, k, v, impl):
    spec = make_mask_spec(
        q_segment_ids=jnp.asarray([[1, 1, 2, 2, 0]] * 2),
        kv_segment_ids=jnp.asarray([[1] * 4 + [2] * 3 + [0] * 2] * 2),
    )
    return attention.attend(q, k, v, spec, impl=impl)


def test_cross_attention_mqa_agrees():
    q, k, v, _ = _inputs(1, lq=5, lk=9, h=4, hkv=1)
    xla, cudnn = _cross_attention(q, k, v, "xla"), _cross_attention(q, k, v, "cudnn")
    np.testing.assert_allclose(xla, cudnn, rtol=2e-5, atol=2e-5)
    # Query 2 (segment 2) only sees keys 4..6: its output is a convex mix of those values.
    assert np.all(np.asarray(xla)[:, 2] <= v[:, 4:7].max(1) + 1e-5)


def test_attention_dropout_only_in_training():
    q, k, v, table = _inputs(2)
    plain, _ = _self_attention(q, k, v, table, "xla", True, False)
    rng = jax.random.key(0, impl="rbg")
    dropped, _ = _self_attention(q, k, v, table, "xla", True, False, rate=0.5, rng=rng)
    assert not np.allclose(plain, dropped)


@pytest.mark.parametrize("backend", ["auto", "mosaic_gpu"])
def test_pallas_agrees_with_xla(backend):
    """Packed prefix LM with a T5 table, GQA; `mosaic_gpu` runs the Hopper kernels (bf16 q/k/v
    only: wgmma) in Pallas' GPU interpreter, against XLA on the same bf16 inputs."""
    q, k, v, table = _inputs(3, lq=16, lk=16)
    tol = 1e-4
    if backend == "mosaic_gpu":
        q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
        tol = 2e-2  # bf16 probabilities into the P·V product, bf16 output
    xla, _ = _self_attention(q, k, v, table, "xla", True, True, 16)
    out, spec = _self_attention(q, k, v, table, "pallas", True, True, 16, backend=backend)
    assert spec.dense_mask is None and spec.dense_bias is None  # small inputs only
    valid = np.asarray(spec.q_segment_ids) != 0  # fully masked (padding) rows are unspecified
    np.testing.assert_allclose(np.asarray(out, np.float32)[valid],
                               np.asarray(xla, np.float32)[valid], rtol=tol, atol=tol)


def test_flash_backend_is_a_model_setting():
    """`TransformerConfig.flash_backend` takes the kernel's backends, rejects others by name,
    and reaches the kernel: a model's traced training gradient calls the Hopper kernels (traced
    only; the GPU interpreter would take minutes over a whole model)."""
    from t5x_like.kernels import flash
    from t5x_like.models import TransformerConfig, config, make_model
    from tests.models.test_families import TINY, make_batch

    assert config.FLASH_BACKENDS == flash.BACKENDS
    with pytest.raises(ValueError, match="flash_backend='triton2'"):
        TransformerConfig(flash_backend="triton2")

    def kernels(backend: str) -> set[str]:
        cfg = TransformerConfig(**{**TINY, "dtype": "bfloat16"}, attention_impl="pallas",
                                flash_backend=backend)
        model, batch = make_model(cfg), make_batch(cfg, packed=True)
        key = jax.random.key(0, impl="rbg")
        params = jax.eval_shape(lambda: nn.unbox(model.init_variables(key, batch)["params"]))
        grad = jax.grad(lambda p: model.loss_fn(p, batch, None)[0])
        text = str(jax.make_jaxpr(grad)(params))
        return set(re.findall(r"t5x_like_flash_\w+?(?:_hopper)?(?=\W)", text))

    assert {"t5x_like_flash_fwd_hopper", "t5x_like_flash_bwd_dkdv_hopper",
            "t5x_like_flash_bwd_dq_hopper"} <= kernels("mosaic_gpu")
    assert not any(name.endswith("_hopper") for name in kernels("auto"))


@pytest.mark.parametrize("bias_batch", [1, 3])
def test_add_bias_gradient_sums_a_shared_bias_over_the_batch(bias_batch):
    """`add_bias`'s hand-written gradient (a contraction with ones) equals autodiff's."""
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(3, 2, 4, 5)), jnp.float32)
    bias = jnp.asarray(rng.normal(size=(bias_batch, 2, 4, 5)), jnp.float32)
    cotangent = jnp.asarray(rng.normal(size=(3, 2, 4, 5)), jnp.float32)
    ours = jax.grad(lambda a, b: jnp.sum(attention.add_bias(a, b) * cotangent), (0, 1))
    ref = jax.grad(lambda a, b: jnp.sum((a + b) * cotangent), (0, 1))
    for a, b in zip(ours(logits, bias), ref(logits, bias), strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
