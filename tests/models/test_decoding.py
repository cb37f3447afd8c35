"""Greedy, sampling and beam-search decoding (`t5x_like.models.decoding`) on tiny models."""

import functools

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t5x_like.models import TransformerConfig, make_model
from t5x_like.models.decoding import _filter_logits, decode, length_penalty, score_candidates

TINY = dict(
    vocab_size=64,
    emb_dim=32,
    num_heads=2,
    head_dim=16,
    mlp_dim=64,
    num_encoder_layers=1,
    num_decoder_layers=1,
    dtype="float32",
)
FAMILIES = {
    "enc_dec": dict(position_encoding="absolute"),  # relative bias: the prefix LM
    "lm_rope": dict(family="decoder_only", position_encoding="rope"),
    "prefix_lm_scan": dict(family="prefix_lm", scan_layers=True, num_decoder_layers=2),
}
L = 6  # max_decode_length


@pytest.fixture(autouse=True)
def _no_gin_bindings():
    """`TransformerConfig` is gin-configurable: bindings left by other tests must not leak in."""
    gin.clear_config()


@functools.cache
def setup(name: str):
    cfg = TransformerConfig(**{**TINY, **FAMILIES[name]})
    model = make_model(cfg)
    ones = jnp.ones((1, 4), jnp.int32)
    batch = {
        "decoder_input_tokens": ones,
        "decoder_target_tokens": ones,
        "encoder_input_tokens": ones,
        "decoder_causal_attention": ones,
    }
    params = nn.unbox(jax.jit(model.init_variables)(jax.random.key(3, impl="rbg"), batch)["params"])
    return model, params


def prompts(name: str) -> dict:
    """Two right-padded prompts of different lengths (encoder inputs for enc-dec)."""
    if name == "enc_dec":
        return {"encoder_input_tokens": np.asarray([[5, 9, 7, 4, 1], [8, 3, 1, 0, 0]], np.int32)}
    tokens = np.asarray([[0, 5, 9, 7, 4], [0, 8, 3, 0, 0]], np.int32)
    return {"decoder_input_tokens": tokens, "prompt_lengths": np.asarray([5, 3], np.int32)}


def uncached_batch(name: str, batch: dict, row: int, generated: np.ndarray) -> tuple[dict, int]:
    """Full-forward batch for one example: its prompt (or BOS) then `generated`, padded to a
    fixed width (one compilation); also the position whose logits predict `generated[0]`.
    """
    width = L + (1 if name == "enc_dec" else batch["decoder_input_tokens"].shape[1])
    if name == "enc_dec":
        prompt, out = (
            np.zeros(1, np.int32),
            {"encoder_input_tokens": batch["encoder_input_tokens"][row : row + 1]},
        )
    else:
        prompt, out = batch["decoder_input_tokens"][row, : batch["prompt_lengths"][row]], {}
    dec = np.zeros((1, width), np.int32)
    dec[0, : len(prompt) + len(generated)] = np.concatenate([prompt, generated])
    # explicit segment ids: generated tokens may be 0 (pad), which must not end the sequence
    out.update(
        decoder_input_tokens=dec,
        decoder_target_tokens=np.ones_like(dec),
        decoder_segment_ids=np.ones_like(dec),
    )
    if name.startswith("prefix_lm"):
        out["decoder_causal_attention"] = (np.arange(width) < len(prompt)).astype(np.int32)[None]
    return out, len(prompt) - 1


def scored_batch(name: str, batch: dict, row: int, target: np.ndarray) -> dict:
    """`model.score` batch whose weighted targets are `target` (EOS-ended) after row's prompt."""
    x, start = uncached_batch(name, batch, row, target[:-1])
    full = np.zeros_like(x["decoder_input_tokens"])
    full[0, start : start + len(target)] = target
    span = np.arange(full.shape[1]) - start
    weights = ((span >= 0) & (span < len(target))).astype(np.int32)[None]
    x.update(decoder_target_tokens=full, decoder_loss_weights=weights)
    return x


@pytest.mark.parametrize("name", list(FAMILIES))
def test_greedy_matches_uncached_argmax(name):
    model, params = setup(name)
    batch = prompts(name)
    out = decode(model, params, batch, method="greedy", max_decode_length=L)
    assert out["tokens"].shape == (2, 1, L)
    logits = jax.jit(model.logits)
    for row in range(2):
        tokens, length = np.asarray(out["tokens"][row, 0]), int(out["lengths"][row, 0])
        total = 0.0
        for i in range(length):  # re-run the full forward on the growing sequence
            x, start = uncached_batch(name, batch, row, tokens[:i])
            step_logits = np.asarray(logits(params, x))[0, start + i]
            assert tokens[i] == np.argmax(step_logits), (row, i)
            total += step_logits[tokens[i]] - np.log(np.sum(np.exp(step_logits)))
        np.testing.assert_array_equal(tokens[length:], 0)
        np.testing.assert_allclose(out["log_probs"][row, 0], total, rtol=1e-5, atol=1e-5)


