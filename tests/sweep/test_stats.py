"""Scores, the jackknife, claim verdicts with Holm, seeds for power, Kendall's exact test,
post-hoc pairs and host as a factor, against brute force, scipy and textbook values; and the
verdicts' family-wise error rate and power on simulated tables."""

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


def test_rows_must_share_their_test_split() -> None:
    rng = np.random.default_rng(4)
    rows = {"a": _row(rng, 0.7, 100, 1), "b": _row(rng, 0.7, 90, 1)}
    with pytest.raises(ValueError, match="test examples"):
        stats.row_replicates(rows, ["task"], replicates=10)
    with pytest.raises(ValueError, match="test examples"):
        stats.table_data(rows, ["task"])


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


@pytest.mark.parametrize("metric", ["accuracy", "f1_macro"])
def test_jackknife_deviations_are_the_leave_one_out_scores(metric: str) -> None:
    rng = np.random.default_rng(5)
    targets = _labels(rng, 80, ["a", "b", "c"], p=[0.5, 0.3, 0.2])
    targets[7] = "rare"  # a class whose only example is left out once
    outputs = _labels(rng, 80, ["a", "b", "c", "stray"], p=[0.4, 0.3, 0.2, 0.1])
    pred = stats.encode(metric, targets, outputs)
    everything = np.arange(80)
    loo = np.array([stats.scores(pred, np.delete(everything, i)[None])[0] for i in range(80)])
    score, deviations = stats.jackknife(pred)
    assert score == pytest.approx(stats.scores(pred, everything[None])[0], abs=1e-9)
    np.testing.assert_allclose(deviations, loo - loo.mean(), atol=1e-9)


def _fixed_row(right: np.ndarray, targets: list[str], seeds: int) -> list[dict]:
    """`seeds` identical runs right exactly where `right` is."""
    flip = {"a": "b", "b": "a"}
    outputs = [t if r else flip[t] for t, r in zip(targets, right, strict=True)]
    return [{"task": stats.encode("accuracy", targets, outputs)} for _ in range(seeds)]


def test_without_seed_spread_a_claim_is_the_paired_t_test_over_examples() -> None:
    """Identical seeds: the seed part is 0 and the test-example part of A - B is the variance
    of the per-example differences over n (the jackknife of a mean), so the claim's p-value is
    scipy's paired t-test on the 0/1 vectors."""
    from scipy.stats import ttest_rel

    rng = np.random.default_rng(6)
    targets = _labels(rng, 400, ["a", "b"])
    right_a, right_b = rng.random(400) < 0.75, rng.random(400) < 0.68
    data = stats.table_data({"A": _fixed_row(right_a, targets, 2),
                             "B": _fixed_row(right_b, targets, 2)}, ["task"])
    c = stats.contrast(data, {"A": 1.0, "B": -1.0})
    assert data.seed_var == 0.0 and c.seed_var == 0.0
    d = 100.0 * (right_a.astype(float) - right_b.astype(float))
    assert c.example_var == pytest.approx(d.var(ddof=1) / 400, rel=1e-9)
    assert c.estimate == pytest.approx(d.mean()) and c.df == pytest.approx(399)
    p, settles = stats.claim_p_value(paper.Claim("t", "A beats B", ("A",), ("B",)), c)
    assert settles == "reproduced"
    assert p == pytest.approx(ttest_rel(right_a * 1.0, right_b * 1.0).pvalue, rel=1e-6)


def test_holm_textbook_example() -> None:
    """Four tests at α = 0.05: sorted p 0.005, 0.01, 0.03, 0.04 against 0.05/4, 0.05/3, 0.05/2:
    the first two are rejected, then 0.03 > 0.025 stops the procedure."""
    adjusted = stats.holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [a < 0.05 for a in adjusted] == [True, False, False, True]
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0]) and stats.holm([]) == []


