"""Decoding (`t5x_like.models.decoding`): the algorithms on stub `tokens_to_logits` whose
outputs are known exactly, then the model's cache and `decode` / `score_candidates` on tiny
real models (every generated token is the uncached forward's choice; scores equal
`model.score`)."""

import functools
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like.models import TransformerConfig, make_model
from t5x_like.models.config import EOS_ID, NEG_INF
from t5x_like.models.decoding import (
    _filter_logits,
    beam_search,
    decode,
    gather_rows,
    greedy_decode,
    length_penalty,
    score_candidates,
    score_continuations,
    temperature_sample,
)
from tests.models.test_families import CONFIGS, LT, PREFIX, make_batch
from tests.models.test_families import L as FAMILY_L
from tests.models.test_families import setup as family_setup

# Stub models --------------------------------------------------------------------------------
# A second-order Markov "model": the next token's log-probs depend on the previous two tokens.
# Its cache holds the previous token with the batch on axis 1 (like scanned layers' caches) and
# a batch-free counter, so reordering rows (beams) and batch axes are exercised.
V = 5  # vocabulary of the stubs; EOS_ID = 1


def markov_table(seed: int) -> np.ndarray:
    """log-probs `[V (previous), V (current), V (next)]`, no ties."""
    logits = np.random.RandomState(seed).normal(size=(V, V, V)) * 2.0
    return np.asarray(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32)))


def markov(table: np.ndarray, prompts: np.ndarray):
    """(`logits [B, V]`, cache, cache_axes, tokens_to_logits) after prompts `[B, 2]`."""
    table = jnp.asarray(table)
    cache = {"prev": jnp.asarray(prompts[None, :, 1]), "steps": jnp.int32(0)}
    axes = {"prev": 1, "steps": None}

    def tokens_to_logits(tokens, cache):
        logits = table[cache["prev"][0], tokens]
        return logits, {"prev": tokens[None], "steps": cache["steps"] + 1}

    return table[prompts[:, 0], prompts[:, 1]], cache, axes, tokens_to_logits


def continuations(table: np.ndarray, prompt: np.ndarray, length: int):
    """Every finished continuation (ends with EOS, or reaches `length`) and its log-prob."""
    out = []
    for n in range(1, length + 1):
        for seq in itertools.product(range(V), repeat=n):
            if EOS_ID in seq[:-1] or (n < length and seq[-1] != EOS_ID):
                continue
            hist, lp = list(prompt), 0.0
            for t in seq:
                lp += float(table[hist[-2], hist[-1], t])
                hist.append(t)
            out.append((seq, lp))
    return out


PROMPTS = np.asarray([[2, 3], [4, 0], [3, 3]], np.int32)


def test_greedy_follows_the_argmax_chain_and_stops_at_eos():
    table = markov_table(0)
    logits, cache, axes, step = markov(table, PROMPTS)
    out = jax.jit(functools.partial(greedy_decode, tokens_to_logits=step, cache_axes=axes,
                                    max_decode_length=6))(logits, cache)
    for b, prompt in enumerate(PROMPTS):
        hist, lp, expected = list(prompt), 0.0, []
        while len(expected) < 6 and EOS_ID not in expected:
            token = int(np.argmax(table[hist[-2], hist[-1]]))
            lp += float(table[hist[-2], hist[-1], token])
            expected.append(token)
            hist.append(token)
        tokens = np.asarray(out["tokens"][b, 0])
        np.testing.assert_array_equal(tokens[: len(expected)], expected)
        np.testing.assert_array_equal(tokens[len(expected):], 0)
        assert out["lengths"][b, 0] == len(expected)
        np.testing.assert_allclose(out["log_probs"][b, 0], lp, rtol=1e-6)
        np.testing.assert_array_equal(out["scores"], out["log_probs"])


