"""Uncertainty for sweep results: claim verdicts, row intervals, seeds needed, Kendall τ's
exact test, post-hoc pairs, host as a factor; a bootstrap (`row_replicates`) for scripts only.

Every verdict, interval and seed count comes from one design (`TableData`, `contrast`): an
unpaired difference of row means whose variance adds the seed variance pooled over the table's
rows and a jackknife over the shared test examples; Welch-Satterthwaite t-tests, Holm over a
table's claims. No random draws, only plain Python or `math.fsum` sums: the same bytes anywhere.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import special

from t5x_like.sweep.paper import Claim

#: Confidence of a row's interval and of the unadjusted claim intervals.
CONFIDENCE = 0.95
#: The chance of any false verdict among a table's claims, or "these rows differ" among its pairs.
FAMILY_ALPHA = 0.05
#: The power "seeds needed" plans for, and the most seeds it looks at.
POWER = 0.80
MAX_SEEDS = 100_000
#: Kendall's exact test enumerates every order of the rows when scores tie, up to this many.
MAX_ENUMERATED_ROWS = 10
#: A fine-tune whose most common test output covers at least this share of the examples is
#: counted as collapsed: a (near-)constant predictor that learned the label prior, not the input.
COLLAPSED_SHARE = 0.95


@dataclasses.dataclass(frozen=True)
class TaskPredictions:
    """One seed's predictions on one task's test split: `targets`/`outputs` [n] class ids (one
    per distinct normalised string), `metric` 'accuracy' | 'exact_match' | 'f1_macro'."""

    metric: str
    targets: np.ndarray
    outputs: np.ndarray


#: row -> one {task: predictions} per seed, all on the same test examples per task.
Rows = Mapping[str, Sequence[Mapping[str, TaskPredictions]]]


def encode(metric: str, targets: Sequence[str], outputs: Sequence[str],
           normalize=lambda s: s.strip()) -> TaskPredictions:
    """Strings -> codes (`normalize` applied to both first, e.g. SQuAD answer normalisation)."""
    if len(targets) != len(outputs) or not targets:
        raise ValueError(f"encode: {len(targets)} targets vs {len(outputs)} outputs")
    ids: dict[str, int] = {}
    return TaskPredictions(metric, *(np.array([ids.setdefault(normalize(x), len(ids)) for x in xs],
                                              np.int32) for xs in (targets, outputs)))


def scores(pred: TaskPredictions, index: np.ndarray) -> np.ndarray:
    """The metric (0-100) on each row of `index` [replicates, n] (resampled example ids);
    macro-F1 over the classes present in the targets, as `t5x_like.data.scoring.f1_macro`."""
    t, o = pred.targets[index], pred.outputs[index]
    if pred.metric in ("accuracy", "exact_match"):
        return 100.0 * (t == o).mean(axis=-1)
    if pred.metric != "f1_macro":
        raise ValueError(f"no bootstrap for metric {pred.metric!r}")
    f1, present = np.zeros((2, *index.shape[:-1]), np.float64)
    for c in range(int(pred.targets.max()) + 1):  # outputs-only ids are never a gold class
        is_t, is_o = t == c, o == c
        tp = (is_t & is_o).sum(-1)
        denominator = is_t.sum(-1) + is_o.sum(-1)  # 2tp + fp + fn
        has = is_t.any(-1)
        f1 += np.where(has, 2.0 * tp / np.maximum(denominator, 1), 0.0)
        present += has
    return 100.0 * f1 / np.maximum(present, 1)


def _full_score(pred: TaskPredictions) -> float:
    """The metric (0-100) on the whole test split."""
    return float(scores(pred, np.arange(len(pred.targets))[None])[0])


def top_output_share(pred: TaskPredictions) -> float:
    """The share of test examples given the most common output (1.0: a constant predictor)."""
    return float(np.bincount(pred.outputs).max() / len(pred.outputs))


def collapsed(pred: TaskPredictions) -> bool:
    """Whether one output covers `COLLAPSED_SHARE` of the test examples."""
    return top_output_share(pred) >= COLLAPSED_SHARE


def best_constant_score(pred: TaskPredictions) -> float:
    """The best score of one gold class predicted for every example: the floor a collapsed
    fine-tune lands on (above the majority-class baseline when the splits' label shares differ)."""
    return max(_full_score(dataclasses.replace(pred, outputs=np.full_like(pred.targets, c)))
               for c in np.unique(pred.targets))


def percentile_ci(samples: np.ndarray) -> tuple[float, float]:
    """The central `CONFIDENCE` interval of bootstrap samples (NaNs ignored)."""
    tail = 100.0 * (1.0 - CONFIDENCE) / 2.0
    lo, hi = np.nanpercentile(np.asarray(samples, np.float64), [tail, 100.0 - tail])
    return float(lo), float(hi)


def kendall_tau(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall's τ-b between each row of `x` [..., k] and `y` [k] (NaN where undefined)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    i, j = np.triu_indices(y.shape[-1], k=1)
    sx, sy = np.sign(x[..., j] - x[..., i]), np.sign(y[j] - y[i])
    nx, ny = (sx != 0).sum(-1), (sy != 0).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((nx > 0) & (ny > 0), (sx * sy).sum(-1) / np.sqrt(nx * ny), np.nan)


def _example_counts(rows: Rows, tasks: Sequence[str]) -> dict[str, int]:
    """task -> its number of test examples, checked to be the same in every seed of every row."""
    sizes: dict[str, int] = {}
    for row, seeds in rows.items():
        if not seeds:
            raise ValueError(f"row {row!r} has no finished seed")
        for per_task, task in itertools.product(seeds, tasks):
            n = len(per_task[task].targets)
            if sizes.setdefault(task, n) != n:
                raise ValueError(f"task {task}: {n} test examples in row {row!r}, "
                                 f"{sizes[task]} elsewhere")
    return sizes


def row_replicates(rows: Rows, tasks: Sequence[str],
                   replicates: int = 2000) -> dict[str, np.ndarray]:
    """row -> [replicates] bootstrap samples of its score: per row the seeds with replacement,
    per task the test examples with replacement, shared by the rows."""
    rng = np.random.default_rng(0)
    sizes = _example_counts(rows, tasks)
    examples = {t: rng.integers(0, sizes[t], size=(replicates, sizes[t])) for t in tasks}
    out = {}
    for row, seeds in rows.items():
        # [seeds, replicates] suite averages on the shared resampled examples
        suite = np.mean([[scores(per_task[t], examples[t]) for t in tasks] for per_task in seeds],
                        axis=1)
        pick = rng.integers(0, len(seeds), size=(replicates, len(seeds)))
        out[row] = np.take_along_axis(suite.T, pick, axis=1).mean(axis=1)
    return out


def point_scores(rows: Rows, tasks: Sequence[str]) -> dict[str, list[float]]:
    """row -> its per-seed suite averages on the full test splits (no resampling)."""
    return {row: [float(np.mean([_full_score(s[t]) for t in tasks])) for s in seeds]
            for row, seeds in rows.items()}


# ---- Verdicts: one t-based design for every claim, interval and seed count -----------------


def jackknife(pred: TaskPredictions) -> tuple[float, np.ndarray]:
    """The score (0-100) on the whole test split, and the jackknife deviations u [n] (each
    example's leave-one-out score minus their mean): (n-1)/n Σ_i u_a[i] u_b[i] is the jackknife
    covariance of two cells' scores."""
    t, o = pred.targets, pred.outputs
    n = len(t)
    if n < 2:
        raise ValueError("the jackknife needs at least 2 test examples")
    if pred.metric in ("accuracy", "exact_match"):
        right = int((t == o).sum())
        return 100.0 * (right / n), 100.0 * (right / n - (t == o).astype(np.float64)) / (n - 1)
    if pred.metric != "f1_macro":
        raise ValueError(f"no jackknife for metric {pred.metric!r}")
    size = int(max(t.max(), o.max())) + 1
    gold, out = np.bincount(t, minlength=size), np.bincount(o, minlength=size)
    same = t == o
    tp = np.bincount(t[same], minlength=size)
    f1 = np.where(gold > 0, 2.0 * tp / np.maximum(gold + out, 1), 0.0)
    total, present = math.fsum(f1.tolist()), int((gold > 0).sum())
    # removing example i changes the target's class (a) and, when wrong, the output's (b)
    gold_a, tp_a, out_a = gold[t] - 1, tp[t] - same, out[t] - same
    f1_a = np.where(gold_a > 0, 2.0 * tp_a / np.maximum(gold_a + out_a, 1), 0.0)
    other = ~same & (gold[o] > 0)
    f1_b = np.where(other, 2.0 * tp[o] / np.maximum(gold[o] + out[o] - 1, 1), 0.0)
    loo = 100.0 * ((((total - f1[t]) - np.where(other, f1[o], 0.0)) + f1_a) + f1_b) / (
        present - (gold_a == 0))
    return 100.0 * total / present, loo - math.fsum(loo.tolist()) / n


def pooled_variance(groups: Sequence[Sequence[float]]) -> tuple[float | None, int]:
    """The within-row variance of per-seed scores pooled over the rows with >= 2 seeds, and its
    df (seeds minus rows); (None, 0) without such a row."""
    groups = [[float(x) for x in g] for g in groups if len(g) >= 2]
    df = sum(len(g) for g in groups) - len(groups)
    if df == 0:
        return None, 0
    return sum((x - sum(g) / len(g)) ** 2 for g in groups for x in g) / df, df


@dataclasses.dataclass(frozen=True)
class TableData:
    """Per row, each seed's score (`points`, mean over `tasks`) and per task its `jackknife`
    deviations; the pooled seed variance and its df."""

    tasks: tuple[str, ...]
    sizes: dict[str, int]
    points: dict[str, list[float]]
    deviations: dict[str, list[dict[str, np.ndarray]]]
    seed_var: float | None
    seed_df: int


def table_data(rows: Rows, tasks: Sequence[str]) -> TableData:
    """The `TableData` of `rows` over `tasks`."""
    sizes = _example_counts(rows, tasks)
    points, deviations = {}, {}
    for row, seeds in rows.items():
        found = [{t: jackknife(per_task[t]) for t in tasks} for per_task in seeds]
        points[row] = [math.fsum(f[t][0] for t in tasks) / len(tasks) for f in found]
        deviations[row] = [{t: f[t][1] for t in tasks} for f in found]
    seed_var, seed_df = pooled_variance(list(points.values()))
    return TableData(tuple(tasks), sizes, points, deviations, seed_var, seed_df)


@dataclasses.dataclass(frozen=True)
class Contrast:
    """Σ_r w_r (mean of row r over its seeds): `seed_var` = pooled seed variance × Σ w_r² /
    seeds_r, `example_var` (`_example_var`), `df` (Welch-Satterthwaite), the standard error `se`
    (`seed_var`, `df` and `se` None: untestable)."""

    estimate: float
    seed_var: float | None
    example_var: float
    df: float | None = None
    se: float | None = None


def _satterthwaite(seed_var: float, seed_df: float, example_var: float, example_df: float) -> float:
    total = seed_var + example_var
    if total == 0.0:
        return float(seed_df)
    return total * total / (seed_var * seed_var / seed_df + example_var * example_var / example_df)


def _example_var(data: TableData, weights: Mapping[str, float]) -> float:
    """The test-example part of a contrast's variance, floored at 0: jackknife covariances
    between rows; within a row the mean covariance between different seeds stands for every
    pair, a cell with itself too (its own example noise is in the seed spread already)."""
    parts = []
    for t in data.tasks:
        n = data.sizes[t]
        combined, cross = np.zeros(n, np.float64), []
        for row, weight in weights.items():
            seeds = len(data.points[row])
            c = weight / seeds / len(data.tasks)
            within = sum((c * d[t] for d in data.deviations[row]), np.zeros(n, np.float64))
            combined = combined + within
            squares = math.fsum((within * within).tolist())
            own = math.fsum(c * c * math.fsum((d[t] * d[t]).tolist())
                            for d in data.deviations[row])
            cross += [-squares, (squares - own) * seeds / (seeds - 1) if seeds > 1 else 0.0]
        cross.append(math.fsum((combined * combined).tolist()))
        parts.append((n - 1) / n * math.fsum(cross))
    return max(0.0, math.fsum(parts))


def contrast(data: TableData, weights: Mapping[str, float]) -> Contrast:
    """The contrast `weights` (row -> weight) of the rows' mean scores, with its variance."""
    estimate = math.fsum(w * (sum(data.points[r]) / len(data.points[r]))
                         for r, w in weights.items())
    example_var = _example_var(data, weights)
    if data.seed_var is None:
        return Contrast(estimate, None, example_var)
    seed_var = data.seed_var * math.fsum(w * w / len(data.points[r]) for r, w in weights.items())
    df = _satterthwaite(seed_var, data.seed_df, example_var, min(data.sizes.values()) - 1)
    return Contrast(estimate, seed_var, example_var, df, math.sqrt(seed_var + example_var))


def _significant(x: float | None) -> float | None:
    """`x` to 10 significant digits: a p-value or interval from scipy's special functions
    (libm underneath) then serialises to the same JSON on every host."""
    return None if x is None else float(f"{x:.10g}")


def interval(c: Contrast, confidence: float = CONFIDENCE) -> list[float] | None:
    """The two-sided t interval of a contrast at `confidence` (`_significant`), or None."""
    if c.se is None:
        return None
    half = float(special.stdtrit(c.df, 1.0 - (1.0 - confidence) / 2.0)) * c.se
    return [_significant(c.estimate - half), _significant(c.estimate + half)]


def claim_weights(claim: Claim) -> dict[str, float]:
    """row -> weight: mean of the `better` rows minus mean of the `worse` rows."""
    return {**{r: 1.0 / len(claim.better) for r in claim.better},
            **{r: -1.0 / len(claim.worse) for r in claim.worse}}


def claim_p_value(claim: Claim, c: Contrast) -> tuple[float | None, str]:
    """The p-value (None when untestable) of the verdict the data point to, and it. '>': two-sided
    test of a zero difference. '≈' with margin m: 'reproduced' by two one-sided tests against
    ±m (TOST), 'contradicted' by a one-sided test beyond the nearer of ±m; p is twice the
    deciding one-sided p, so p < γ exactly when the (1 - γ) interval settles it (`verdict`)."""
    se = c.se
    if not se:  # untestable, or no variance at all
        return None, "unresolved"
    # p of "difference > bound" and of "difference < bound" (Student t, scipy.special: no BLAS)
    above = lambda bound: float(special.stdtr(c.df, -((c.estimate - bound) / se)))
    below = lambda bound: float(special.stdtr(c.df, -((bound - c.estimate) / se)))
    if claim.relation == ">":
        candidates = {"reproduced": 2.0 * above(0.0), "contradicted": 2.0 * below(0.0)}
    elif claim.relation == "≈":
        m = claim.margin
        candidates = {"reproduced": 2.0 * max(above(-m), below(m)),
                      "contradicted": 2.0 * min(above(m), below(-m))}
    else:
        raise ValueError(f"claim relation must be '>' or '≈', got {claim.relation!r}")
    settles = min(candidates, key=lambda v: (candidates[v], v))
    return min(1.0, candidates[settles]), settles


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error rate α under any dependence)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: (p_values[i], i))
    steps = itertools.accumulate((min(1.0, (m - rank) * p_values[i]) for rank, i in
                                  enumerate(order)), max)
    return [p for _, p in sorted(zip(order, steps, strict=True))]


