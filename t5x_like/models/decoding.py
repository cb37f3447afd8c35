"""Autoregressive decoding on top of the `BaseModel` KV-cache hooks (`prefill`, `decode_step`).

Three algorithms, each one `jax.lax.while_loop` (jit-compatible, static shapes):
`greedy_decode`, `temperature_sample` (temperature, top-k, top-p) and `beam_search` (length
penalty `((5 + len) / 6) ** alpha`, T5X's default alpha = 0.6). `decode` is the jitted entry
point for all of them; `score_candidates` scores a closed set of continuations per prompt
(rank classification) on the same cache.

Prompts (batch dict, pad = 0, right-padded):
- encoder-decoder: `encoder_input_tokens [B, Li]`; the decoder starts from BOS (token 0), or,
  for a forced decoder prompt, from `decoder_input_tokens [B, P]` (BOS + the forced first target
  tokens, right-padded; lengths from `prompt_lengths [B]`, else P), which are prefilled so that
  generation continues after them (the forced tokens are not part of the outputs).
- decoder-only / prefix LM: `decoder_input_tokens [B, P]` is the prompt (SeqIO's shifted-right
  form, usually starting with the 0 BOS); its lengths (>= 1) come from `prompt_lengths [B]`,
  else from `sum(decoder_causal_attention)`, else P. Prefix LMs see the prompt bidirectionally
  (`decoder_causal_attention` defaults to 1 on the prompt).

Outputs hold generated tokens only: `tokens [B, N, L]` (N = `num_decodes`, L =
`max_decode_length`), each row ending at its first EOS (kept) and padded with 0 after it;
`lengths [B, N]` count tokens up to and including EOS; `log_probs [B, N]` is the model's
log-likelihood of those tokens (untempered, unfiltered softmax); `scores [B, N]` equals
`log_probs` except for beam search, where it is `log_probs / length_penalty(lengths)`. Rows are
sorted by `scores`, best first.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from t5x_like.models.config import EOS_ID, NEG_INF, PAD_ID
from t5x_like.models.model import BaseModel

Batch = Mapping[str, Any]


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
    """GNMT/T5X brevity penalty `((5 + length) / 6) ** alpha` (float32, same shape as `length`)."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


# Prompts and the cache -----------------------------------------------------------------------
def _cache_batch_axes(model: BaseModel, params: Any, prompt: dict, cache_length: int) -> Any:
    """Per cache leaf, the axis that grows with the batch (None for batch-free leaves).

    Found from two abstract `prefill`s (batch 1 and 2), so layouts such as scanned layers'
    leading `[layers, B, ...]` axis need no special-casing.
    """

    def shapes(size: int) -> Any:
        spec = {k: jax.ShapeDtypeStruct((size, *v.shape[1:]), v.dtype) for k, v in prompt.items()}
        return jax.eval_shape(lambda p, b: model.prefill(p, b, cache_length)[1], params, spec)

    def axis(a: jax.ShapeDtypeStruct, b: jax.ShapeDtypeStruct) -> int | None:
        diff = [i for i, (x, y) in enumerate(zip(a.shape, b.shape, strict=True)) if x != y]
        return diff[0] if diff else None

    return jax.tree.map(axis, shapes(1), shapes(2))


def _take(cache: Any, axes: Any, index: jax.Array) -> Any:
    """Gathers `index [B']` along every cache leaf's batch axis (expand/reorder beams)."""
    take = lambda x, ax: x if ax is None else jnp.take(x, index, axis=ax)
    return jax.tree.map(take, cache, axes, is_leaf=lambda x: x is None)


def _start(
    model: BaseModel, params: Any, batch: Batch, max_decode_length: int, copies: int
) -> tuple[jax.Array, Any, Any, int]:
    """Prefills the prompts and repeats each example `copies` times.

    Returns the next-token logits `[B*copies, V]`, the cache, its batch axes and B.
    """
    prompt = model.decode_prompt(batch)
    width = prompt["decoder_input_tokens"].shape[1]
    cache_length = width + max_decode_length
    logits, cache = model.prefill(params, prompt, cache_length)
    size = logits.shape[0]
    last = jnp.take_along_axis(logits, (prompt["prompt_lengths"] - 1)[:, None, None], axis=1)
    axes = _cache_batch_axes(model, params, prompt, cache_length)
    index = jnp.repeat(jnp.arange(size), copies)
    return last[:, 0][index], _take(cache, axes, index), axes, size


