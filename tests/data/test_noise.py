"""Noise masks: exact counts, span structure, bounds, determinism (real TF ops, no mocks)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from t5x_like.data import noise

SETTINGS = settings(max_examples=30, deadline=None)
seeds = st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1))


def runs(mask: np.ndarray) -> list[tuple[bool, int]]:
    """Run-length encoding: [(value, length), ...]."""
    return [(v, len(list(group))) for v, group in itertools.groupby(mask.tolist())]


@SETTINGS
@given(
    length=st.integers(0, 700),
    density=st.floats(0.05, 0.5),
    mean_span=st.floats(1.0, 12.0),
    seed=seeds,
)
def test_random_spans_counts_and_alternation(length, density, mean_span, seed):
    mask = noise.random_spans_noise_mask(length, density, mean_span, tf.constant(seed)).numpy()
    assert mask.shape == (length,) and mask.dtype == bool
    num_noise = noise.num_noise_tokens(length, density)
    num_spans = noise.num_noise_spans(length, num_noise, mean_span)
    assert mask.sum() == num_noise
    if length >= 2:
        assert 1 <= num_noise <= length - 1
    r = runs(mask)
    noise_runs = [n for v, n in r if v]
    assert len(noise_runs) == num_spans
    if num_noise:
        # Alternates, starting with non-noise and ending with a noise span.
        assert r[0][0] is False and r[-1][0] is True
        assert len(r) == 2 * num_spans


def test_random_spans_reference_counts():
    # T5's 512-input setting: 568 raw tokens -> 85 noise tokens in 28 spans.
    mask = noise.random_spans_noise_mask(568, 0.15, 3.0, tf.constant([3, 4])).numpy()
    assert mask.sum() == 85
    assert sum(1 for v, _ in runs(mask) if v) == 28
    assert noise.num_noise_tokens(568, 0.15) == 85
    assert noise.num_noise_spans(568, 85, 3.0) == 28


@SETTINGS
@given(length=st.integers(0, 400), density=st.floats(0.01, 0.99), seed=seeds)
def test_iid_mask_exact_count(length, density, seed):
    mask = noise.iid_noise_mask(length, density, tf.constant(seed)).numpy()
    assert mask.shape == (length,)
    assert mask.sum() == noise.num_noise_tokens(length, density)


def test_iid_mask_is_uniform_over_positions():
    # Every position is noise with probability ~density (positions drawn without replacement).
    draws = np.stack(
        [noise.iid_noise_mask(40, 0.25, tf.constant([i, 7])).numpy() for i in range(400)]
    )
    per_position = draws.mean(axis=0)
    assert abs(draws.mean() - 0.25) < 1e-9  # exactly 10 of 40 every time
    assert np.all(np.abs(per_position - 0.25) < 0.1), per_position


@SETTINGS
@given(length=st.integers(0, 300), seed=seeds, low=st.integers(1, 50), high=st.integers(1, 300))
def test_prefix_mask_is_a_suffix_within_bounds(length, seed, low, high):
    mask = noise.prefix_noise_mask(length, tf.constant(seed), None, low, high).numpy()
    n = int(mask.sum())
    assert mask.tolist() == [False] * (length - n) + [True] * n
    if length < 2:
        assert n == 0
    else:
        top = min(length - 1, high)
        assert min(max(low, 1), top) <= n <= top


def test_prefix_mask_split_point_covers_the_range():
    counts = {
        int(noise.prefix_noise_mask(10, tf.constant([i, 1])).numpy().sum()) for i in range(300)
    }
    assert counts == set(range(1, 10))


def test_prefix_mask_with_density_is_fixed_fraction():
    mask = noise.prefix_noise_mask(100, tf.constant([1, 2]), noise_density=0.25).numpy()
    assert mask.sum() == 25 and mask[-25:].all()


def test_full_and_none_masks():
    assert noise.full_noise_mask(7).numpy().all()
    assert not noise.no_noise_mask(7).numpy().any()
    assert noise.noise_mask("full", 5, tf.constant([0, 0])).numpy().sum() == 5


@SETTINGS
@given(items=st.integers(1, 300), data=st.data(), seed=seeds)
def test_random_segmentation_is_a_composition(items, data, seed):
    segments = data.draw(st.integers(1, items))
    parts = noise.random_segmentation(items, segments, tf.constant(seed)).numpy()
    assert parts.shape == (segments,)
    assert parts.sum() == items and (parts >= 1).all()


@pytest.mark.parametrize("kind", ["iid", "random_spans", "prefix"])
def test_masks_deterministic_per_seed_and_vary_across_seeds(kind):
    density = None if kind == "prefix" else 0.15
    a = noise.noise_mask(kind, 200, tf.constant([5, 6]), noise_density=density).numpy()
    b = noise.noise_mask(kind, 200, tf.constant([5, 6]), noise_density=density).numpy()
    c = noise.noise_mask(kind, 200, tf.constant([5, 7]), noise_density=density).numpy()
    assert (a == b).all()
    assert (a != c).any()


def test_masks_inside_tf_function_match_eager():
    fn = tf.function(lambda n, s: noise.random_spans_noise_mask(n, 0.15, 3.0, s))
    seed = tf.constant([9, 9])
    assert (fn(tf.constant(123), seed).numpy() ==
            noise.random_spans_noise_mask(123, 0.15, 3.0, seed).numpy()).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match="Unknown noise mask"):
        noise.noise_mask("gaussian", 10, tf.constant([0, 0]))
    with pytest.raises(ValueError, match="noise_density"):
        noise.noise_mask("iid", 10, tf.constant([0, 0]), noise_density=1.5)
    with pytest.raises(ValueError, match="mean_noise_span_length"):
        noise.random_spans_noise_mask(10, 0.15, 0.5, tf.constant([0, 0]))