def verdict(claim: Claim, lo: float, hi: float) -> str:
    """'reproduced' | 'contradicted' | 'unresolved' from an interval of the difference."""
    m = claim.margin
    if claim.relation == ">":
        reproduced, contradicted = lo > 0, hi < 0
    elif claim.relation == "≈":
        reproduced, contradicted = -m <= lo and hi <= m, lo > m or hi < -m
    else:
        raise ValueError(f"claim relation must be '>' or '≈', got {claim.relation!r}")
    return "reproduced" if reproduced else "contradicted" if contradicted else "unresolved"


def power(gap: float, seed_var: float, weight_squares: float, example_var: float, rows: int,
          seeds: int, alpha: float, example_df: float = math.inf) -> float:
    """The chance (noncentral t, far tail ignored) that a two-sided t-test at `alpha` settles a
    contrast `gap` past its boundary with `seeds` seeds in each of `rows` rows; `seed_var`: one
    seed's variance, `weight_squares`: Σ w_r²."""
    seed_part = seed_var * weight_squares / seeds
    df = _satterthwaite(seed_part, rows * (seeds - 1), example_var, example_df)
    se = math.sqrt(seed_part + example_var)
    critical = float(special.stdtrit(df, 1.0 - alpha / 2.0))
    return 1.0 - float(special.nctdtr(df, gap / se, critical))


