"""Model-level check: a T5 encoder-decoder and a prefix LM give the same loss and parameter
gradients with `attention_impl='pallas'` (our kernel, CPU interpret mode) as with `'xla'`.

Packed batches (several segments per row, internal and trailing padding) exercise the encoder
self-attention, decoder causal self-attention, cross-attention with separate q/kv segment ids,
the prefix mask and the T5 relative bias table's gradient through the real model code.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like.models import TransformerConfig, make_model

TINY = dict(vocab_size=64, emb_dim=32, num_heads=4, head_dim=16, mlp_dim=64,
            num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0, dtype="float32",
            relative_attention_num_buckets=8, relative_attention_max_distance=16)


def _packed(rng, b: int, length: int, n_segments: int = 2):
    seg = np.zeros((b, length), np.int32)
    pos = np.zeros((b, length), np.int32)
    for i in range(b):
        used = rng.integers(length // 2, length + 1)
        cuts = np.sort(rng.choice(np.arange(2, used - 1), n_segments - 1, replace=False))
        ids = np.searchsorted(cuts, np.arange(used), side="right") + 1
        seg[i, :used] = ids
        for s in range(1, n_segments + 1):
            where = np.nonzero(seg[i] == s)[0]
            pos[i, where] = np.arange(len(where))
    return seg, pos


def _batch(family: str, rng, b: int = 2, li: int = 19, lt: int = 13) -> dict:
    tokens = lambda length: rng.integers(3, TINY["vocab_size"], size=(b, length)).astype(np.int32)
    if family == "encoder_decoder":
        eseg, epos = _packed(rng, b, li)
        dseg, dpos = _packed(rng, b, lt)
        targets = tokens(lt) * (dseg > 0)
        inputs = np.where(dpos == 0, 0, np.roll(targets, 1, axis=1))
        return {"encoder_input_tokens": tokens(li) * (eseg > 0), "decoder_target_tokens": targets,
                "decoder_input_tokens": inputs, "decoder_loss_weights": (dseg > 0).astype(np.int32),
                "encoder_segment_ids": eseg, "encoder_positions": epos,
                "decoder_segment_ids": dseg, "decoder_positions": dpos}
    length = li + lt
    seg, pos = _packed(rng, b, length)
    targets = tokens(length) * (seg > 0)
    inputs = np.where(pos == 0, 0, np.roll(targets, 1, axis=1))
    prefix_len = rng.integers(2, 7, size=(b, 1))
    causal_attention = ((pos <= prefix_len) & (seg > 0)).astype(np.int32)
    weights = ((pos > prefix_len) & (seg > 0)).astype(np.int32)
    return {"decoder_target_tokens": targets, "decoder_input_tokens": inputs,
            "decoder_loss_weights": weights, "decoder_causal_attention": causal_attention,
            "decoder_segment_ids": seg, "decoder_positions": pos}


@pytest.mark.parametrize("family", ["encoder_decoder", "prefix_lm"])
def test_pallas_model_matches_xla(family: str, test_seed: int) -> None:
    seed = test_seed
    rng = np.random.default_rng(seed)
    batch = {k: jnp.asarray(v) for k, v in _batch(family, rng).items()}
    results = {}
    params = None
    for impl in ("xla", "pallas"):
        model = make_model(TransformerConfig(family=family, attention_impl=impl, **TINY))
        if params is None:
            params = nn.unbox(model.init_variables(jax.random.PRNGKey(seed % 1000), batch))
            params = params["params"]
        grad_fn = jax.jit(jax.value_and_grad(lambda p, m=model: m.loss_fn(p, batch, None)[0]))
        results[impl] = grad_fn(params)
    assert_same_loss_and_grads(results["xla"], results["pallas"], seed)


def assert_same_loss_and_grads(xla, pallas, seed: int) -> None:
    """`(loss, grads)` of the pallas model equal the XLA model's: finite, the loss to 1e-5 and
    every gradient (the T5 bias table's included) to 1e-4 of its scale."""
    (loss_x, grads_x), (loss_p, grads_p) = xla, pallas
    assert np.isfinite(float(loss_p)), f"seed={seed}"
    np.testing.assert_allclose(float(loss_p), float(loss_x), rtol=1e-5, err_msg=f"seed={seed}")
    flat_x = jax.tree_util.tree_leaves_with_path(grads_x)
    flat_p = jax.tree_util.tree_leaves(grads_p)
    assert any("rel" in jax.tree_util.keystr(path) for path, _ in flat_x)  # bias table trained
    for (path, gx), gp in zip(flat_x, flat_p, strict=True):
        gx, gp = np.asarray(gx), np.asarray(gp)
        assert np.all(np.isfinite(gp)), f"{jax.tree_util.keystr(path)} seed={seed}"
        tol = 1e-4 * max(np.max(np.abs(gx)), 1e-3)
        assert np.max(np.abs(gp - gx)) <= tol, (jax.tree_util.keystr(path), seed)
