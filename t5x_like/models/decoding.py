"""Model-agnostic autoregressive decoding over a `tokens_to_logits` step function (as T5X's).

Every algorithm starts from the next-token `logits [B, V]` after a prompt and a `cache` holding
that prompt, and calls `tokens_to_logits(tokens [B'], cache) -> (logits [B', V], cache)` once per
generated token; it knows nothing of models, prompts or families (`BaseModel.decode` builds the
prompt, prefills it and wraps `decode_step`). `cache_axes` gives, per cache leaf, the axis that
holds the batch (None: batch-free; the default None for the whole tree: axis 0 of every leaf),
so rows can be copied (several decodes per example) and reordered (beams) on any cache layout.

Three algorithms, each one `jax.lax.while_loop` (jit-compatible, static shapes):
`greedy_decode`, `temperature_sample` (temperature, top-k, top-p) and `beam_search` (length
penalty `((5 + len) / 6) ** alpha`, T5X's default alpha = 0.6); `score_continuations`
teacher-forces a closed set of continuations per prompt (rank classification) on one cache.

Outputs hold generated tokens only: `tokens [B, N, L]` (N = `num_decodes`, L =
`max_decode_length`), each row ending at its first EOS (kept) and padded with 0 after it;
`lengths [B, N]` count tokens up to and including EOS; `log_probs [B, N]` is the model's
log-likelihood of those tokens (untempered, unfiltered softmax); `scores [B, N]` equals
`log_probs` except for beam search, where it is `log_probs / length_penalty(lengths)`. Rows are
sorted by `scores`, best first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from t5x_like.models.config import EOS_ID, NEG_INF, PAD_ID

Batch = Mapping[str, Any]
#: `(tokens [B], cache) -> (logits [B, V], cache)`: feeds one token per row.
TokensToLogits = Callable[[jax.Array, Any], tuple[jax.Array, Any]]


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
    """GNMT/T5X brevity penalty `((5 + length) / 6) ** alpha` (float32, same shape as `length`)."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


# Cache rows ------------------------------------------------------------------------------------
def gather_rows(cache: Any, cache_axes: Any, index: jax.Array) -> Any:
    """Takes rows `index [B']` along every cache leaf's batch axis (copy/reorder rows)."""
    if cache_axes is None:
        return jax.tree.map(lambda x: jnp.take(x, index, axis=0), cache)
    take = lambda x, ax: x if ax is None else jnp.take(x, index, axis=ax)
    return jax.tree.map(take, cache, cache_axes, is_leaf=lambda x: x is None)


def _repeat(logits: jax.Array, cache: Any, cache_axes: Any, copies: int) -> tuple[jax.Array, Any]:
    """Each of the B rows `copies` times in a row (row b*copies + i is a copy of row b)."""
    index = jnp.repeat(jnp.arange(logits.shape[0]), copies)
    return logits[index], gather_rows(cache, cache_axes, index)


def _take_rows(x: jax.Array, index: jax.Array) -> jax.Array:
    """`x [B, N, ...]` at `index [B, M]` along axis 1 -> `[B, M, ...]`."""
    return jnp.take_along_axis(x, index.reshape(*index.shape, *[1] * (x.ndim - 2)), axis=1)


# Greedy and sampling ---------------------------------------------------------------------------
@flax.struct.dataclass
class SamplingState:
    """`temperature_sample`'s loop state; rows = examples x decodes."""

    step: jax.Array       # [] int32: the output position written next
    tokens: jax.Array     # [rows, max_decode_length] int32 generated tokens, 0 after EOS
    lengths: jax.Array    # [rows] int32 tokens so far, up to and including EOS
    log_probs: jax.Array  # [rows] float32 log-likelihood of the tokens so far
    done: jax.Array       # [rows] bool: EOS emitted
    logits: jax.Array     # [rows, vocab] logits of the next token
    cache: Any            # the caller's cache, rows along `cache_axes`