def seeds_for_power(gap: float, seed_var: float, weight_squares: float, example_var: float,
                    rows: int, alpha: float, example_df: float = math.inf) -> int | None:
    """The fewest seeds per row (>= 2) for `power` >= `POWER`; None when the gap is 0 or no
    number up to `MAX_SEEDS` does (the power tends to Φ(gap / sqrt(example_var) - z))."""
    z = float(special.ndtri(1.0 - alpha / 2.0))
    ceiling = float(special.ndtr(gap / math.sqrt(example_var) - z)) if example_var > 0.0 else 1.0
    if gap <= 0.0 or seed_var <= 0.0 or ceiling < POWER:
        return None
    reached = lambda n: power(gap, seed_var, weight_squares, example_var, rows, n, alpha,
                              example_df) >= POWER
    hi = 2  # one seed has no spread: double up to a count that reaches it, then bisect
    while not reached(hi):
        hi *= 2
        if hi > MAX_SEEDS:
            return None
    return hi // 2 + 1 + bisect.bisect_left(range(hi // 2 + 1, hi), True, key=reached)


def seeds_needed(differences: Sequence[float], margin: float = 0.0) -> int | None:
    """Seeds for `POWER` to settle a claim at two-sided α = 0.05 by a one-sample t-test on
    per-seed paired differences, their mean and std taken as true ('≈': the gap is |mean| to
    `margin`). None without spread or with the mean on the boundary."""
    d = [float(x) for x in differences]
    if len(d) < 2 or not all(math.isfinite(x) for x in d):
        return None
    mean = math.fsum(d) / len(d)
    var = math.fsum((x - mean) ** 2 for x in d) / (len(d) - 1)
    return seeds_for_power(abs(abs(mean) - margin), var, 1.0, 0.0, 1, 1.0 - CONFIDENCE)


