"""Bootstrap scores, Kendall τ and claim verdicts against sklearn/scipy and known truths."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import kendalltau

from t5x_like.data import scoring
from t5x_like.sweep import paper, stats


def _labels(rng: np.random.Generator, n: int, classes: list[str], p=None) -> list[str]:
    return [str(x) for x in rng.choice(classes, size=n, p=p)]


@pytest.mark.parametrize("metric", ["accuracy", "f1_macro"])
def test_scores_equal_the_suite_metrics_on_full_and_resampled_splits(metric: str) -> None:
    rng = np.random.default_rng(0)
    classes = ["ham", "spam", "other", "rare"]
    targets = _labels(rng, 300, classes, p=[0.6, 0.3, 0.09, 0.01])
    # outputs include a label that is never a target ('misspelt')
    outputs = _labels(rng, 300, [*classes, "misspelt"], p=[0.5, 0.3, 0.1, 0.05, 0.05])
    pred = stats.encode(metric, targets, outputs)
    fn = getattr(scoring, metric)
    full = stats.scores(pred, np.arange(300)[None])[0]
    assert full == pytest.approx(fn(targets, outputs)[metric], abs=1e-9)
    index = rng.integers(0, 300, size=(20, 300))
    got = stats.scores(pred, index)
    want = [fn([targets[i] for i in row], [outputs[i] for i in row])[metric] for row in index]
    np.testing.assert_allclose(got, want, atol=1e-9)


def test_exact_match_uses_the_given_normalisation() -> None:
    targets, outputs = ["The cat", "dog", "a bird!"], ["cat", "dogs", "bird"]
    pred = stats.encode("exact_match", targets, outputs, normalize=scoring.normalize_answer)
    got = stats.scores(pred, np.arange(3)[None])[0]
    assert got == pytest.approx(scoring.exact_match(targets, outputs)["exact_match"])
    assert got == pytest.approx(200 / 3)


def test_kendall_tau_equals_scipy_with_ties() -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        x = rng.integers(0, 4, size=7).astype(float)
        y = rng.integers(0, 5, size=7).astype(float)
        want = kendalltau(x, y).statistic
        got = stats.kendall_tau(x[None], y)[0]
        if np.isnan(want):
            assert np.isnan(got)
        else:
            assert got == pytest.approx(want)


def _row(rng: np.random.Generator, accuracy: float, n: int, seeds: int) -> list[dict]:
    """`seeds` runs of a classifier right on a random `accuracy` share of n binary examples."""
    targets = _labels(np.random.default_rng(99), n, ["a", "b"])  # same test split everywhere
    runs = []
    for _ in range(seeds):
        right = rng.random(n) < accuracy
        flip = {"a": "b", "b": "a"}
        outputs = [t if r else flip[t] for t, r in zip(targets, right, strict=True)]
        runs.append({"task": stats.encode("accuracy", targets, outputs)})
    return runs


def test_bootstrap_spread_matches_the_binomial_standard_error() -> None:
    rng = np.random.default_rng(2)
    rows = {"r": _row(rng, 0.7, 2000, seeds=1)}
    boot = stats.row_replicates(rows, ["task"], replicates=3000)["r"]
    point = stats.point_scores(rows, ["task"])["r"][0]
    expected_se = 100 * np.sqrt(point / 100 * (1 - point / 100) / 2000)
    assert boot.std() == pytest.approx(expected_se, rel=0.1)
    assert boot.mean() == pytest.approx(point, abs=0.2)


def test_claim_verdicts_follow_the_truth() -> None:
    rng = np.random.default_rng(3)
    rows = {"good": _row(rng, 0.80, 1000, 3), "bad": _row(rng, 0.60, 1000, 3),
            "good_twin": _row(rng, 0.80, 1000, 3), "tiny_edge": _row(rng, 0.805, 1000, 3)}
    boot = stats.row_replicates(rows, ["task"], replicates=1000)
    points = stats.point_scores(rows, ["task"])
    claim = paper.Claim("t", "good beats bad", ("good",), ("bad",))
    assert stats.evaluate_claim(claim, boot, points)["verdict"] == "reproduced"
    reverse = paper.Claim("t", "bad beats good", ("bad",), ("good",))
    res = stats.evaluate_claim(reverse, boot, points)
    assert res["verdict"] == "contradicted" and res["difference"] < -15
    assert res["seeds_needed"] is None  # settled the other way: no seed count is "needed"
    twins = paper.Claim("t", "twins equal", ("good",), ("good_twin",), "≈", margin=5.0)
    assert stats.evaluate_claim(twins, boot, points)["verdict"] == "reproduced"
    far = paper.Claim("t", "good ≈ bad", ("good",), ("bad",), "≈", margin=5.0)
    assert stats.evaluate_claim(far, boot, points)["verdict"] == "contradicted"
    edge = stats.evaluate_claim(paper.Claim("t", "edge", ("tiny_edge",), ("good",)), boot, points)
    assert edge["verdict"] == "unresolved" and edge["seeds_needed"] > 3
    missing = paper.Claim("t", "absent row", ("good",), ("nope",))
    assert stats.evaluate_claim(missing, boot, points) is None


def test_seeds_needed() -> None:
    assert stats.seeds_needed([1.0, 3.0]) == 2  # mean 2, sd 1.414: (1.96 * 1.414 / 2)^2 = 1.92
    assert stats.seeds_needed([0.1, -0.1, 0.2, 0.0]) == 26  # (1.96 * .129 / .05)^2 = 25.6
    assert stats.seeds_needed([1.0]) is None
    assert stats.seeds_needed([2.0, 2.0]) is None
    # '≈' within ±2: mean 1, sd 1.414, 1 point from the margin: (1.96 * 1.414 / 1)^2 = 7.7
    assert stats.seeds_needed([0.0, 2.0], margin=2.0) == 8
    assert stats.seeds_needed([2.0, 4.0], margin=2.0) == 8  # mean 3: 1 point outside
    assert stats.seeds_needed([1.0, 3.0], margin=2.0) is None  # mean on the margin


def test_rows_must_share_their_test_split() -> None:
    rng = np.random.default_rng(4)
    rows = {"a": _row(rng, 0.7, 100, 1), "b": _row(rng, 0.7, 90, 1)}
    with pytest.raises(ValueError, match="test examples"):
        stats.row_replicates(rows, ["task"], replicates=10)


def test_collapse_and_best_constant_score() -> None:
    targets = ["democratic"] * 54 + ["republican"] * 38 + ["other"] * 8
    constant = stats.encode("accuracy", targets, ["democratic"] * 100)
    assert stats.top_output_share(constant) == 1.0 and stats.collapsed(constant)
    # the best constant is the test split's own majority, whatever the training split's was
    assert stats.best_constant_score(constant) == pytest.approx(54.0)
    mostly = stats.encode("accuracy", targets, ["democratic"] * 95 + ["other"] * 5)
    assert stats.top_output_share(mostly) == pytest.approx(0.95) and stats.collapsed(mostly)
    learned = stats.encode("accuracy", targets, targets)
    assert not stats.collapsed(learned)
    # macro-F1 of a constant equals scoring.f1_macro of that constant, best class chosen
    spam = ["ham"] * 70 + ["spam"] * 30
    expected = max(scoring.f1_macro(spam, [c] * 100)["f1_macro"] for c in ("ham", "spam"))
    assert stats.best_constant_score(stats.encode("f1_macro", spam, spam)) == pytest.approx(
        expected)