def _filter_logits(logits: jax.Array, top_k: int | jax.Array,
                   top_p: float | jax.Array) -> jax.Array:
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
    logits: jax.Array, cache: Any, tokens_to_logits: TokensToLogits, *, max_decode_length: int,
    cache_axes: Any = None, rng: jax.Array | None = None, temperature: float | jax.Array = 1.0,
    top_k: int | jax.Array = 0, top_p: float | jax.Array = 1.0, num_decodes: int = 1,
    eos_id: int | jax.Array = EOS_ID,
) -> dict[str, jax.Array]:
    """Ancestral sampling from `softmax(filter(logits) / temperature)`, starting from the
    next-token `logits [B, V]` and `cache` of B prompts.

    `temperature == 0` is greedy (as is `top_k == 1`); `top_k = 0` and `top_p = 1` disable the
    filters; all of them and `eos_id` may be traced. `num_decodes` independent samples per
    example (sorted by log-prob). Returns the module-doc dict; rng: a PRNG key.
    """
    greedy = isinstance(temperature, int | float) and temperature == 0.0
    if rng is None:
        if not greedy:
            raise ValueError("sampling needs an `rng`")
        rng = jax.random.PRNGKey(0)
    size = logits.shape[0]
    logits, cache = _repeat(logits, cache, cache_axes, num_decodes)
    rows = logits.shape[0]

    def body(state: SamplingState) -> SamplingState:
        logits, done, step = state.logits, state.done, state.step
        if greedy:
            token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        else:
            heat = jnp.asarray(temperature, jnp.float32)
            filtered = _filter_logits(logits, top_k, top_p) / jnp.where(heat > 0, heat, 1.0)
            sampled = jax.random.categorical(jax.random.fold_in(rng, step), filtered)
            token = jnp.where(heat > 0, sampled, jnp.argmax(logits, axis=-1)).astype(jnp.int32)
        token = jnp.where(done, PAD_ID, token)
        token_lp = jnp.take_along_axis(jax.nn.log_softmax(logits), token[:, None], axis=1)[:, 0]
        log_probs = state.log_probs + jnp.where(done, 0.0, token_lp)
        lengths = state.lengths + (~done).astype(jnp.int32)
        tokens = state.tokens.at[:, step].set(token)
        done = done | (token == eos_id)
        logits, cache = tokens_to_logits(token, state.cache)
        return SamplingState(step=step + 1, tokens=tokens, lengths=lengths,
                             log_probs=log_probs, done=done, logits=logits, cache=cache)

    def cond(state: SamplingState) -> jax.Array:
        return (state.step < max_decode_length) & ~jnp.all(state.done)

    state = SamplingState(
        step=jnp.int32(0), tokens=jnp.zeros((rows, max_decode_length), jnp.int32),
        lengths=jnp.zeros((rows,), jnp.int32), log_probs=jnp.zeros((rows,), jnp.float32),
        done=jnp.zeros((rows,), bool), logits=logits, cache=cache)
    final = jax.lax.while_loop(cond, body, state)
    shape = (size, num_decodes)
    out = {"tokens": final.tokens.reshape(*shape, -1), "lengths": final.lengths.reshape(shape),
           "log_probs": final.log_probs.reshape(shape), "scores": final.log_probs.reshape(shape)}
    order = jnp.argsort(-out["scores"], axis=1, stable=True)  # best first
    return {key: _take_rows(value, order) for key, value in out.items()}


def greedy_decode(
    logits: jax.Array, cache: Any, tokens_to_logits: TokensToLogits, *, max_decode_length: int,
    cache_axes: Any = None, eos_id: int | jax.Array = EOS_ID,
) -> dict[str, jax.Array]:
    """Argmax decoding (one decode per example). Returns the module-doc dict, N = 1."""
    return temperature_sample(logits, cache, tokens_to_logits, cache_axes=cache_axes,
                              max_decode_length=max_decode_length, temperature=0.0,
                              eos_id=eos_id)