def _finish(
    tokens: jax.Array, lengths: jax.Array, log_probs: jax.Array, scores: jax.Array, size: int
) -> dict[str, jax.Array]:
    """Reshapes `[B*N, ...]` results to `[B, N, ...]`, sorted by score (best first)."""
    n = tokens.shape[0] // size
    out = {
        "tokens": tokens.reshape(size, n, -1),
        "lengths": lengths.reshape(size, n),
        "log_probs": log_probs.reshape(size, n),
        "scores": scores.reshape(size, n),
    }
    order = jnp.argsort(-out["scores"], axis=1, stable=True)
    return {
        k: jnp.take_along_axis(v, order.reshape(*order.shape, *[1] * (v.ndim - 2)), axis=1)
        for k, v in out.items()
    }


# Greedy and sampling ---------------------------------------------------------------------------
def _filter_logits(
    logits: jax.Array, top_k: int | jax.Array, top_p: float | jax.Array
) -> jax.Array:
    """Sets logits `[N, V]` outside the top-k, then outside the top-p nucleus of what remains,
    to NEG_INF. `top_k` (0 = off) and `top_p` (>= 1 = off) may be traced; ties are kept.
    """
    if isinstance(top_k, int) and top_k <= 0 and isinstance(top_p, int | float) and top_p >= 1:
        return logits
    vocab = logits.shape[-1]
    ordered = jnp.sort(logits, axis=-1)[:, ::-1]
    in_top_k = jnp.arange(vocab) < jnp.where(top_k > 0, top_k, vocab)
    probs = jax.nn.softmax(jnp.where(in_top_k, ordered, NEG_INF), axis=-1)
    # the top token is always kept; top_p >= 1 keeps all despite rounding in the cumsum
    in_nucleus = (jnp.cumsum(probs, axis=-1) - probs < top_p) | (top_p >= 1.0)
    cutoff = jnp.min(jnp.where(in_top_k & in_nucleus, ordered, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits < cutoff, NEG_INF, logits)


def temperature_sample(
    model: BaseModel,
    params: Any,
    batch: Batch,
    *,
    max_decode_length: int,
    rng: jax.Array | None = None,
    temperature: float | jax.Array = 1.0,
    top_k: int | jax.Array = 0,
    top_p: float | jax.Array = 1.0,
    num_decodes: int = 1,
    eos_id: int | jax.Array = EOS_ID,
) -> dict[str, jax.Array]:
    """Ancestral sampling from `softmax(filter(logits) / temperature)`.

    `temperature == 0` is greedy (as is `top_k == 1`); `top_k = 0` and `top_p = 1` disable the
    filters; all of them and `eos_id` may be traced. `num_decodes` independent samples per
    example (sorted by log-prob). Returns the module-doc dict; rng: a PRNG key.
    """
    greedy = isinstance(temperature, int | float) and temperature == 0.0
    if rng is None:
        if not greedy:
            raise ValueError("sampling needs an `rng`")
        rng = jax.random.PRNGKey(0)
    logits, cache, _, size = _start(model, params, batch, max_decode_length, num_decodes)
    rows = logits.shape[0]

    def body(state):
        step, tokens, lengths, log_probs, done, logits, cache = state
        if greedy:
            token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        else:
            heat = jnp.asarray(temperature, jnp.float32)
            filtered = _filter_logits(logits, top_k, top_p) / jnp.where(heat > 0, heat, 1.0)
            sampled = jax.random.categorical(jax.random.fold_in(rng, step), filtered)
            token = jnp.where(heat > 0, sampled, jnp.argmax(logits, axis=-1)).astype(jnp.int32)
        token = jnp.where(done, PAD_ID, token)
        token_lp = jnp.take_along_axis(jax.nn.log_softmax(logits), token[:, None], axis=1)[:, 0]
        log_probs = log_probs + jnp.where(done, 0.0, token_lp)
        lengths = lengths + (~done).astype(jnp.int32)
        tokens = tokens.at[:, step].set(token)
        done = done | (token == eos_id)
        logits, cache = model.decode_step(params, cache, token)
        return step + 1, tokens, lengths, log_probs, done, logits, cache

    def cond(state):
        step, done = state[0], state[4]
        return (step < max_decode_length) & ~jnp.all(done)

    state = (
        jnp.int32(0),
        jnp.zeros((rows, max_decode_length), jnp.int32),
        jnp.zeros((rows,), jnp.int32),
        jnp.zeros((rows,), jnp.float32),
        jnp.zeros((rows,), bool),
        logits,
        cache,
    )
    _, tokens, lengths, log_probs, _, _, _ = jax.lax.while_loop(cond, body, state)
    return _finish(tokens, lengths, log_probs, log_probs, size)


def greedy_decode(
    model: BaseModel,
    params: Any,
    batch: Batch,
    *,
    max_decode_length: int,
    eos_id: int | jax.Array = EOS_ID,
) -> dict[str, jax.Array]:
    """Argmax decoding (one decode per example). Returns the module-doc dict, N = 1."""
    return temperature_sample(
        model, params, batch, max_decode_length=max_decode_length, temperature=0.0, eos_id=eos_id
    )


# Scoring a closed set of continuations (rank classification) --------------------------------
@functools.partial(jax.jit, static_argnames=("model",))
def score_candidates(model: BaseModel, params: Any, batch: Batch,
                     candidates: jax.Array) -> jax.Array:
    """Log-likelihood `[B, C]` of each of C continuations shared by all B prompts.

    `batch` is a prompt as for `decode`; `candidates [C, T]` are token ids (each ending with
    EOS, right-padded with 0; padding is not scored). Prefills each prompt once, copies the
    cache C times and teacher-forces the candidates through `decode_step`: the cost of T
    decode steps on B*C rows instead of B*C full forward passes. Equals `model.score` of the
    concatenated examples (tested), which is what T5X's rank classification computes.
    """
    num, length = candidates.shape
    logits, cache, _, size = _start(model, params, batch, length, num)
    forced = jnp.tile(jnp.asarray(candidates, jnp.int32), (size, 1))  # row b*C + c: candidate c

    def step(carry, tokens):
        logits, cache, total = carry
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        picked = jnp.take_along_axis(log_probs, tokens[:, None], axis=-1)[:, 0]
        total = total + jnp.where(tokens > 0, picked, 0.0)
        logits, cache = model.decode_step(params, cache, tokens)
        return (logits, cache, total), None

    start = (logits, cache, jnp.zeros((size * num,), jnp.float32))
    (_, _, total), _ = jax.lax.scan(step, start, forced.T)
    return total.reshape(size, num)


# Beam search -----------------------------------------------------------------------------------
def beam_search(
    model: BaseModel,
    params: Any,
    batch: Batch,
    *,
    max_decode_length: int,
    num_beams: int = 4,
    num_decodes: int | None = None,
    alpha: float | jax.Array = 0.6,
    eos_id: int | jax.Array = EOS_ID,
) -> dict[str, jax.Array]:
    """Beam search with length penalty `((5 + len) / 6) ** alpha`; returns the best
    `num_decodes` (default `num_beams`) finished sequences per example.

    Each step extends every alive beam `[B, K]` by every token, keeps the top 2K candidates,
    moves those ending in EOS (and, at the last step, all of them) into the finished set (top K
    by penalised score), and keeps the top K others alive, reordering the cache rows to their
    parent beams. An example stops early once no alive beam can beat its worst finished one.
    """
    k = num_beams
    n = k if num_decodes is None else num_decodes
    if not 1 <= n <= k:
        raise ValueError(f"num_decodes={n} must be in [1, num_beams={k}]")
    length = max_decode_length
    logits, cache, axes, size = _start(model, params, batch, length, k)
    vocab = logits.shape[-1]
    first_beam = jnp.arange(k) == 0  # all K beams start identical: keep one alive
    alive_lp = jnp.broadcast_to(jnp.where(first_beam, 0.0, NEG_INF), (size, k))
    seqs = jnp.zeros((size, k, length), jnp.int32)
    fin = (
        seqs,
        jnp.full((size, k), NEG_INF),
        jnp.zeros((size, k), jnp.float32),
        jnp.zeros((size, k), jnp.int32),
    )  # tokens, scores, log_probs, lengths

    def body(state):
        step, seqs, alive_lp, fin, logits, cache, _ = state
        cand = alive_lp[..., None] + jax.nn.log_softmax(logits).reshape(size, k, vocab)
        top_lp, top_idx = jax.lax.top_k(cand.reshape(size, k * vocab), 2 * k)
        parent, token = top_idx // vocab, (top_idx % vocab).astype(jnp.int32)
        top_seqs = jnp.take_along_axis(seqs, parent[..., None], axis=1).at[:, :, step].set(token)
        ends = (token == eos_id) | (step == length - 1)
        penalty = length_penalty(step + 1, alpha)
        new_scores = jnp.where(ends & (top_lp > NEG_INF / 2), top_lp / penalty, NEG_INF)
        merged = (
            jnp.concatenate([fin[0], top_seqs], axis=1),
            jnp.concatenate([fin[1], new_scores], axis=1),
            jnp.concatenate([fin[2], top_lp], axis=1),
            jnp.concatenate([fin[3], jnp.full_like(token, step + 1)], axis=1),
        )
        best = jax.lax.top_k(merged[1], k)[1]
        fin = tuple(
            jnp.take_along_axis(x, best.reshape(*best.shape, *[1] * (x.ndim - 2)), axis=1)
            for x in merged
        )
        alive_lp, keep = jax.lax.top_k(jnp.where(ends, NEG_INF, top_lp), k)
        seqs = jnp.take_along_axis(top_seqs, keep[..., None], axis=1)
        rows = (jnp.arange(size)[:, None] * k + jnp.take_along_axis(parent, keep, axis=1)).ravel()
        cache = _take(cache, axes, rows)
        tokens = jnp.take_along_axis(token, keep, axis=1).ravel()
        logits, cache = model.decode_step(params, cache, tokens)
        # Log-probs only fall, so an alive beam's best final score is its log-prob over the
        # largest penalty it can still reach (at the next step or at the maximum length).
        reach = jnp.maximum(length_penalty(step + 2, alpha), length_penalty(length, alpha))
        settled = jnp.all(jnp.max(alive_lp, axis=1) / reach <= jnp.min(fin[1], axis=1))
        return step + 1, seqs, alive_lp, fin, logits, cache, settled

    def cond(state):
        return (state[0] < length) & ~state[6]

    state = (jnp.int32(0), seqs, alive_lp, fin, logits, cache, jnp.bool_(False))
    fin = jax.lax.while_loop(cond, body, state)[3]
    out = {"tokens": fin[0], "scores": fin[1], "log_probs": fin[2], "lengths": fin[3]}
    return {key: value[:, :n] for key, value in out.items()}


# Entry point -----------------------------------------------------------------------------------
DYNAMIC = {
    "greedy": {},
    "sample": {"temperature": 1.0, "top_k": 0, "top_p": 1.0},
    "beam": {"alpha": 0.6},
}


@functools.partial(jax.jit, static_argnames=("model", "method", "options"))
def _decode_jit(
    model: BaseModel,
    params: Any,
    batch: Batch,
    rng: jax.Array | None,
    dynamic: dict[str, jax.Array],
    method: str,
    options: tuple,
) -> dict[str, jax.Array]:
    kwargs = {**dict(options), **dynamic}
    if method == "greedy":
        return greedy_decode(model, params, batch, **kwargs)
    if method == "sample":
        return temperature_sample(model, params, batch, rng=rng, **kwargs)
    return beam_search(model, params, batch, **kwargs)


def decode(
    model: BaseModel,
    params: Any,
    batch: Batch,
    *,
    method: str = "greedy",
    max_decode_length: int,
    rng: jax.Array | None = None,
    **options: Any,
) -> dict[str, jax.Array]:
    """Jitted decoding: `method` is 'greedy', 'sample' (`temperature`, `top_k`, `top_p`,
    `num_decodes`) or 'beam' (`num_beams`, `num_decodes`, `alpha`); all take `eos_id`.

    Returns `tokens [B, N, L]`, `lengths [B, N]`, `log_probs [B, N]`, `scores [B, N]` (see the
    module docstring). Compiled once per model, method, input shapes and static option
    (`max_decode_length`, `num_decodes`, `num_beams`); `temperature`, `top_k`, `top_p`,
    `alpha` and `eos_id` are traced, so changing them does not recompile.
    """
    if method not in ("greedy", "sample", "beam"):
        raise ValueError(f"unknown decoding method {method!r}: 'greedy', 'sample' or 'beam'")
    options["max_decode_length"] = max_decode_length
    dynamic = {**DYNAMIC[method], "eos_id": EOS_ID}
    dynamic = {k: jnp.asarray(options.pop(k, v)) for k, v in dynamic.items()}
    batch = {key: jnp.asarray(value) for key, value in batch.items()}
    static = tuple(sorted(options.items()))
    return _decode_jit(model, params, batch, rng, dynamic, method, static)