def test_eos_id_is_traced_and_ends_sequences():
    """A stub preferring tokens 2 and 3 alternately (its cache counts the steps): eos_id=3
    stops after 2 tokens; no EOS runs to the maximum length."""
    prefer = jnp.asarray([[0.0, 0, 5, 0, 0], [0, 0, 0, 5, 0]])

    def step(tokens, cache):
        return prefer[cache % 2], cache + 1

    start = prefer[jnp.zeros(2, jnp.int32)]
    run = jax.jit(lambda eos: greedy_decode(start, jnp.ones(2, jnp.int32), step,
                                            max_decode_length=5, eos_id=eos))
    np.testing.assert_array_equal(run(-1)["tokens"][:, 0], [[2, 3, 2, 3, 2]] * 2)
    out = run(3)
    np.testing.assert_array_equal(out["tokens"][:, 0], [[2, 3, 0, 0, 0]] * 2)
    np.testing.assert_array_equal(out["lengths"], [[2], [2]])


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_wide_beam_search_is_exhaustive(alpha):
    """With more beams than continuations, beam search returns the exact best `num_decodes`
    finished sequences by `log_prob / length_penalty` (brute force over all of them)."""
    table, length = markov_table(1), 3
    logits, cache, axes, step = markov(table, PROMPTS)
    search = jax.jit(functools.partial(beam_search, tokens_to_logits=step, cache_axes=axes,
                                       max_decode_length=length, num_beams=V**length,
                                       num_decodes=4, alpha=alpha))
    out = search(logits, cache)
    for b, prompt in enumerate(PROMPTS):
        ranked = sorted(((lp / float(length_penalty(len(s), alpha)), lp, s)
                         for s, lp in continuations(table, prompt, length)), reverse=True)
        for j, (score, lp, seq) in enumerate(ranked[:4]):
            assert tuple(np.asarray(out["tokens"][b, j, : len(seq)])) == seq, (b, j)
            np.testing.assert_array_equal(out["tokens"][b, j, len(seq):], 0)
            assert out["lengths"][b, j] == len(seq)
            np.testing.assert_allclose(out["log_probs"][b, j], lp, rtol=1e-5)
            np.testing.assert_allclose(out["scores"][b, j], score, rtol=1e-5)


def test_two_beams_find_what_greedy_misses():
    """Token 2 is likelier first (0.6 vs 0.4) but then spreads over 3 tokens; token 3 is
    followed by EOS for sure: beam search returns [3, EOS] (p 0.4), greedy [2, x, ...]."""
    spread = np.log([1e-6, 1e-6, 0.34, 0.33, 0.33])
    to_eos = np.log([1e-6, 1.0, 1e-6, 1e-6, 1e-6])
    nexts = jnp.asarray(np.stack([spread, spread, spread, to_eos, spread]), jnp.float32)
    first = jnp.asarray([np.log([1e-6, 1e-6, 0.6, 0.4, 1e-6])], jnp.float32)
    step = lambda tokens, cache: (nexts[tokens], cache)
    beam = beam_search(first, jnp.zeros(1), step, max_decode_length=3, num_beams=2, alpha=0.0)
    greedy = greedy_decode(first, jnp.zeros(1), step, max_decode_length=3)
    np.testing.assert_array_equal(beam["tokens"][0, 0], [3, EOS_ID, 0])
    np.testing.assert_allclose(beam["log_probs"][0, 0], np.log(0.4), rtol=1e-4)
    assert greedy["tokens"][0, 0, 0] == 2
    assert greedy["log_probs"][0, 0] < beam["log_probs"][0, 0]
    one = beam_search(first, jnp.zeros(1), step, max_decode_length=3, num_beams=1, alpha=0.0)
    np.testing.assert_array_equal(one["tokens"], greedy["tokens"])  # one beam is greedy
    np.testing.assert_allclose(one["scores"], greedy["log_probs"], rtol=1e-6)


def stub_sampler(probs, **kwargs):
    """Samples 1 token from `probs` (then EOS) for 1 prompt x 4000 decodes; token counts."""
    first = jnp.log(jnp.asarray([probs], jnp.float32))
    eos = jnp.asarray(np.log([1e-9, 1.0, 1e-9, 1e-9, 1e-9]), jnp.float32)
    step = lambda tokens, cache: (jnp.broadcast_to(eos, (tokens.shape[0], V)), cache)
    out = temperature_sample(first, jnp.zeros(1), step, max_decode_length=2, num_decodes=4000,
                             rng=jax.random.PRNGKey(0), **kwargs)
    return np.bincount(np.asarray(out["tokens"][0, :, 0]), minlength=V) / 4000, out


def test_sampling_follows_temperature_top_k_and_top_p():
    probs = [0.0, 0.0, 0.5, 0.3, 0.2]
    freq, out = stub_sampler(probs)
    np.testing.assert_allclose(freq, probs, atol=0.03)
    np.testing.assert_array_equal(out["tokens"][0, :, 1], EOS_ID)
    assert np.all(np.diff(np.asarray(out["scores"][0])) <= 0)  # sorted, best first
    np.testing.assert_allclose(out["log_probs"][0], np.log(np.asarray(probs)[
        np.asarray(out["tokens"][0, :, 0])]), rtol=1e-4)  # untempered log-probs
    hot = np.asarray(probs) ** 2 / np.sum(np.asarray(probs) ** 2)  # temperature 0.5
    np.testing.assert_allclose(stub_sampler(probs, temperature=0.5)[0], hot, atol=0.03)
    np.testing.assert_allclose(stub_sampler(probs, top_k=2)[0], [0, 0, 0.625, 0.375, 0],
                               atol=0.03)
    np.testing.assert_allclose(stub_sampler(probs, top_p=0.6)[0], [0, 0, 0.625, 0.375, 0],
                               atol=0.03)
    for greedy in ({"temperature": 0.0}, {"temperature": 1e-6}, {"top_k": 1}):
        np.testing.assert_array_equal(stub_sampler(probs, **greedy)[0], [0, 0, 1, 0, 0])