# Scoring a closed set of continuations (rank classification) --------------------------------
def score_continuations(logits: jax.Array, cache: Any, tokens_to_logits: TokensToLogits,
                        candidates: jax.Array, *, cache_axes: Any = None) -> jax.Array:
    """Log-likelihood `[B, C]` of each of C continuations shared by all B prompts.

    `candidates [C, T]` are token ids (right-padded with 0; padding is not scored). Copies each
    prompt's cache C times and teacher-forces the candidates through `tokens_to_logits`: the
    cost of T steps on B*C rows instead of B*C full forward passes.
    """
    num = candidates.shape[0]
    size = logits.shape[0]
    logits, cache = _repeat(logits, cache, cache_axes, num)
    forced = jnp.tile(jnp.asarray(candidates, jnp.int32), (size, 1))  # row b*C + c: candidate c

    def step(carry, tokens):
        logits, cache, total = carry
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        picked = jnp.take_along_axis(log_probs, tokens[:, None], axis=-1)[:, 0]
        total = total + jnp.where(tokens > 0, picked, 0.0)
        logits, cache = tokens_to_logits(tokens, cache)
        return (logits, cache, total), None

    start = (logits, cache, jnp.zeros((size * num,), jnp.float32))
    (_, _, total), _ = jax.lax.scan(step, start, forced.T)
    return total.reshape(size, num)


# Beam search -----------------------------------------------------------------------------------
@flax.struct.dataclass
class BeamState:
    """`beam_search`'s loop state: K alive beams and the K best finished sequences per example."""

    step: jax.Array                # [] int32: the output position written next
    alive_seqs: jax.Array          # [batch, beams, max_decode_length] int32
    alive_log_probs: jax.Array     # [batch, beams] float32; NEG_INF: no such beam
    finished_seqs: jax.Array       # [batch, beams, max_decode_length] int32
    finished_scores: jax.Array     # [batch, beams] float32 log-prob / length penalty; NEG_INF: none
    finished_log_probs: jax.Array  # [batch, beams] float32
    finished_lengths: jax.Array    # [batch, beams] int32, up to and including EOS
    logits: jax.Array              # [batch * beams, vocab] next-token logits of the alive beams
    cache: Any                     # the caller's cache, batch * beams rows along `cache_axes`
    settled: jax.Array             # [] bool: no alive beam can beat any example's worst finished


def _initial_beams(logits: jax.Array, cache: Any, size: int, k: int, length: int) -> BeamState:
    """Step 0: one alive beam per example (all K start identical, so the others get NEG_INF
    log-probs) and no finished ones."""
    seqs = jnp.zeros((size, k, length), jnp.int32)
    return BeamState(
        step=jnp.int32(0), alive_seqs=seqs,
        alive_log_probs=jnp.broadcast_to(jnp.where(jnp.arange(k) == 0, 0.0, NEG_INF), (size, k)),
        finished_seqs=seqs, finished_scores=jnp.full((size, k), NEG_INF),
        finished_log_probs=jnp.zeros((size, k), jnp.float32),
        finished_lengths=jnp.zeros((size, k), jnp.int32),
        logits=logits, cache=cache, settled=jnp.bool_(False))


def _best_finished(state: BeamState, seqs: jax.Array, scores: jax.Array, log_probs: jax.Array,
                   lengths: jax.Array, k: int) -> tuple[jax.Array, ...]:
    """The K best by penalised score of the K finished so far and the 2K candidates
    (`seqs [B, 2K, T]`, `scores` NEG_INF unless the candidate ends here, `log_probs`,
    `lengths [B, 2K]`): (seqs, scores, log_probs, lengths) of the new finished set."""
    merged = (
        jnp.concatenate([state.finished_seqs, seqs], axis=1),
        jnp.concatenate([state.finished_scores, scores], axis=1),
        jnp.concatenate([state.finished_log_probs, log_probs], axis=1),
        jnp.concatenate([state.finished_lengths, lengths], axis=1),
    )
    best = jax.lax.top_k(merged[1], k)[1]
    return tuple(_take_rows(x, best) for x in merged)


