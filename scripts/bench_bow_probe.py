"""How far a bag of words goes on the downstream suite: an order-blind linear probe beside the
sweep's fine-tuned models.

The T5-table sweep at `tiny` ranks deshuffling, the paper's worst objective, first. One reading
is that the suite's classification tasks (spam, Brown genre, SOTU party and decade) are topic
tasks that word counts solve, so an objective whose encoder sees a bag of words loses nothing.
This measures it: per task, a multinomial logistic regression on the input's token counts
(the `c4like_8k` SentencePiece pieces the models read, cut to the task's input length, features
log(1 + count) with unit-norm rows), its L2 strength chosen on the validation split, trained on
the train split, scored on the test split with the task's primary metric and a 95% CI over test
examples (bootstrap, `t5x_like.sweep.stats`). With `--report`, a sweep report's rows (per task:
the best and the worst row's mean) are shown beside it. `downstream_word_order` is the control:
its two classes hold the same words, so the probe must score chance there.

    python scripts/bench_bow_probe.py [--tasks downstream_spam,...] \\
        [--report benchmarks/t5_tables_tiny.json] [--out benchmarks/downstream_bow_probe]
Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import minimize

from t5x_like.data import downstream, vocab  # noqa: E402
from t5x_like.runtime import host  # noqa: E402
from t5x_like.sweep import stats  # noqa: E402

TASKS = ("downstream_spam", "downstream_brown_genre", "downstream_sotu_party",
         "downstream_sotu_decade", "downstream_word_order")  # the `tiny` score's four + order
L2_GRID = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2)


def features(texts: list[str], encode, vocab_size: int, max_tokens: int) -> np.ndarray:
    """[n, vocab_size] float32: log(1 + count) of each piece among the first `max_tokens`
    pieces (the model's input length, EOS excluded), rows scaled to unit L2 norm."""
    x = np.zeros((len(texts), vocab_size), np.float32)
    for i, text in enumerate(texts):
        ids = np.asarray(encode(text)[:max_tokens], np.int64)
        np.add.at(x[i], ids, 1.0)
    x = np.log1p(x)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def fit(x: np.ndarray, y: np.ndarray, classes: int, l2: float) -> np.ndarray:
    """Multinomial logistic regression, mean cross-entropy + l2/2 |W|^2 (bias unpenalised),
    by L-BFGS from zeros (deterministic); returns [features + 1, classes]."""
    n, d = x.shape
    xb = np.hstack([x, np.ones((n, 1), np.float32)]).astype(np.float64)
    onehot = np.eye(classes)[y]

    def loss_grad(w_flat: np.ndarray) -> tuple[float, np.ndarray]:
        w = w_flat.reshape(d + 1, classes)
        logits = xb @ w
        logits -= logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        penalty = 0.5 * l2 * float((w[:-1] ** 2).sum())
        grad = xb.T @ (np.exp(logp) - onehot) / n
        grad[:-1] += l2 * w[:-1]
        return float(-(onehot * logp).sum() / n) + penalty, grad.ravel()

    result = minimize(loss_grad, np.zeros((d + 1) * classes), jac=True, method="L-BFGS-B",
                      options={"maxiter": 500})
    return result.x.reshape(d + 1, classes)


def predict(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    return (np.hstack([x, np.ones((len(x), 1), np.float32)]) @ w).argmax(axis=1)


def probe(task: str, replicates: int = 2000) -> dict[str, Any]:
    """Fit the probe on one task; returns its scores (validation per L2, test with a CI)."""
    spec = downstream.get_spec(task)
    spm = vocab.get_vocabulary("c4like_8k", extra_ids=0)
    max_tokens = spec.sequence_length["inputs"] - 1
    splits = {s: downstream.load_examples(task, s) for s in ("train", "validation", "test")}
    labels = sorted({e["targets"] for e in splits["train"]})
    index = {label: i for i, label in enumerate(labels)}
    x = {s: features([e["inputs"] for e in ex], spm.encode, spm.vocab_size, max_tokens)
         for s, ex in splits.items()}
    seen = x["train"].any(axis=0)  # pieces absent from train get no weight: drop them
    x = {s: v[:, seen] for s, v in x.items()}
    y_train = np.array([index[e["targets"]] for e in splits["train"]])
    start = time.perf_counter()
    by_l2 = {}
    for l2 in L2_GRID:
        w = fit(x["train"], y_train, len(labels), l2)
        outputs = [labels[i] for i in predict(w, x["validation"])]
        targets = [e["targets"] for e in splits["validation"]]
        by_l2[l2] = (downstream.compute_metrics(task, targets, outputs)["score"], w)
    best = max(L2_GRID, key=lambda l2: (by_l2[l2][0], l2))  # ties: the stronger penalty
    outputs = [labels[i] for i in predict(by_l2[best][1], x["test"])]
    targets = [e["targets"] for e in splits["test"]]
    metrics = downstream.compute_metrics(task, targets, outputs)
    codes = stats.encode(spec.primary_metric, targets, outputs)
    rng = np.random.default_rng(0)
    boot = stats.scores(codes, rng.integers(0, len(targets), (replicates, len(targets))))
    return {"task": task, "metric": spec.primary_metric, "labels": len(labels),
            "max_tokens": max_tokens, "train_examples": len(y_train),
            "features": int(seen.sum()),
            "validation_by_l2": {str(k): v[0] for k, v in by_l2.items()}, "l2": best,
            "test": metrics["score"], "test_ci": list(stats.percentile_ci(boot)),
            "majority_baseline": downstream.majority_baseline(task)["score"],
            "best_constant": stats.best_constant_score(codes),
            "seconds": round(time.perf_counter() - start, 1)}


def sweep_rows(report_path: str, tasks: list[str]) -> dict[str, dict[str, Any]]:
    """Per task, the best and the worst row (mean over seeds) of a sweep report's tables."""
    report = json.loads(Path(report_path).read_text())
    rows = [(f"{tid}: {r['row']}", r) for tid, t in report["tables"].items()
            for r in t["rows"] if r["num_seeds"]]
    out = {}
    for task in tasks:
        scored = sorted(((r["per_task"][task], name) for name, r in rows
                         if r["per_task"].get(task) is not None), reverse=True)
        if scored:
            out[task] = {"best": scored[0], "worst": scored[-1], "rows": len(scored)}
    return out


def markdown(result: dict[str, Any]) -> str:
    sweep = result.get("sweep") or {}
    lines = ["# A bag-of-words probe on the downstream suite", "",
             f"{result['host']}, {result['date']}. Written by `scripts/bench_bow_probe.py`: a "
             "multinomial logistic regression on log token counts (the `c4like_8k` pieces, cut "
             "to the task's input length), L2 chosen on validation, scored on test "
             "(95% CI over test examples)."
             + (f" Sweep rows from `{result['report']}` (mean over seeds)." if sweep else ""), "",
             "| task | metric | input tokens | majority baseline | best constant "
             "| bag-of-words probe [95% CI] | L2 |" + (" best row | worst row |" if sweep else ""),
             "|---|---|---|---|---|---|---|" + ("---|---|" if sweep else "")]
    for r in result["tasks"]:
        line = (f"| {r['task']} | {r['metric']} | {r['max_tokens']} | {r['majority_baseline']:.2f} "
                f"| {r['best_constant']:.2f} | **{r['test']:.2f}** "
                f"[{r['test_ci'][0]:.1f}, {r['test_ci'][1]:.1f}] | {r['l2']:g} |")
        if sweep:
            s = sweep.get(r["task"])
            pipe = "\\|"  # row names such as 'Prefix LM | LM' inside a table cell
            line += (f" {s['best'][0]:.2f} ({s['best'][1].replace('|', pipe)}) "
                     f"| {s['worst'][0]:.2f} ({s['worst'][1].replace('|', pipe)}) |"
                     if s else " — | — |")
        lines.append(line)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--report", default=None, help="a sweep report JSON to compare with")
    p.add_argument("--out", default="benchmarks/downstream_bow_probe")
    args = p.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    for task in tasks:
        if downstream.get_spec(task).primary_metric not in ("accuracy", "f1_macro"):
            raise SystemExit(f"error: {task} is not a classification task")
    result = {"host": host.describe(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
              "tasks": [probe(t) for t in tasks]}
    if args.report:
        result["report"], result["sweep"] = args.report, sweep_rows(args.report, tasks)
    Path(f"{args.out}.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    Path(f"{args.out}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