def test_sampling_is_seeded():
    table = markov_table(2)
    logits, cache, axes, step = markov(table, PROMPTS)
    run = jax.jit(lambda rng: temperature_sample(logits, cache, step, cache_axes=axes, rng=rng,
                                                 max_decode_length=6, num_decodes=4))
    a, b, c = run(jax.random.PRNGKey(1)), run(jax.random.PRNGKey(1)), run(jax.random.PRNGKey(2))
    np.testing.assert_array_equal(a["tokens"], b["tokens"])
    assert not np.array_equal(a["tokens"], c["tokens"])
    with pytest.raises(ValueError, match="rng"):
        temperature_sample(logits, cache, step, max_decode_length=2)


def test_score_continuations_sums_the_stub_log_probs():
    table = markov_table(3)
    logits, cache, axes, step = markov(table, PROMPTS)
    candidates = np.asarray([[2, 1, 0], [3, 4, 1], [1, 0, 0]], np.int32)  # padding unscored
    got = np.asarray(score_continuations(logits, cache, step, jnp.asarray(candidates),
                                         cache_axes=axes))
    for b, prompt in enumerate(PROMPTS):
        for c, cand in enumerate(candidates):
            hist, lp = list(prompt), 0.0
            for t in cand[cand > 0]:
                lp += float(table[hist[-2], hist[-1], t])
                hist.append(t)
            np.testing.assert_allclose(got[b, c], lp, rtol=1e-6)


def test_gather_rows_follows_each_leafs_batch_axis():
    cache = {"a": jnp.arange(6).reshape(2, 3), "b": jnp.arange(3), "c": jnp.float32(7)}
    out = gather_rows(cache, {"a": 1, "b": 0, "c": None}, jnp.asarray([2, 2, 0]))
    np.testing.assert_array_equal(out["a"], [[2, 2, 0], [5, 5, 3]])
    np.testing.assert_array_equal(out["b"], [2, 2, 0])
    assert float(out["c"]) == 7.0


def test_filter_logits_top_k_and_top_p():
    logits = jnp.log(jnp.asarray([[0.5, 0.05, 0.3, 0.15], [0.25, 0.25, 0.25, 0.25]]))
    kept = lambda x: np.asarray(x > NEG_INF / 2)
    np.testing.assert_array_equal(kept(_filter_logits(logits, 2, 1.0))[0], [1, 0, 1, 0])
    np.testing.assert_array_equal(kept(_filter_logits(logits, 0, 0.7))[0], [1, 0, 1, 0])
    np.testing.assert_array_equal(kept(_filter_logits(logits, 0, 0.81))[0], [1, 0, 1, 1])
    np.testing.assert_array_equal(kept(_filter_logits(logits, 0, 1e-3))[0], [1, 0, 0, 0])
    np.testing.assert_array_equal(kept(_filter_logits(logits, 3, 0.9))[1], [1, 1, 1, 1])


# Tiny real models ---------------------------------------------------------------------------
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
    out = model.decode(params, batch, method="greedy", max_decode_length=L)
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


# The model's KV cache (prefill + one token per step = the full forward pass) -------------
def _one_sequence(batch: dict) -> dict:
    """Example 1 of the packed test batch: one full, unpacked sequence (batch size 1)."""
    return {k: v[1:2] for k, v in batch.items() if not k.endswith(("_segment_ids", "_positions"))}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cached_decode_matches_full_forward(name):
    cfg, model, _, params, logits = family_setup(name)
    packed = make_batch(cfg, seed=7, packed=True)
    full = np.asarray(logits(params, packed))[1:2]
    batch = _one_sequence(packed)
    tokens = batch["decoder_input_tokens"]
    length = LT if cfg.family == "encoder_decoder" else FAMILY_L
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
    cfg, model, _, params, _ = family_setup("lm_rope_gqa")
    rng = np.random.RandomState(8)
    x = rng.randint(3, cfg.vocab_size, (2, FAMILY_L)).astype(np.int32)
    full = np.asarray(jax.jit(model.logits)(params, {"decoder_input_tokens": x,
                                                     "decoder_target_tokens": x}))  # fmt: skip
    lengths = np.asarray([3, 5], np.int32)
    prompt = x[:, :5].copy()
    prompt[0, 3:] = 0  # right padding of the shorter prompt
    prefill = jax.jit(model.prefill, static_argnums=2)
    prompt = {"decoder_input_tokens": prompt, "prompt_lengths": lengths}
    out, cache = prefill(params, prompt, FAMILY_L)
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(out[b, :n], full[b, :n], atol=2e-5)
    step = jax.jit(model.decode_step)
    for s in range(4):
        positions = lengths + s
        out, cache = step(params, cache, x[np.arange(2), positions])
        np.testing.assert_allclose(out, full[np.arange(2), positions], atol=2e-5)