def _plan(claim: Claim, c: Contrast, data: TableData, alpha: float) -> dict[str, Any]:
    """Seeds per row for 80% power at `alpha` (the observed difference taken as true), at the
    pooled seed variance and at both ends of its 95% chi-square interval."""
    gap = abs(c.estimate) if claim.relation == ">" else abs(abs(c.estimate) - claim.margin)
    squares = math.fsum(w * w for w in claim_weights(claim).values())
    rows, example_df = len(data.points), min(data.sizes.values()) - 1
    tail = (1.0 - CONFIDENCE) / 2.0
    low, high = (data.seed_var * data.seed_df / float(special.chdtri(data.seed_df, q))
                 for q in (tail, 1.0 - tail))
    needed = [seeds_for_power(gap, v, squares, c.example_var, rows, alpha, example_df=example_df)
              for v in (low, data.seed_var, high)]
    return {"seeds_needed": needed[1], "seeds_needed_range": [needed[0], needed[2]],
            "seeds_limit": "test examples" if needed[1] is None and gap > 0 else None}


def evaluate_claims(claims: Sequence[Claim], data: TableData,
                    plan: bool = True) -> list[dict[str, Any]]:
    """The claims of one table whose rows all have results: each a `contrast` with a t-test
    (`claim_p_value`), Holm over the testable ones at `FAMILY_ALPHA`. Per claim also `ci` at Holm's
    level (confidence 1 - α·p/p_holm: it clears the boundary exactly when the verdict is
    settled), `ci95`, and if unresolved the seeds for 80% power at α/m (`_plan`, if `plan`)."""
    contrasts = [(claim, contrast(data, claim_weights(claim))) for claim in claims
                 if all(r in data.points for r in (*claim.better, *claim.worse))]
    tested = [(claim, c, *claim_p_value(claim, c)) for claim, c in contrasts]
    family = [p for _, _, p, _ in tested if p is not None]
    adjusted, results = iter(holm(family)), []
    for claim, c, p, settles in tested:
        p_holm = None if p is None else next(adjusted)
        result = {"table": claim.table, "claim": claim.text, "relation": claim.relation,
                  "margin": claim.margin, "difference": c.estimate, "se": _significant(c.se),
                  "df": _significant(c.df), "p": _significant(p), "p_holm": _significant(p_holm),
                  "verdict": "unresolved", "ci": None, "ci_confidence": None, "ci95": None,
                  "seeds": min(len(data.points[r]) for r in (*claim.better, *claim.worse)),
                  "seeds_needed": None, "seeds_needed_range": None, "seeds_limit": None}
        results.append(result)
        if p is None:
            continue
        level = FAMILY_ALPHA * p / p_holm if p_holm > 0.0 else FAMILY_ALPHA / len(family)
        result.update(ci=interval(c, 1.0 - level), ci_confidence=_significant(1.0 - level),
                      ci95=interval(c, CONFIDENCE))
        if p_holm < FAMILY_ALPHA:
            result["verdict"] = settles
        elif plan:
            result.update(_plan(claim, c, data, FAMILY_ALPHA / len(family)))
    return results


