"""Cached decoding (prefill + one token per step) reproduces the full forward pass."""

import gin
import jax
import numpy as np
import pytest

from tests.models.test_families import CONFIGS, LT, PREFIX, L, make_batch, setup


@pytest.fixture(autouse=True)
def _no_gin_bindings():
    """`TransformerConfig` is gin-configurable: bindings left by other tests must not leak in."""
    gin.clear_config()


def _one_sequence(batch: dict) -> dict:
    """Example 1 of the packed test batch: one full, unpacked sequence (batch size 1)."""
    return {k: v[1:2] for k, v in batch.items() if not k.endswith(("_segment_ids", "_positions"))}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cached_decode_matches_full_forward(name):
    cfg, model, _, params, logits = setup(name)
    packed = make_batch(cfg, seed=7, packed=True)
    full = np.asarray(logits(params, packed))[1:2]
    batch = _one_sequence(packed)
    tokens = batch["decoder_input_tokens"]
    length = LT if cfg.family == "encoder_decoder" else L
    step = jax.jit(model.decode_step)
    if cfg.family == "prefix_lm":
        prompt = {k: v[:, :PREFIX] for k, v in batch.items() if k.startswith("decoder_")}
        prompt_logits, cache = jax.jit(model.prefill, static_argnums=2)(params, prompt, length)
        np.testing.assert_allclose(prompt_logits, full[:, :PREFIX], atol=2e-5)
        start = PREFIX
    else:
        cache = jax.jit(model.init_cache, static_argnums=2)(params, batch, length)
        start = 0
    for i in range(start, length):
        out, cache = step(params, cache, tokens[:, i])
        np.testing.assert_allclose(out, full[:, i], atol=2e-5, err_msg=f"position {i}")
    np.testing.assert_array_equal(cache["decoder"]["cache_index"], [length])


def test_prefill_with_per_example_prompt_lengths():
    cfg, model, _, params, _ = setup("lm_rope_gqa")
    rng = np.random.RandomState(8)
    x = rng.randint(3, cfg.vocab_size, (2, L)).astype(np.int32)
    full = np.asarray(jax.jit(model.logits)(params, {"decoder_input_tokens": x,
                                                     "decoder_target_tokens": x}))  # fmt: skip
    lengths = np.asarray([3, 5], np.int32)
    prompt = x[:, :5].copy()
    prompt[0, 3:] = 0  # right padding of the shorter prompt
    prefill = jax.jit(model.prefill, static_argnums=2)
    out, cache = prefill(params, {"decoder_input_tokens": prompt, "prompt_lengths": lengths}, L)
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(out[b, :n], full[b, :n], atol=2e-5)
    step = jax.jit(model.decode_step)
    for s in range(4):
        positions = lengths + s
        out, cache = step(params, cache, x[np.arange(2), positions])
        np.testing.assert_allclose(out, full[np.arange(2), positions], atol=2e-5)