def test_forced_decoder_prompt_continues_as_teacher_forced_greedy():
    """Encoder-decoder with forced first decoder tokens (ragged): every generated token is the
    argmax of the uncached forward over BOS + forced tokens + the tokens generated so far."""
    model, params = setup("enc_dec")
    batch = dict(prompts("enc_dec"))
    batch["decoder_input_tokens"] = np.asarray([[0, 7, 3, 12], [0, 11, 0, 0]], np.int32)
    batch["prompt_lengths"] = np.asarray([4, 2], np.int32)
    out = decode(model, params, batch, method="greedy", max_decode_length=L)
    plain = decode(model, params, prompts("enc_dec"), method="greedy", max_decode_length=L)
    assert not np.array_equal(out["tokens"], plain["tokens"])  # the prompt changed the output
    logits = jax.jit(model.logits)
    for row in range(2):
        forced = batch["decoder_input_tokens"][row, : batch["prompt_lengths"][row]]
        tokens, length = np.asarray(out["tokens"][row, 0]), int(out["lengths"][row, 0])
        assert length >= 1
        for i in range(length):
            dec = np.zeros((1, 4 + L), np.int32)
            dec[0, : len(forced) + i] = np.concatenate([forced, tokens[:i]])
            x = {
                "encoder_input_tokens": batch["encoder_input_tokens"][row : row + 1],
                "decoder_input_tokens": dec,
                "decoder_target_tokens": np.ones_like(dec),
                "decoder_segment_ids": np.ones_like(dec),
            }
            step_logits = np.asarray(logits(params, x))[0, len(forced) - 1 + i]
            assert tokens[i] == np.argmax(step_logits), (row, i)


def test_padded_prompt_matches_prompt_alone():
    model, params = setup("lm_rope")
    batch = prompts("lm_rope")
    together = decode(model, params, batch, method="greedy", max_decode_length=L)
    alone = {"decoder_input_tokens": batch["decoder_input_tokens"][1:, :3]}
    single = decode(model, params, alone, method="greedy", max_decode_length=L)
    np.testing.assert_array_equal(together["tokens"][1], single["tokens"][0])
    np.testing.assert_allclose(together["log_probs"][1], single["log_probs"][0], atol=1e-5)


def test_one_beam_equals_greedy():
    model, params = setup("enc_dec")
    batch = prompts("enc_dec")
    greedy = decode(model, params, batch, method="greedy", max_decode_length=L)
    beam = decode(model, params, batch, method="beam", max_decode_length=L, num_beams=1, alpha=0.0)
    np.testing.assert_array_equal(beam["tokens"], greedy["tokens"])
    np.testing.assert_array_equal(beam["lengths"], greedy["lengths"])
    np.testing.assert_allclose(beam["scores"], greedy["log_probs"], atol=1e-5)


def test_low_temperature_and_top_k_1_sampling_equal_greedy():
    model, params = setup("lm_rope")
    batch = prompts("lm_rope")
    greedy = decode(model, params, batch, method="greedy", max_decode_length=L)
    kwargs = dict(method="sample", max_decode_length=L, rng=jax.random.PRNGKey(0))
    outs = [
        decode(model, params, batch, num_decodes=4, top_p=0.95, temperature=t, **kwargs)
        for t in (1e-6, 0.0)  # the same compilation as the sampling test below
    ]
    outs.append(decode(model, params, batch, num_decodes=4, top_k=1, **kwargs))
    for out in outs:
        repeats = out["tokens"].shape[1]
        np.testing.assert_array_equal(out["tokens"], np.repeat(greedy["tokens"], repeats, 1))
        np.testing.assert_allclose(
            out["log_probs"], np.repeat(greedy["log_probs"], repeats, 1), atol=1e-5
        )


def test_sampling_is_seeded_sorted_and_diverse():
    model, params = setup("lm_rope")
    batch = prompts("lm_rope")
    kwargs = dict(method="sample", max_decode_length=L, num_decodes=4, top_p=0.95, temperature=2.0)
    a = decode(model, params, batch, rng=jax.random.PRNGKey(1), **kwargs)
    b = decode(model, params, batch, rng=jax.random.PRNGKey(1), **kwargs)
    c = decode(model, params, batch, rng=jax.random.PRNGKey(2), **kwargs)
    assert a["tokens"].shape == (2, 4, L)
    np.testing.assert_array_equal(a["tokens"], b["tokens"])
    assert not np.array_equal(a["tokens"], c["tokens"])
    assert np.all(np.diff(np.asarray(a["scores"]), axis=1) <= 0)
    assert len({tuple(t) for t in np.asarray(a["tokens"][0])}) > 1


def test_filter_logits_top_k_and_top_p():
    logits = jnp.log(jnp.asarray([[0.5, 0.05, 0.3, 0.15], [0.25, 0.25, 0.25, 0.25]]))
    kept = lambda x: np.asarray(x > -1e29)
    np.testing.assert_array_equal(kept(_filter_logits(logits, 2, 1.0))[0], [1, 0, 1, 0])
    np.testing.assert_array_equal(kept(_filter_logits(logits, 0, 0.7))[0], [1, 0, 1, 0])
    np.testing.assert_array_equal(kept(_filter_logits(logits, 0, 0.81))[0], [1, 0, 1, 1])
    np.testing.assert_array_equal(kept(_filter_logits(logits, 0, 1e-3))[0], [1, 0, 0, 0])
    np.testing.assert_array_equal(kept(_filter_logits(logits, 3, 0.9))[1], [1, 1, 1, 1])