def test_seeds_for_power_textbook_values() -> None:
    """Two-sample t-test, two-sided α = 0.05, 80% power (Cohen 1988; G*Power): d = 0.5 -> 64
    per group, 0.8 -> 26, 1.0 -> 17; one-sample/paired d = 0.5 -> 34, 0.8 -> 15."""
    two = lambda d: stats.seeds_for_power(d, 1.0, 2.0, 0.0, rows=2, alpha=0.05)
    one = lambda d: stats.seeds_for_power(d, 1.0, 1.0, 0.0, rows=1, alpha=0.05)
    assert (two(0.5), two(0.8), two(1.0)) == (64, 26, 17)
    assert (one(0.5), one(0.8)) == (34, 15)
    assert stats.power(1.0, 1.0, 2.0, 0.0, rows=2, seeds=17, alpha=0.05) == pytest.approx(
        0.807, abs=0.002)
    # the test examples alone leave the gap out of reach, however many seeds
    assert stats.seeds_for_power(0.3, 1.0, 2.0, 0.04, rows=2, alpha=0.05) is None
    assert stats.seeds_for_power(0.0, 1.0, 2.0, 0.0, rows=2, alpha=0.05) is None


def test_seeds_needed_from_paired_differences() -> None:
    assert stats.seeds_needed([1.0, 3.0]) == 7  # d = 2 / 1.414: one-sample t, 80% power
    assert stats.seeds_needed([0.1, -0.1, 0.2, 0.0]) == 55  # d = 0.05 / 0.129 = 0.39
    assert stats.seeds_needed([1.0]) is None
    assert stats.seeds_needed([2.0, 2.0]) is None
    # '≈' within ±2: mean 1 or 3, one point from the margin, sd 1.414: d = 0.71
    assert stats.seeds_needed([0.0, 2.0], margin=2.0) == stats.seeds_needed([2.0, 4.0], 2.0) == 18
    assert stats.seeds_needed([1.0, 3.0], margin=2.0) is None  # mean on the margin


def _brute_force_permutation_p(x: list[float], y: list[float]) -> float:
    import itertools

    def s(yy):
        return sum(np.sign(x[j] - x[i]) * np.sign(yy[j] - yy[i])
                   for i in range(len(x)) for j in range(i + 1, len(x)))

    observed = abs(s(y))
    orders = list(itertools.permutations(y))
    return sum(abs(s(o)) >= observed for o in orders) / len(orders)


