"""Uncertainty for sweep results: a bootstrap over seeds and test examples, Kendall τ with a CI,
paired differences for the paper's claims, and the seeds a difference would need.

A row's score is the mean over its seeds of the suite average (the mean over tasks of each
task's primary score on its test split). One bootstrap replicate draws, independently per row,
the row's seeds with replacement and, shared by every row, each task's test examples with
replacement (all rows are scored on the same examples, so that part of the noise is paired),
then recomputes every row's score from the saved predictions. Percentile intervals over the
replicates are the CIs; a claim's difference and Kendall's τ are computed inside each replicate,
so their CIs carry the same noise.

Scores are recomputed from per-example codes (`TaskPredictions`): accuracy and exact match are
means of a 0/1 vector, macro-F1 is over the classes present in the resampled targets, as
`t5x_like.data.scoring.f1_macro` is over the classes present in its targets. Pure numpy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from t5x_like.sweep.paper import Claim

#: Percentile interval of every CI.
CONFIDENCE = 0.95
DEFAULT_REPLICATES = 2000


@dataclasses.dataclass(frozen=True)
class TaskPredictions:
    """One seed's predictions on one task's test split, as codes: `targets`/`outputs` [n] ints
    (a class id per distinct string; an output outside the targets' classes gets its own id),
    `metric` in {'accuracy', 'exact_match', 'f1_macro'} ('exact_match': `outputs` already equal
    `targets` where the normalised answer matched)."""

    metric: str
    targets: np.ndarray
    outputs: np.ndarray


def encode(metric: str, targets: Sequence[str], outputs: Sequence[str],
           normalize=lambda s: s.strip()) -> TaskPredictions:
    """Strings -> codes (`normalize` applied to both first, e.g. SQuAD answer normalisation)."""
    if len(targets) != len(outputs) or not targets:
        raise ValueError(f"encode: {len(targets)} targets vs {len(outputs)} outputs")
    ids: dict[str, int] = {}
    t = np.array([ids.setdefault(normalize(x), len(ids)) for x in targets], np.int32)
    o = np.array([ids.setdefault(normalize(x), len(ids)) for x in outputs], np.int32)
    return TaskPredictions(metric, t, o)


def scores(pred: TaskPredictions, index: np.ndarray) -> np.ndarray:
    """The metric (0-100) on each row of `index` [replicates, n] (resampled example ids)."""
    t, o = pred.targets[index], pred.outputs[index]
    if pred.metric in ("accuracy", "exact_match"):
        return 100.0 * (t == o).mean(axis=-1)
    if pred.metric != "f1_macro":
        raise ValueError(f"no bootstrap for metric {pred.metric!r}")
    f1 = np.zeros(index.shape[:-1], np.float64)
    present = np.zeros(index.shape[:-1], np.float64)
    for c in range(int(pred.targets.max()) + 1):  # outputs-only ids are never a gold class
        is_t, is_o = t == c, o == c
        tp = (is_t & is_o).sum(-1)
        denominator = is_t.sum(-1) + is_o.sum(-1)  # 2tp + fp + fn
        has = is_t.any(-1)
        f1 += np.where(has, 2.0 * tp / np.maximum(denominator, 1), 0.0)
        present += has
    return 100.0 * f1 / np.maximum(present, 1)


#: A fine-tune whose most common test output covers at least this share of the examples is
#: counted as collapsed: a (near-)constant predictor that learned the label prior, not the input.
COLLAPSED_SHARE = 0.95


def top_output_share(pred: TaskPredictions) -> float:
    """The share of test examples given the most common output (1.0: a constant predictor)."""
    return float(np.bincount(pred.outputs).max() / len(pred.outputs))


def collapsed(pred: TaskPredictions) -> bool:
    """Whether one output covers `COLLAPSED_SHARE` of the test examples."""
    return top_output_share(pred) >= COLLAPSED_SHARE


def best_constant_score(pred: TaskPredictions) -> float:
    """The best score a constant predictor gets on these test targets (any one gold class for
    every example): the floor a collapsed fine-tune lands on, often above the majority-class
    baseline when the test split's label shares differ from the training split's."""
    everything = np.arange(len(pred.targets))[None]
    return max(float(scores(TaskPredictions(pred.metric, pred.targets,
                                            np.full_like(pred.targets, c)), everything)[0])
               for c in np.unique(pred.targets))


def percentile_ci(samples: np.ndarray) -> tuple[float, float]:
    """The central `CONFIDENCE` interval of bootstrap samples (NaNs ignored)."""
    tail = 100.0 * (1.0 - CONFIDENCE) / 2.0
    lo, hi = np.nanpercentile(np.asarray(samples, np.float64), [tail, 100.0 - tail])
    return float(lo), float(hi)


def kendall_tau(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall's τ-b between each row of `x` [..., k] and `y` [k] (NaN where undefined)."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    i, j = np.triu_indices(y.shape[-1], k=1)
    sx, sy = np.sign(x[..., j] - x[..., i]), np.sign(y[j] - y[i])
    concordance = (sx * sy).sum(-1)
    nx, ny = (sx != 0).sum(-1), (sy != 0).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((nx > 0) & (ny > 0), concordance / np.sqrt(nx * ny), np.nan)


def row_replicates(rows: Mapping[str, Sequence[Mapping[str, TaskPredictions]]],
                   tasks: Sequence[str], replicates: int = DEFAULT_REPLICATES,
                   seed: int = 0) -> dict[str, np.ndarray]:
    """row -> [replicates] bootstrap samples of its score (mean over seeds of the suite
    average over `tasks`). `rows[row]` = one {task: predictions} per seed; every seed of every
    row must hold the same test examples per task (same count)."""
    rng = np.random.default_rng(seed)
    sizes = {}
    for row, seeds in rows.items():
        if not seeds:
            raise ValueError(f"row {row!r} has no finished seed")
        for per_task in seeds:
            for task in tasks:
                n = len(per_task[task].targets)
                if sizes.setdefault(task, n) != n:
                    raise ValueError(f"task {task}: {n} test examples in row {row!r}, "
                                     f"{sizes[task]} elsewhere")
    examples = {t: rng.integers(0, sizes[t], size=(replicates, sizes[t])) for t in tasks}
    out = {}
    for row, seeds in rows.items():
        # [seeds, replicates] suite averages on the shared resampled examples
        suite = np.mean([[scores(per_task[t], examples[t]) for t in tasks] for per_task in seeds],
                        axis=1)
        pick = rng.integers(0, len(seeds), size=(replicates, len(seeds)))
        out[row] = np.take_along_axis(suite.T, pick, axis=1).mean(axis=1)
    return out


def point_scores(rows: Mapping[str, Sequence[Mapping[str, TaskPredictions]]],
                 tasks: Sequence[str]) -> dict[str, list[float]]:
    """row -> its per-seed suite averages on the full test splits (no resampling)."""
    return {row: [float(np.mean([scores(s[t], np.arange(len(s[t].targets))[None])[0]
                                 for t in tasks])) for s in seeds] for row, seeds in rows.items()}


def seeds_needed(differences: Sequence[float], margin: float = 0.0) -> int | None:
    """Seeds per row for a 95% CI of a paired difference to settle a claim, from per-seed
    differences (normal approximation). A '>' claim (`margin` 0) is settled when the CI
    excludes 0; an '≈' claim when the CI lies inside ±margin or outside it, i.e. when the CI's
    half-width is below the distance from |mean| to the margin: n = (1.96 σ / ||mean| -
    margin|)². None without spread or with the mean on the boundary."""
    d = np.asarray(differences, np.float64)
    if len(d) < 2 or not np.isfinite(d).all():
        return None
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    gap = abs(abs(mean) - margin)
    if gap == 0.0 or sd == 0.0:
        return None
    return max(1, math.ceil((1.96 * sd / gap) ** 2))


def verdict(claim: Claim, lo: float, hi: float) -> str:
    """'reproduced' | 'contradicted' | 'unresolved' from the difference's CI."""
    if claim.relation == ">":
        if lo > 0:
            return "reproduced"
        return "contradicted" if hi < 0 else "unresolved"
    if claim.relation == "≈":
        if -claim.margin <= lo and hi <= claim.margin:
            return "reproduced"
        return "contradicted" if lo > claim.margin or hi < -claim.margin else "unresolved"
    raise ValueError(f"claim relation must be '>' or '≈', got {claim.relation!r}")


def evaluate_claim(claim: Claim, replicates: Mapping[str, np.ndarray],
                   points: Mapping[str, Sequence[float]]) -> dict | None:
    """The claim's difference (full-data point estimate), its CI, verdict and, for an
    unresolved claim, the seeds per row a settling CI would need (`seeds_needed`; a settled
    one needs none); None when a row has no results."""
    if any(r not in replicates for r in (*claim.better, *claim.worse)):
        return None
    boot = (np.mean([replicates[r] for r in claim.better], axis=0)
            - np.mean([replicates[r] for r in claim.worse], axis=0))
    seeds = min(len(points[r]) for r in (*claim.better, *claim.worse))
    per_seed = [np.mean([points[r][s] for r in claim.better])
                - np.mean([points[r][s] for r in claim.worse]) for s in range(seeds)]
    point = float(np.mean([np.mean(points[r]) for r in claim.better])
                  - np.mean([np.mean(points[r]) for r in claim.worse]))
    lo, hi = percentile_ci(boot)
    result = {"table": claim.table, "claim": claim.text, "relation": claim.relation,
              "margin": claim.margin, "difference": point, "ci": [lo, hi],
              "verdict": verdict(claim, lo, hi), "seeds": seeds, "seeds_needed": None}
    if result["verdict"] == "unresolved":
        result["seeds_needed"] = seeds_needed(
            per_seed, claim.margin if claim.relation == "≈" else 0.0)
    return result