def test_eos_stops_and_pads():
    model, params = setup("lm_rope")
    batch = prompts("lm_rope")
    free = decode(model, params, batch, method="greedy", max_decode_length=L, eos_id=-1)
    tokens = np.asarray(free["tokens"][:, 0])
    np.testing.assert_array_equal(free["lengths"], L)
    eos = int(tokens[0, 2])
    out = decode(model, params, batch, method="greedy", max_decode_length=L, eos_id=eos)
    for row in range(2):
        hits = np.flatnonzero(tokens[row] == eos)
        stop = int(hits[0]) + 1 if hits.size else L
        assert out["lengths"][row, 0] == stop
        np.testing.assert_array_equal(out["tokens"][row, 0, :stop], tokens[row, :stop])
        np.testing.assert_array_equal(out["tokens"][row, 0, stop:], 0)
    assert out["lengths"][0, 0] <= 3


@pytest.mark.parametrize("name", ["enc_dec", "prefix_lm_scan"])
def test_beam_scores_sorted_and_match_model_score(name):
    model, params = setup(name)
    batch = prompts(name)
    out = decode(
        model, params, batch, method="beam", max_decode_length=L, num_beams=4, num_decodes=3
    )
    assert out["tokens"].shape == (2, 3, L)
    scores, lengths = np.asarray(out["scores"]), np.asarray(out["lengths"])
    assert np.all(np.diff(scores, axis=1) <= 0)
    np.testing.assert_allclose(scores * length_penalty(lengths, 0.6), out["log_probs"], rtol=1e-5)
    score = jax.jit(model.score)
    greedy = decode(model, params, batch, method="greedy", max_decode_length=L)
    for row in range(2):
        assert len({tuple(t) for t in np.asarray(out["tokens"][row])}) == 3
        for j in range(3):
            generated = np.asarray(out["tokens"][row, j, : lengths[row, j]])
            x = scored_batch(name, batch, row, generated)
            np.testing.assert_allclose(score(params, x)[0], out["log_probs"][row, j], rtol=1e-5)
        # the best beam is at least as good as greedy under the same (penalised) score
        greedy_score = greedy["log_probs"][row, 0] / length_penalty(greedy["lengths"][row, 0], 0.6)
        assert scores[row, 0] >= greedy_score - 1e-5


@pytest.mark.parametrize("name", list(FAMILIES))
def test_score_candidates_matches_model_score(name):
    """Cached rank scoring = `model.score` of each prompt + candidate, padding unscored."""
    model, params = setup(name)
    batch = prompts(name)
    candidates = np.asarray([[7, 1, 0], [12, 30, 1], [1, 0, 0]], np.int32)  # EOS-ended, padded
    got = np.asarray(score_candidates(model, params, batch, candidates))
    assert got.shape == (2, 3) and np.all(got < 0)
    score = jax.jit(model.score)
    for row in range(2):
        for c, cand in enumerate(candidates):
            x = scored_batch(name, batch, row, cand[cand > 0])
            np.testing.assert_allclose(got[row, c], score(params, x)[0], rtol=1e-5, atol=1e-5)
    assert len({round(float(v), 4) for v in got[0]}) == 3  # candidates are told apart


def test_tiny_model_learns_to_copy():
    """The `enc_dec` model trained to copy 4 tokens + EOS (the test prompts' shape, so the
    greedy decoder compiled above is reused) decodes held-out sequences exactly."""
    model, params = setup("enc_dec")

    def copy_batch(rng: np.random.RandomState, size: int) -> dict:
        targets = np.concatenate([rng.randint(3, 64, (size, 4)), np.ones((size, 1))], 1)
        targets = targets.astype(np.int32)
        inputs = np.concatenate([np.zeros((size, 1), np.int32), targets[:, :-1]], 1)
        return {
            "encoder_input_tokens": targets,
            "decoder_target_tokens": targets,
            "decoder_input_tokens": inputs,
            "decoder_loss_weights": np.ones_like(targets),
        }

    optimizer = optax.adam(5e-3)

    @jax.jit
    def train_step(params, opt_state, batch):
        grads, _ = jax.grad(model.loss_fn, has_aux=True)(params, batch, None)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    rng, opt_state = np.random.RandomState(0), optimizer.init(params)
    for _ in range(1000):
        params, opt_state = train_step(params, opt_state, copy_batch(rng, 64))
    test = copy_batch(np.random.RandomState(1), 16)["decoder_target_tokens"]
    for pair in np.split(test, 8):
        out = decode(model, params, {"encoder_input_tokens": pair}, max_decode_length=L)
        np.testing.assert_array_equal(out["tokens"][:, 0, :5], pair)
        np.testing.assert_array_equal(out["tokens"][:, 0, 5:], 0)
        np.testing.assert_array_equal(out["lengths"][:, 0], 5)