def test_kendall_permutation_p_is_exact() -> None:
    from scipy.stats import kendalltau

    assert stats.kendall_permutation_p([1, 2, 3], [1, 2, 3]) == pytest.approx(2 / 6)
    assert stats.kendall_permutation_p([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(2 / 24)
    rng = np.random.default_rng(7)
    for k in (2, 4, 6, 9, 10):  # no ties: scipy's exact null distribution is the same one
        x, y = rng.permutation(k).astype(float), rng.permutation(k).astype(float)
        want = kendalltau(x, y, method="exact").pvalue
        assert stats.kendall_permutation_p(list(x), list(y)) == pytest.approx(want, rel=1e-12)
    for _ in range(5):  # ties in either list: every order enumerated
        x = [float(v) for v in rng.integers(0, 3, 6)]
        y = [float(v) for v in rng.integers(0, 4, 6)]
        if len(set(x)) > 1 and len(set(y)) > 1:
            assert stats.kendall_permutation_p(x, y) == pytest.approx(
                _brute_force_permutation_p(x, y))
    assert stats.kendall_permutation_p([1.0], [2.0]) is None
    assert stats.kendall_permutation_p([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None


def test_pairwise_holm_says_which_rows_differ() -> None:
    from scipy.stats import t as t_distribution

    found = stats.pairwise({"a": [1.0, 2.0, 3.0], "b": [1.5, 2.5, 3.5], "c": [9.0, 10.0, 11.0]})
    assert found["seed_df"] == 6  # 9 seeds - 3 rows; every row's variance is 1
    pairs = {(p["better"], p["worse"]): p for p in found["pairs"]}
    assert set(pairs) == {("b", "a"), ("c", "a"), ("c", "b")}
    p_ba = 2 * t_distribution.sf(0.5 / np.sqrt(2 / 3), 6)
    assert pairs["b", "a"]["p"] == pytest.approx(p_ba)
    assert pairs["b", "a"]["p_holm"] == pytest.approx(min(1.0, max(p_ba, 3 * pairs["c", "a"]["p"],
                                                                   2 * pairs["c", "b"]["p"])))
    assert [p["differ"] for p in (pairs["b", "a"], pairs["c", "a"], pairs["c", "b"])] == [
        False, True, True]
    assert stats.pairwise({"a": [1.0], "b": [2.0]}) is None  # no seed spread to test with


def test_host_factor_within_rows_against_least_squares() -> None:
    noise = [0.1, -0.2, 0.05, 0.15, -0.1, 0.0, 0.2, -0.05, -0.15]
    hosts = ["A", "A", "B", "A", "B", "B", "B", "B", "B"]  # rows r1, r2 span hosts; r3 one host
    rows = ["r1"] * 3 + ["r2"] * 3 + ["r3"] * 3
    base = {"r1": 40.0, "r2": 44.0, "r3": 47.0}
    scores = [base[r] + (1.5 if h == "B" else 0.0) + e
              for r, h, e in zip(rows, hosts, noise, strict=True)]
    found = stats.host_factor(list(zip(rows, hosts, scores, strict=True)))
    # the same additive model by least squares: row dummies (+ a host-B dummy)
    y = np.array(scores)
    dummies = np.array([[r == name for name in base] for r in rows], float)
    full = np.column_stack([dummies, [h == "B" for h in hosts]])
    fit = np.linalg.lstsq(full, y, rcond=None)[0]
    rss = lambda x: float(np.sum((y - x @ np.linalg.lstsq(x, y, rcond=None)[0]) ** 2))
    f = (rss(dummies) - rss(full)) / (rss(full) / (9 - 4))
    assert found["testable"] and found["rows_spanning_hosts"] == 2 and found["df"] == [1, 5]
    assert found["effects"]["B"] == pytest.approx(fit[3]) and found["f"] == pytest.approx(f)
    assert 0.0 < found["p"] < 0.05
    confounded = stats.host_factor([("r1", "A", 1.0), ("r1", "A", 2.0), ("r2", "B", 3.0),
                                    ("r2", "B", 5.0)])
    assert not confounded["testable"] and confounded["f"] is None
    assert stats.host_factor([("r1", "A", 1.0), ("r2", "A", 2.0)]) is None


# ---- Verdicts on simulated tables -------------------------------------------------------------

#: Like the `tiny` score: three accuracy tasks of 500 test examples (15, 10 and 4 classes, at
#: about 25%, 15% and 50% right) and a two-class macro-F1 task of 319 near its ceiling.
SIMULATED_TASKS = (("brown", "accuracy", 500, 15, -1.3), ("decade", "accuracy", 500, 10, -2.0),
                   ("party", "accuracy", 500, 4, 0.0), ("spam", "f1_macro", 319, 2, 3.0))


def _simulated_table(rng: np.random.Generator, rows: list[str], shift: dict | None = None,
                     seeds: int = 3) -> stats.TableData:
    """Every row fine-tuned `seeds` times on shared test examples: an example is right with
    probability sigmoid(task level + example difficulty + row x example interaction + seed
    effect + the row's `shift`). Without a shift the rows are equal on the population of
    examples; on one test set they still differ by their interactions."""
    shifts = np.array([(shift or {}).get(r, 0.0) for r in rows])[:, None, None]
    preds = {r: [{} for _ in range(seeds)] for r in rows}
    for name, metric, n, classes, level in SIMULATED_TASKS:
        targets = rng.integers(0, classes, n)
        logit = (level + rng.normal(0.0, 1.5, n) + rng.normal(0.0, 0.3, (len(rows), 1, n))
                 + rng.normal(0.0, 0.12, (len(rows), seeds, 1)) + shifts)
        right = rng.random((len(rows), seeds, n)) < 1.0 / (1.0 + np.exp(-logit))
        wrong = (targets + rng.integers(1, classes, (len(rows), seeds, n))) % classes
        outputs = np.where(right, targets, wrong).astype(np.int32)
        for i, r in enumerate(rows):
            for s in range(seeds):
                preds[r][s][name] = stats.TaskPredictions(metric, targets, outputs[i, s])
    return stats.table_data(preds, [t[0] for t in SIMULATED_TASKS])


def _table_claims(table: str) -> tuple[list[paper.Claim], list[str]]:
    claims = [c for c in paper.CLAIMS if c.table == table]
    return claims, list(dict.fromkeys(r for c in claims for r in (*c.better, *c.worse)))


def _consistent(claim: paper.Claim, result: dict) -> bool:
    """The interval at Holm's level gives the verdict Holm gave."""
    return result["ci"] is None or stats.verdict(claim, *result["ci"]) == result["verdict"]


def test_null_tables_give_a_false_verdict_in_at_most_5_percent_of_tables() -> None:
    """Table 2's nine claims on ten rows of equal true quality: a verdict other than
    'unresolved' on a '>' claim, or 'contradicted' on the '≈' claim, is false. The share of
    tables with any false verdict stays at 5% up to two simulation standard errors."""
    claims, rows = _table_claims("table2")
    rng = np.random.default_rng(41)
    tables, false_tables, false_claims, seed_stds = 700, 0, 0, []
    for _ in range(tables):
        data = _simulated_table(rng, rows)
        seed_stds.append(np.sqrt(data.seed_var))
        results = stats.evaluate_claims(claims, data, plan=False)
        assert len(results) == 9
        assert all(_consistent(c, r) for c, r in zip(claims, results, strict=True))
        false = [r for r in results if r["verdict"] == "contradicted"
                 or (r["verdict"] == "reproduced" and r["relation"] == ">")]
        false_tables += bool(false)
        false_claims += len(false)
    assert 0.8 < np.mean(seed_stds) < 1.6  # noise like the tiny run's (pooled 1.2-1.5)
    se = np.sqrt(0.05 * 0.95 / tables)
    assert false_tables / tables <= 0.05 + 2 * se, false_tables
    assert false_claims / (tables * len(claims)) <= 0.05 / 2


def test_a_large_true_difference_is_detected_in_most_tables() -> None:
    """Table 3 with BERT-style 0.5 logits above prefix LM and deshuffling 0.5 below (about 7
    suite points apart per step): each claim is reproduced in most tables, never contradicted."""
    claims, rows = _table_claims("table3")
    rng = np.random.default_rng(42)
    shift = {"BERT-style": 0.5, "Prefix LM": 0.0, "Deshuffling": -0.5}
    verdicts = {c.text: [] for c in claims}
    for _ in range(60):
        results = stats.evaluate_claims(claims, _simulated_table(rng, rows, shift), plan=False)
        assert all(_consistent(c, r) for c, r in zip(claims, results, strict=True))
        for r in results:
            verdicts[r["claim"]].append(r["verdict"])
    for text, found in verdicts.items():
        assert "contradicted" not in found, text
        assert found.count("reproduced") >= 0.8 * len(found), (text, found.count("reproduced"))


def test_unresolved_claims_plan_seeds_with_a_range() -> None:
    claims, rows = _table_claims("table3")
    rng = np.random.default_rng(43)
    results = stats.evaluate_claims(claims, _simulated_table(rng, rows, {"BERT-style": 0.06}))
    planned = [r for r in results if r["verdict"] == "unresolved" and r["seeds_needed"]]
    assert planned
    for r in planned:
        lo, hi = r["seeds_needed_range"]  # hi None: beyond the search's 100,000
        assert 2 <= lo <= r["seeds_needed"] <= (hi or 10**6) and r["seeds_limit"] is None
        assert r["p_holm"] >= 0.05 and r["ci95"][0] <= r["difference"] <= r["ci95"][1]