def beam_search(
    logits: jax.Array, cache: Any, tokens_to_logits: TokensToLogits, *, max_decode_length: int,
    cache_axes: Any = None, num_beams: int = 4, num_decodes: int | None = None,
    alpha: float | jax.Array = 0.6, eos_id: int | jax.Array = EOS_ID,
) -> dict[str, jax.Array]:
    """Beam search with length penalty `((5 + len) / 6) ** alpha` from the next-token
    `logits [B, V]` and `cache` of B prompts; returns the best `num_decodes` (default
    `num_beams`) finished sequences per example.

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
    size = logits.shape[0]
    logits, cache = _repeat(logits, cache, cache_axes, k)
    vocab = logits.shape[-1]

    def body(state: BeamState) -> BeamState:
        step, seqs = state.step, state.alive_seqs
        lp = jax.nn.log_softmax(state.logits).reshape(size, k, vocab)
        cand = state.alive_log_probs[..., None] + lp
        top_lp, top_idx = jax.lax.top_k(cand.reshape(size, k * vocab), 2 * k)
        parent, token = top_idx // vocab, (top_idx % vocab).astype(jnp.int32)
        top_seqs = jnp.take_along_axis(seqs, parent[..., None], axis=1).at[:, :, step].set(token)
        ends = (token == eos_id) | (step == length - 1)
        penalty = length_penalty(step + 1, alpha)
        new_scores = jnp.where(ends & (top_lp > NEG_INF / 2), top_lp / penalty, NEG_INF)
        fin_seqs, fin_scores, fin_lp, fin_lengths = _best_finished(
            state, top_seqs, new_scores, top_lp, jnp.full_like(token, step + 1), k)
        alive_lp, keep = jax.lax.top_k(jnp.where(ends, NEG_INF, top_lp), k)
        seqs = jnp.take_along_axis(top_seqs, keep[..., None], axis=1)
        rows = (jnp.arange(size)[:, None] * k + jnp.take_along_axis(parent, keep, axis=1)).ravel()
        cache = gather_rows(state.cache, cache_axes, rows)
        tokens = jnp.take_along_axis(token, keep, axis=1).ravel()
        logits, cache = tokens_to_logits(tokens, cache)
        # Log-probs only fall, so an alive beam's best final score is its log-prob over the
        # largest penalty it can still reach (at the next step or at the maximum length).
        reach = jnp.maximum(length_penalty(step + 2, alpha), length_penalty(length, alpha))
        settled = jnp.all(jnp.max(alive_lp, axis=1) / reach <= jnp.min(fin_scores, axis=1))
        return BeamState(step=step + 1, alive_seqs=seqs, alive_log_probs=alive_lp,
                         finished_seqs=fin_seqs, finished_scores=fin_scores,
                         finished_log_probs=fin_lp, finished_lengths=fin_lengths,
                         logits=logits, cache=cache, settled=settled)

    def cond(state: BeamState) -> jax.Array:
        return (state.step < length) & ~state.settled

    final = jax.lax.while_loop(cond, body, _initial_beams(logits, cache, size, k, length))
    out = {"tokens": final.finished_seqs, "scores": final.finished_scores,
           "log_probs": final.finished_log_probs, "lengths": final.finished_lengths}
    return {key: value[:, :n] for key, value in out.items()}


# Entry points kept for callers of the model-level API ------------------------------------------
def decode(model: Any, params: Any, batch: Batch, **kwargs: Any) -> dict[str, jax.Array]:
    """`model.decode(params, batch, **kwargs)` (see `BaseModel.decode`)."""
    return model.decode(params, batch, **kwargs)


def score_candidates(model: Any, params: Any, batch: Batch, candidates: jax.Array) -> jax.Array:
    """`model.score_candidates(params, batch, candidates)` (see `BaseModel.score_candidates`)."""
    return model.score_candidates(params, batch, candidates)
