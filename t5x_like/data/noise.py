"""Noise masks for the pre-training objectives (T5 paper, Section 3.3).

Every mask is a stateless TensorFlow function of a chunk length and a seed (an int32 tensor of
shape [2], as `tf.random.stateless_*` take): the same (length, seed) always gives the same mask,
and it runs inside graph-mode `tf.data` maps. A mask is a bool tensor of shape [length]; True
marks a "noise" token (corrupted, masked, dropped or predicted, depending on the objective).

The plain-Python count helpers (`num_noise_tokens`, `num_noise_spans`) are the exact same
arithmetic as the TF masks (float64, round-half-to-even in both), so the chunk-size
calculations in `objectives.py` agree with what the masks produce, token for token.

Kinds (the names the objectives and gin files use):
- ``iid``: `num_noise_tokens(L, d)` positions drawn uniformly without replacement, so each
  token is noise with probability d and the count is fixed (which lets the pipeline size
  chunks so that nothing is ever truncated).
- ``random_spans``: T5's span mask: round(L·d) noise tokens (clamped to [1, L-1]) in
  max(1, round(noise/mean_span)) spans; noise and non-noise span lengths are random
  partitions of their totals; spans alternate, starting with non-noise.
- ``prefix``: a random split point; the suffix is noise.
- ``full``: every token is noise (density 1.0, deshuffling).
- ``none``: no noise (plain language modelling).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf


def num_noise_tokens(length: int, noise_density: float) -> int:
    """round(length · density) clamped to [1, length-1]; 0 when length < 2 (nothing to hide)."""
    if length < 2:
        return 0
    return min(max(round(float(length) * float(noise_density)), 1), length - 1)


def num_noise_spans(length: int, num_noise: int, mean_noise_span_length: float) -> int:
    """max(1, round(num_noise / mean_span)), at most min(num_noise, length - num_noise)."""
    if num_noise <= 0:
        return 0
    spans = max(round(float(num_noise) / float(mean_noise_span_length)), 1)
    return min(spans, num_noise, length - num_noise)


def _tf_num_noise_tokens(length: tf.Tensor, noise_density: float) -> tf.Tensor:
    """TF twin of `num_noise_tokens` (scalar int32)."""
    raw = tf.cast(tf.round(tf.cast(length, tf.float64) * float(noise_density)), tf.int32)
    clamped = tf.minimum(tf.maximum(raw, 1), length - 1)
    return tf.where(length < 2, 0, clamped)


def _tf_num_noise_spans(length: tf.Tensor, num_noise: tf.Tensor,
                        mean_noise_span_length: float) -> tf.Tensor:
    """TF twin of `num_noise_spans` (scalar int32)."""
    raw = tf.cast(tf.round(tf.cast(num_noise, tf.float64) / float(mean_noise_span_length)),
                  tf.int32)
    spans = tf.minimum(tf.maximum(raw, 1), tf.minimum(num_noise, length - num_noise))
    return tf.where(num_noise <= 0, 0, spans)


def random_segmentation(num_items: tf.Tensor, num_segments: tf.Tensor, seed: tf.Tensor
                        ) -> tf.Tensor:
    """Random composition of `num_items` into `num_segments` positive parts.

    Chooses num_segments-1 distinct cut points among the num_items-1 gaps uniformly at random.
    Requires 1 <= num_segments <= num_items; num_segments == 0 gives an empty vector.
    Returns int32 [num_segments] summing to num_items.
    """
    num_items = tf.convert_to_tensor(num_items, tf.int32)
    num_segments = tf.convert_to_tensor(num_segments, tf.int32)
    gaps = tf.maximum(num_items - 1, 0)
    num_cuts = tf.maximum(num_segments - 1, 0)
    order = tf.argsort(tf.random.stateless_uniform([gaps], seed=seed))
    cuts = tf.scatter_nd(order[:num_cuts, None], tf.ones([num_cuts], tf.int32), [gaps])
    segment_id = tf.cumsum(tf.concat([[0], cuts], axis=0))[:num_items]
    return tf.math.bincount(segment_id, minlength=num_segments, maxlength=num_segments,
                            dtype=tf.int32)


def iid_noise_mask(length: tf.Tensor, noise_density: float, seed: tf.Tensor) -> tf.Tensor:
    """I.i.d. token mask: `num_noise_tokens(length, density)` uniformly chosen positions.
    Returns bool [length]."""
    length = tf.convert_to_tensor(length, tf.int32)
    num_noise = _tf_num_noise_tokens(length, noise_density)
    order = tf.argsort(tf.random.stateless_uniform([length], seed=seed))
    return tf.scatter_nd(order[:num_noise, None], tf.ones([num_noise], tf.bool), [length])


def random_spans_noise_mask(length: tf.Tensor, noise_density: float,
                            mean_noise_span_length: float, seed: tf.Tensor) -> tf.Tensor:
    """T5's random-span mask (see module docstring). Returns bool [length]."""
    if mean_noise_span_length < 1:
        raise ValueError(f"mean_noise_span_length must be >= 1, got {mean_noise_span_length}")
    length = tf.convert_to_tensor(length, tf.int32)
    num_noise = _tf_num_noise_tokens(length, noise_density)
    num_spans = _tf_num_noise_spans(length, num_noise, mean_noise_span_length)
    seeds = tf.random.experimental.stateless_split(seed, 2)
    noise_lengths = random_segmentation(num_noise, num_spans, seeds[0])
    nonnoise_lengths = random_segmentation(length - num_noise, num_spans, seeds[1])
    # Spans alternate non-noise, noise, non-noise, ...: ends of all spans in order.
    span_ends = tf.cumsum(tf.reshape(tf.stack([nonnoise_lengths, noise_lengths], axis=1), [-1]))
    span_index = tf.searchsorted(span_ends, tf.range(length), side="right")
    return tf.equal(span_index % 2, 1)