# ---- Kendall τ: the test, exact ---------------------------------------------------------------


def kendall_permutation_p(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Two-sided exact permutation p-value of Kendall's τ-b: the share of the k! orders of `y`
    whose |S| (S = Σ_{i<j} sign(x_j - x_i) sign(y_j - y_i)) reaches the observed one. Without
    ties S = k(k-1)/2 - 2 × inversions, counted exactly (Mahonian numbers); with ties every order
    is enumerated (k <= `MAX_ENUMERATED_ROWS`, else None). None below 2 rows or if constant."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    k = len(x)
    if k != len(y):
        raise ValueError(f"kendall: {k} vs {len(y)} scores")
    if k < 2 or len(set(x)) == 1 or len(set(y)) == 1:
        return None
    i, j = np.triu_indices(k, k=1)
    sign_x = np.sign(x[j] - x[i]).astype(np.int64)
    observed = abs(int((sign_x * np.sign(y[j] - y[i]).astype(np.int64)).sum()))
    if len(set(x)) == k and len(set(y)) == k:
        counts = [1]  # permutations of `size` items with 0, 1, ... inversions
        for size in range(2, k + 1):
            counts = [sum(counts[max(0, n - size + 1):n + 1])
                      for n in range(len(counts) + size - 1)]
        hits = sum(c for inv, c in enumerate(counts) if abs(len(i) - 2 * inv) >= observed)
        return hits / math.factorial(k)
    if k > MAX_ENUMERATED_ROWS:
        return None
    order = np.fromiter(itertools.chain.from_iterable(itertools.permutations(range(k))),
                        np.int8, count=math.factorial(k) * k).reshape(-1, k)
    ranks_y = np.unique(y, return_inverse=True)[1].astype(np.int16)[order]  # [k!, k]
    s = np.zeros(len(order), np.int64)
    for a, b, sign in zip(i, j, sign_x.tolist(), strict=True):
        s += sign * np.sign(ranks_y[:, b] - ranks_y[:, a])
    return int((np.abs(s) >= observed).sum()) / math.factorial(k)


# ---- Post-hoc pairs and host as a factor (plain Python: the same bits on every CPU) --------


def pairwise(groups: Mapping[str, Sequence[float]]) -> dict[str, Any] | None:
    """Every pair of rows (in `groups` order) by a t-test with the pooled seed variance, Holm
    over the pairs (`differ` at `FAMILY_ALPHA`). None without a pooled variance or with < 2 rows."""
    rows = {r: [float(x) for x in g] for r, g in groups.items() if g}
    var, df = pooled_variance(list(rows.values()))
    if var is None or len(rows) < 2 or var == 0.0:
        return None
    means = {r: sum(g) / len(g) for r, g in rows.items()}
    pairs = []
    for first, second in itertools.combinations(rows, 2):
        diff = means[first] - means[second]
        se = math.sqrt(var * (1.0 / len(rows[first]) + 1.0 / len(rows[second])))
        hi, lo = (first, second) if diff >= 0 else (second, first)
        pairs.append({"better": hi, "worse": lo, "difference": abs(diff),
                      "p": min(1.0, 2.0 * float(special.stdtr(df, -(abs(diff) / se))))})
    for pair, adjusted in zip(pairs, holm([p["p"] for p in pairs]), strict=True):
        pair.update(p=_significant(pair["p"]), p_holm=_significant(adjusted),
                    differ=adjusted < FAMILY_ALPHA)
    return {"method": "Holm over pairwise t-tests, pooled seed variance", "seed_df": df,
            "alpha": FAMILY_ALPHA, "pairs": pairs}


def _solve(matrix: list[list[float]], vector: list[float]) -> tuple[list[float], int]:
    """(β, rank) solving the normal equations `matrix` β = `vector` by Gauss-Jordan with
    pivoting in plain Python; columns without a usable pivot are dropped (β 0)."""
    size = len(vector)
    a = [list(row) + [v] for row, v in zip(matrix, vector, strict=True)]
    scale = max([abs(a[i][i]) for i in range(size)] + [0.0])
    where = {}  # column -> its pivot row
    for col in range(size):
        pivot = max((r for r in range(size) if r not in where.values()),
                    key=lambda r: abs(a[r][col]), default=None)
        if pivot is None or abs(a[pivot][col]) <= 1e-12 * scale:
            continue
        where[col] = pivot
        for r in range(size):
            if r != pivot and a[r][col] != 0.0:
                factor = a[r][col] / a[pivot][col]
                a[r] = [v - factor * p for v, p in zip(a[r], a[pivot], strict=True)]
    beta = [a[where[c]][size] / a[where[c]][c] if c in where else 0.0 for c in range(size)]
    return beta, len(where)


def host_factor(cells: Sequence[tuple[str, str, float]]) -> dict[str, Any] | None:
    """Host as a factor beside the rows, from (row, host, score) per seed: score = row + host
    against rows alone, an F-test on the within-row demeaned host indicators (Frisch-Waugh);
    untested (`testable` false) when no row spans two hosts. None with one host."""
    hosts = sorted({h for _, h, _ in cells})
    if len(hosts) < 2:
        return None
    by_row: dict[str, list[tuple[str, float]]] = {}
    for row, host, score in cells:
        by_row.setdefault(row, []).append((host, float(score)))
    demeaned_y, demeaned_x = [], []
    for members in by_row.values():
        mean = sum(s for _, s in members) / len(members)
        shares = [sum(h == name for h, _ in members) / len(members) for name in hosts[1:]]
        for host, score in members:
            demeaned_y.append(score - mean)
            demeaned_x.append([(host == name) - share for name, share in
                               zip(hosts[1:], shares, strict=True)])
    columns = range(len(hosts) - 1)
    gram = [[sum(x[i] * x[j] for x in demeaned_x) for j in columns] for i in columns]
    moment = [sum(x[i] * y for x, y in zip(demeaned_x, demeaned_y, strict=True)) for i in columns]
    beta, rank = _solve(gram, moment)
    within = sum(y * y for y in demeaned_y)
    df_resid = len(cells) - len(by_row) - rank
    result = {"hosts": hosts, "rows_spanning_hosts": sum(
        len({h for h, _ in m}) > 1 for m in by_row.values()), "testable": rank > 0,
        "f": None, "p": None, "df": [rank, df_resid],
        "effects": {name: _significant(b) for name, b in zip(hosts[1:], beta, strict=True)}}
    explained = sum(b * m for b, m in zip(beta, moment, strict=True))
    if rank > 0 and df_resid > 0 and within - explained > 0.0:
        f = (explained / rank) / ((within - explained) / df_resid)
        result.update(f=_significant(f), p=_significant(float(special.fdtrc(rank, df_resid, f))))
    return result