def prefix_noise_mask(length: tf.Tensor, seed: tf.Tensor, noise_density: float | None = None,
                      min_noise: tf.Tensor | int = 1, max_noise: tf.Tensor | int | None = None
                      ) -> tf.Tensor:
    """Prefix-LM split: the suffix is noise. Returns bool [length].

    Without `noise_density` the suffix length is uniform over [max(1, min_noise),
    min(length-1, max_noise)] (T5's "random point"); with it, the suffix is
    `num_noise_tokens(length, density)` clipped to that range (UL2's S-denoiser). Chunks
    shorter than 2 tokens get no noise.
    """
    length = tf.convert_to_tensor(length, tf.int32)
    low = tf.maximum(tf.convert_to_tensor(min_noise, tf.int32), 1)
    high = length - 1
    if max_noise is not None:
        high = tf.minimum(high, tf.convert_to_tensor(max_noise, tf.int32))
    low = tf.minimum(low, high)
    if noise_density is None:
        span = tf.maximum(high - low + 1, 1)
        draw = tf.random.stateless_uniform([], seed=seed, minval=0, maxval=span, dtype=tf.int32)
        num_noise = low + draw
    else:
        num_noise = tf.clip_by_value(_tf_num_noise_tokens(length, noise_density), low, high)
    num_noise = tf.where(length < 2, 0, tf.maximum(num_noise, 0))
    return tf.range(length) >= length - num_noise


def full_noise_mask(length: tf.Tensor) -> tf.Tensor:
    """Every token is noise (density 1.0). Returns bool [length]."""
    return tf.ones([length], tf.bool)


def no_noise_mask(length: tf.Tensor) -> tf.Tensor:
    """No token is noise. Returns bool [length]."""
    return tf.zeros([length], tf.bool)


# ----------------------------------------------------------------------------- the kinds
Profile = tuple[int, int, int]  # (noise tokens, noise spans, trailing non-noise) of a chunk


@dataclasses.dataclass(frozen=True)
class MaskKind:
    """One kind, in the one place that knows it: how it draws a mask inside the pipeline, and
    the shapes (`Profile`s) a chunk of t >= 1 tokens can take, which `objectives.py` turns into
    chunk and feature lengths. A `bounded` kind's noise count is a range the objective sets
    from its token budgets (`prefix`: the suffix must fit the transforms' budgets)."""

    draw: Callable[[tf.Tensor, tf.Tensor, float | None, float, Any, Any], tf.Tensor]
    # (length, seed, noise_density, mean_noise_span_length, min_noise, max_noise) -> bool [length]
    profiles: Callable[[int, float | None, float, Callable[[], tuple[int, int]]], list[Profile]]
    # (t, noise_density, mean_noise_span_length, bounds() -> (min, max) noise) -> profiles
    needs_density: bool = False
    bounded: bool = False


def _iid_profiles(t: int, density: float | None, _span: float, _bounds) -> list[Profile]:
    n = num_noise_tokens(t, density)
    if n == 0:
        return [(0, 0, 1)]
    return [(n, min(n, t - n + 1), 0), (n, min(n, t - n), 1)]  # ends in noise or not


def _spans_profiles(t: int, density: float | None, span: float, _bounds) -> list[Profile]:
    n = num_noise_tokens(t, density)
    return [(n, num_noise_spans(t, n, span), 1 if n == 0 else 0)]


def _prefix_profiles(t: int, density: float | None, _span: float, bounds) -> list[Profile]:
    if t < 2:
        return [(0, 0, 1)]
    if density is not None:
        return [(num_noise_tokens(t, density), 1, 0)]
    low, high = bounds()
    return [(n, 1, 0) for n in {low, high}]


MASKS: dict[str, MaskKind] = {
    "iid": MaskKind(lambda length, seed, density, *_: iid_noise_mask(length, density, seed),
                    _iid_profiles, needs_density=True),
    "random_spans": MaskKind(
        lambda length, seed, density, span, *_: random_spans_noise_mask(
            length, density, span, seed),
        _spans_profiles, needs_density=True),
    "prefix": MaskKind(
        lambda length, seed, density, _span, low, high: prefix_noise_mask(
            length, seed, density, low, high),
        _prefix_profiles, bounded=True),
    "full": MaskKind(lambda length, *_: full_noise_mask(length), lambda t, *_: [(t, 1, 0)]),
    "none": MaskKind(lambda length, *_: no_noise_mask(length), lambda t, *_: [(0, 0, 1)]),
}


def mask_kind(kind: str) -> MaskKind:
    """The record of `kind`; an unknown name is an error naming the known ones."""
    if kind not in MASKS:
        raise ValueError(f"Unknown noise mask kind {kind!r}; expected one of {tuple(MASKS)}.")
    return MASKS[kind]


def noise_mask(kind: str, length: tf.Tensor, seed: tf.Tensor, *,
               noise_density: float | None = 0.15, mean_noise_span_length: float = 3.0,
               min_noise: tf.Tensor | int = 1, max_noise: tf.Tensor | int | None = None
               ) -> tf.Tensor:
    """The mask of `kind` (a key of `MASKS`) for a chunk of `length`. Returns bool [length]."""
    record = mask_kind(kind)
    if record.needs_density and (noise_density is None or not 0.0 < noise_density < 1.0):
        raise ValueError(f"{kind!r} mask needs 0 < noise_density < 1, got {noise_density}")
    return record.draw(length, seed, noise_density, mean_noise_span_length, min_noise, max_noise)
