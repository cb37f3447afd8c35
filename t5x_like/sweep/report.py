"""Tables from finished cells: Markdown in the paper's layout, JSON (DESIGN.md schema), Kendall τ.

For each sweep (paper table) and row: our suite average (mean ± std over seeds), per-task
scores, final pre-training loss, measured parameters and training FLOPs per sequence, the
paper's bookkeeping (P/2P, M/M/2) and its seven published columns. Rows are ranked by our score
and by the paper's GLUE column (`paper.COMPARE_COLUMN`, the closest analogue of an average of
classification scores) and compared with Kendall's τ (`scipy.stats.kendalltau`).

Where the cells kept their test predictions (`eval/predictions/<task>.jsonl`), `stats` adds a
bootstrap over seeds and test examples: a 95% CI per row, a CI of Kendall's τ, and the paper's
claims about the table (`paper.CLAIMS`) as paired differences with CIs and verdicts.
"""

from __future__ import annotations

import collections
import json
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from t5x_like.sweep import paper, stats
from t5x_like.sweep.config import SweepSpec
from t5x_like.sweep.grid import Cell, cells_of
from t5x_like.sweep.runner import RESULTS, cell_dir, write_json

METRIC = "suite_average"
METRIC_NOTE = ("suite average: mean of the downstream tasks' primary scores (0-100); compared "
               f"with the paper's {paper.COMPARE_COLUMN} column")


def collect(cells: Sequence[Cell], sweep_dir: str) -> dict[str, dict[str, Any]]:
    """cell_id -> its results.json, for the finished cells."""
    found = {}
    for cell in cells:
        path = os.path.join(cell_dir(sweep_dir, cell), RESULTS)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                found[cell.cell_id] = json.load(f)
    return found


def cell_predictions(path: str, tasks: Sequence[str],
                     eval_dir: str = "eval") -> dict[str, stats.TaskPredictions] | None:
    """A finished cell's test predictions per task (from `path/eval_dir`), coded for the
    bootstrap (None if any task's predictions file is missing, e.g. a cell from before they
    were kept)."""
    from t5x_like.data import downstream, scoring

    out = {}
    for task in tasks:
        file = os.path.join(path, eval_dir, "predictions", f"{task}.jsonl")
        if not os.path.exists(file):
            return None
        with open(file, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        metric = downstream.get_spec(task).primary_metric
        normalize = scoring.normalize_answer if metric == "exact_match" else scoring.strip
        out[task] = stats.encode(metric, [r["targets"] for r in rows],
                                 [r["output"] for r in rows], normalize=normalize)
    return out


def uncertainty(spec: SweepSpec, cells: Sequence[tuple[str, str]], tasks: Sequence[str],
                paper_scores: Mapping[str, float], sweep_dir: str,
                replicates: int = stats.DEFAULT_REPLICATES) -> dict[str, Any] | None:
    """Bootstrap CIs of every row, of Kendall's τ against `paper_scores`, and the table's
    claims; `cells` = (row, cell_id) of the finished cells. None when predictions are missing."""
    rows: dict[str, list[dict[str, stats.TaskPredictions]]] = {}
    for row, cell_id in cells:
        preds = cell_predictions(os.path.join(sweep_dir, "cells", cell_id), tasks)
        if preds is None:
            return None
        rows.setdefault(row, []).append(preds)
    if not rows or not tasks:
        return None
    boot = stats.row_replicates(rows, tasks, replicates)
    points = stats.point_scores(rows, tasks)
    ranked = [r for r in spec.rows if r in boot and r in paper_scores]
    tau_ci = None
    if len(ranked) >= 2:
        taus = stats.kendall_tau(np.stack([boot[r] for r in ranked], axis=1),
                                 np.array([paper_scores[r] for r in ranked]))
        tau_ci = list(stats.percentile_ci(taus))
    claims = []
    for claim in paper.CLAIMS:
        if claim.table != spec.table:
            continue
        result = stats.evaluate_claim(claim, boot, points)
        if result is not None:
            theirs = [paper_scores.get(r) for r in (*claim.better, *claim.worse)]
            result["paper_difference"] = (
                None if None in theirs else
                float(np.mean(theirs[:len(claim.better)]) - np.mean(theirs[len(claim.better):])))
            claims.append(result)
    best = {t: stats.best_constant_score(next(iter(rows.values()))[0][t]) for t in tasks}
    above = {}
    for t in tasks:  # the task's own score per row, bootstrapped like the suite average
        task_boot = stats.row_replicates(rows, [t], replicates)
        above[t] = [r for r in spec.rows
                    if r in task_boot and stats.percentile_ci(task_boot[r])[0] > best[t]]
    return {"row_ci": {r: list(stats.percentile_ci(b)) for r, b in boot.items()},
            "kendall_tau_ci": tau_ci, "claims": claims, "replicates": replicates,
            "collapsed": {r: {t: sum(stats.collapsed(s[t]) for s in seeds) for t in tasks}
                          for r, seeds in rows.items()},
            "best_constant": best, "above_constant": above}


def _mean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None]
    return float(statistics.fmean(values)) if values else None


def _std(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None]
    return float(statistics.stdev(values)) if len(values) >= 2 else None


def kendall(ours: Sequence[float], theirs: Sequence[float]) -> tuple[float | None, float | None]:
    """Kendall's τ and its p-value between two score lists (None when undefined: < 2 rows or
    a constant list)."""
    from scipy.stats import kendalltau

    if len(ours) != len(theirs):
        raise ValueError(f"kendall: {len(ours)} vs {len(theirs)} scores")
    if len(ours) < 2:
        return None, None
    result = kendalltau(list(ours), list(theirs))
    tau, p = float(result.statistic), float(result.pvalue)
    return (None if math.isnan(tau) else tau), (None if math.isnan(p) else p)


def rows_differ(groups: Sequence[Sequence[float]]) -> dict[str, Any] | None:
    """One-way ANOVA of per-seed scores across rows (`groups`: one list per row; rows with
    < 2 seeds are left out): F is the spread between the rows' means over the spread between
    seeds, and p the chance of an F this large if the rows were alike. `seed_std` is the
    pooled within-row std, sqrt(sum of squared deviations from each row's mean / (n - rows)):
    the sweep's own noise floor per seed, with `seed_df` degrees of freedom. None below 2 such
    rows. The sums are plain Python arithmetic, not NumPy's (whose reductions round by the
    CPU's vector width), so a report rebuilds to the same bytes on every host."""
    from scipy.stats import f as f_distribution

    groups = [[float(x) for x in g] for g in groups if len(g) >= 2]
    if len(groups) < 2:
        return None
    n = sum(len(g) for g in groups)
    df_rows, df = len(groups) - 1, n - len(groups)
    means = [sum(g) / len(g) for g in groups]
    grand = sum(x for g in groups for x in g) / n
    between = sum(len(g) * (m - grand) ** 2 for g, m in zip(groups, means, strict=True))
    within = sum((x - sum(g) / len(g)) ** 2 for g in groups for x in g)
    if within > 0:
        f = (between / df_rows) / (within / df)
        p = float(f_distribution.sf(f, df_rows, df))
    else:  # every row constant across its seeds: F undefined (infinite if the rows differ)
        f, p = None, (0.0 if between > 0 else None)
    return {"f": f if f is not None and math.isfinite(f) else None,
            "p": p if p is not None and math.isfinite(p) else None,
            "rows": len(groups), "seed_std": math.sqrt(within / df), "seed_df": df}


def table_entry(spec: SweepSpec, cells: Sequence[Cell],
                results: Mapping[str, Mapping[str, Any]], sweep_dir: str) -> dict[str, Any]:
    """One table of the JSON report (DESIGN.md: title, metric, rows[], kendall_tau, claims)."""
    by_row: dict[str, list[Mapping[str, Any]]] = {row: [] for row in spec.rows}
    ids: dict[str, list[str]] = {row: [] for row in spec.rows}
    for row, cell in cells_of(cells, spec.table):
        ids[row].append(cell.cell_id)
        if cell.cell_id in results:
            by_row[row].append(results[cell.cell_id])
    rows = []
    for row in spec.rows:
        done = by_row[row]
        tasks = sorted({t for r in done for t in r.get("tasks", {})})
        published = paper.published(spec.table, row)
        params, cost = spec.bookkeeping.get(row, (None, None))
        rows.append({
            "row": row,
            "ours_mean": _mean([r.get(METRIC) for r in done]),
            "ours_std": _std([r.get(METRIC) for r in done]),
            "num_seeds": len(done),
            "paper": published,
            "per_task": {t: _mean([r["tasks"].get(t) for r in done]) for t in tasks},
            "per_task_std": {t: _std([r["tasks"].get(t) for r in done]) for t in tasks},
            "pretrain_loss": _mean([r["pretrain"].get("final_loss") for r in done]),
            "paper_params": params, "paper_cost": cost,
            "parameters": done[0].get("parameters") if done else None,
            "flops_per_sequence": done[0].get("flops_per_sequence") if done else None,
            "seconds_per_cell": _mean([r.get("seconds", {}).get("total") for r in done]),
            "cells": ids[row],
        })
    paired = [r for r in rows if r["ours_mean"] is not None and r["paper"]]
    ours = {r["row"]: r["ours_mean"] for r in paired}
    theirs = {r["row"]: r["paper"][paper.COMPARE_COLUMN] for r in paired}
    tau, p = kendall(list(ours.values()), list(theirs.values()))
    tasks = sorted({t for rs in by_row.values() for r in rs for t in r.get("tasks", {})})
    finished = [(row, cell.cell_id) for row, cell in cells_of(cells, spec.table)
                if cell.cell_id in results]
    boot = uncertainty(spec, finished, tasks, theirs, sweep_dir)
    differ = {t: rows_differ([[r["tasks"][t] for r in rs if r["tasks"].get(t) is not None]
                              for rs in by_row.values()]) for t in tasks}
    differ[METRIC] = rows_differ([[r[METRIC] for r in rs if r.get(METRIC) is not None]
                                  for rs in by_row.values()])
    for r in rows:
        r["ci"] = boot["row_ci"].get(r["row"]) if boot else None
        r["collapsed"] = boot["collapsed"].get(r["row"]) if boot else None
    return {
        "title": spec.title, "metric": METRIC_NOTE, "rows": rows,
        "kendall_tau": tau, "kendall_p_value": p, "kendall_rows": len(paired),
        "kendall_tau_ci": boot["kendall_tau_ci"] if boot else None,
        "claims": boot["claims"] if boot else [],
        "bootstrap_replicates": boot["replicates"] if boot else 0,
        "ranking_ours": sorted(ours, key=lambda row: -ours[row]),  # best first
        "ranking_paper": sorted(theirs, key=lambda row: -theirs[row]),
        "paper_table": paper.TABLE_NUMBERS.get(spec.table),
        "baseline_average": _mean([r.get("baseline_average") for rs in by_row.values()
                                   for r in rs]),
        "best_constant": boot["best_constant"] if boot else None,
        "above_constant": boot["above_constant"] if boot else None,
        "rows_differ": differ,
    }


def _num(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _si(value: float | None) -> str:
    if value is None:
        return "—"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"


def table_markdown(table_id: str, entry: Mapping[str, Any]) -> str:
    """The table in the paper's layout, ours beside the published scores, plus the rankings."""
    rows = entry["rows"]
    split = all(" | " in r["row"] for r in rows)
    tasks = sorted({t for r in rows for t in r["per_task"]})
    has_cost = any(r["paper_params"] for r in rows)
    head = ["Architecture", "Objective"] if split else ["Row"]
    if has_cost:
        head += ["Params (paper)", "Cost (paper)"]
    head += ["Params (ours)", "FLOPs/seq (ours)", "Ours: suite avg", "seeds",
             *[t.removeprefix("downstream_") for t in tasks], "pre-train loss",
             *[f"paper {c}" for c in paper.COLUMNS]]
    lines = [f"### {entry['title']}", "",
             f"Paper: Table {entry.get('paper_table')}. Ours = {entry['metric']}.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = r["row"].split(" | ", 1) if split else [r["row"]]
        if has_cost:
            cells += [r["paper_params"] or "—", r["paper_cost"] or "—"]
        ours = _num(r["ours_mean"])
        if r["ours_std"] is not None:
            ours += f" ± {r['ours_std']:.2f}"
        if r.get("ci"):
            ours += f" [{r['ci'][0]:.1f}, {r['ci'][1]:.1f}]"
        cells += [_si(r["parameters"]), _si(r["flops_per_sequence"]), f"**{ours}**",
                  str(r["num_seeds"]), *[_num(r["per_task"].get(t)) for t in tasks],
                  _num(r["pretrain_loss"], 3),
                  *[_num((r["paper"] or {}).get(c)) for c in paper.COLUMNS]]
        lines.append("| " + " | ".join(cells) + " |")
    tau, p, n = entry["kendall_tau"], entry["kendall_p_value"], entry["kendall_rows"]
    lines += ["", f"- Ranking, ours: {' > '.join(entry['ranking_ours']) or '—'}",
              f"- Ranking, paper ({paper.COMPARE_COLUMN}): "
              f"{' > '.join(entry['ranking_paper']) or '—'}",
              f"- Kendall τ (ours vs paper over {n} rows): {_num(tau)} (p = {_num(p, 3)})"
              + (f", 95% CI [{entry['kendall_tau_ci'][0]:.2f}, {entry['kendall_tau_ci'][1]:.2f}]"
                 if entry.get("kendall_tau_ci") else ""),
              f"- Majority-class / trivial baseline, suite average: "
              f"{_num(entry.get('baseline_average'))}", ""]
    if entry.get("bootstrap_replicates"):
        lines += [f"Ours = mean ± std over seeds [95% CI: {entry['bootstrap_replicates']} "
                  "bootstrap replicates over seeds and test examples].", ""]
    return "\n".join(lines + claims_markdown(entry.get("claims", []))
                     + signal_markdown(entry) + collapsed_markdown(entry))


def _anova(result: Mapping[str, Any] | None) -> str:
    if not result or result["f"] is None:
        return "—"
    p = result["p"]
    return f"{result['f']:.1f} ({'p < 0.001' if p < 0.001 else f'p {p:.3f}'})"


def _pooled(result: Mapping[str, Any] | None) -> str:
    if not result or result.get("seed_std") is None:
        return "—"
    return f"{result['seed_std']:.2f} ({result['seed_df']})"


def signal_markdown(entry: Mapping[str, Any]) -> list[str]:
    """Per task: the best constant predictor's score and the rows whose 95% CI of the task
    score lies above it (a task no row beats may measure the fine-tune, not the pre-training),
    and whether the task's scores differ between rows more than between seeds (ANOVA)."""
    best, above = entry.get("best_constant"), entry.get("above_constant")
    differ = entry.get("rows_differ") or {}
    tasks = sorted(best or (t for t in differ if t != METRIC))
    has_anova = any(differ.get(k) for k in (*tasks, METRIC))
    if not tasks or (not best and not has_anova):
        return []
    done = sum(1 for r in entry["rows"] if r["num_seeds"])
    note = "Signal per task."
    if best:
        note += (" *Best constant*: the score of the same output for every test example (often "
                 "above the majority-class baseline when the test split's label shares differ "
                 "from training's), and the rows whose 95% CI lies above it.")
    if has_anova:
        note += (" *Rows differ*: one-way ANOVA of the per-seed scores across the rows with >= 2 "
                 "seeds, F (p): a task whose rows differ no more than its seeds cannot rank "
                 "them. *Seed std, pooled*: the std between seeds of one row, pooled over those "
                 "rows (df = seeds minus rows): this run's own noise floor.")
    lines = [note, "",
             "| | " + " | ".join(t.removeprefix("downstream_") for t in tasks)
             + (" | suite average |" if has_anova else " |"),
             "|---|" + "---|" * (len(tasks) + has_anova)]
    if best and above is not None:
        extra = " — |" if has_anova else ""
        lines += ["| best constant score | " + " | ".join(_num(best[t]) for t in tasks)
                  + " |" + extra,
                  "| rows above it | " + " | ".join(f"{len(above.get(t, []))}/{done}"
                                                   for t in tasks) + " |" + extra]
    if has_anova:
        lines.append("| rows differ: F (p) | " + " | ".join(
            _anova(differ.get(k)) for k in (*tasks, METRIC)) + " |")
        lines.append("| seed std, pooled (df) | " + " | ".join(
            _pooled(differ.get(k)) for k in (*tasks, METRIC)) + " |")
    return lines + [""]


def collapsed_markdown(entry: Mapping[str, Any]) -> list[str]:
    """Per row and task, the seeds whose fine-tune collapsed to one label (`stats.collapsed`):
    a row's task score near the best constant's, with collapsed seeds, measures the fine-tune's
    failure rather than the pre-training."""
    rows = [r for r in entry["rows"] if r.get("collapsed")]
    if not rows or not any(n for r in rows for n in r["collapsed"].values()):
        return []
    tasks = sorted({t for r in rows for t in r["collapsed"]})
    split = all(" | " in r["row"] for r in entry["rows"])  # 'Architecture | Objective'
    head = ["Architecture", "Objective"] if split else ["Row"]
    names = [*head, *[t.removeprefix("downstream_") for t in tasks]]
    lines = [f"Fine-tunes collapsed to one label (≥ {stats.COLLAPSED_SHARE:.0%} of the test "
             "examples given the same output), seeds per row:", "",
             "| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for r in rows:
        lines.append(f"| {r['row']} | " + " | ".join(
            f"{r['collapsed'].get(t, 0)}/{r['num_seeds']}" for t in tasks) + " |")
    return [*lines, ""]


def claims_markdown(claims: Sequence[Mapping[str, Any]]) -> list[str]:
    """The claims table: each of the paper's comparisons as our paired difference with its
    CI and a verdict (and, when unresolved, the seeds per row that would settle it)."""
    if not claims:
        return []
    lines = ["| Claim (paper) | paper Δ GLUE | ours: Δ suite avg [95% CI] | verdict | seeds "
             "| seeds needed |", "|---|---|---|---|---|---|"]
    for c in claims:
        rel = f" (within ±{c['margin']:g})" if c["relation"] == "≈" else ""
        needed = c["seeds_needed"]
        lines.append(
            f"| {c['claim']}{rel} | {_num(c.get('paper_difference'))} | {c['difference']:+.2f} "
            f"[{c['ci'][0]:+.2f}, {c['ci'][1]:+.2f}] | {c['verdict']} | {c['seeds']} | "
            f"{'—' if needed is None else needed} |")
    return [*lines, ""]


def build(specs: Sequence[SweepSpec], cells: Sequence[Cell], sweep_dir: str,
          scale: str) -> dict[str, Any]:
    """The whole report: {'scale', 'tables': {table_id: entry}} (DESIGN.md schema)."""
    results = collect(cells, sweep_dir)
    count = lambda key: dict(sorted(collections.Counter(
        str(r.get(key) or "unrecorded") for r in results.values()).items()))
    return {"scale": scale, "num_cells": len(cells), "num_cells_done": len(results),
            "code_versions": count("code"), "hosts": count("host"),
            "tables": {s.table: table_entry(s, cells, results, sweep_dir) for s in specs}}


def markdown(report: Mapping[str, Any], image_prefix: str = "", discussion: str = "") -> str:
    """All tables as one Markdown document (plots referenced as `<image_prefix><table>.png`),
    then `discussion` (hand-written analysis kept beside the results) if any."""
    parts = [f"# T5 paper tables at the `{report['scale']}` scale", "",
             f"{report['num_cells_done']} of {report['num_cells']} cells finished. Generated by "
             "`python -m t5x_like.sweep`; every number here is measured by this run.", ""]
    for key, label in (("code_versions", "Code (t5x_like commit: cells)"),
                       ("hosts", "Hosts (CPU: cells)")):
        if report.get(key):
            parts.insert(-1, f"{label}: " + ", ".join(
                f"{v}: {n}" for v, n in report[key].items()) + ".")
    for table_id, entry in report["tables"].items():
        parts += [table_markdown(table_id, entry), f"![{table_id}]({image_prefix}{table_id}.png)",
                  ""]
    parts += ["### Pre-training loss curves", "",
              f"![loss curves]({image_prefix}loss_curves.png)", ""]
    if discussion.strip():
        parts += [discussion.strip(), ""]
    return "\n".join(parts)


def write(report: Mapping[str, Any], cells: Sequence[Cell], sweep_dir: str,
          out: str | None = None) -> list[str]:
    """Write `<sweep_dir>/<table>.{md,json,png}`, `t5_tables_<scale>.{md,json}`,
    `loss_curves.png`; with `out` (a path prefix) also `<out>.md/.json` and `<out>_*.png`.
    `<out>_discussion.md`, when it exists, is appended to `<out>.md`: the analysis of a
    committed result survives regenerating it."""
    from t5x_like.sweep import plots

    written = []
    for table_id, entry in report["tables"].items():
        base = os.path.join(sweep_dir, table_id)
        with open(base + ".md", "w", encoding="utf-8") as f:
            f.write(table_markdown(table_id, entry) + f"\n![{table_id}]({table_id}.png)\n")
        write_json(base + ".json", {"scale": report["scale"], "tables": {table_id: entry}})
        plots.bar_chart(entry, base + ".png")
        written += [base + ".md", base + ".json", base + ".png"]
    plots.loss_curves(cells, sweep_dir, os.path.join(sweep_dir, "loss_curves.png"))
    combined = os.path.join(sweep_dir, f"t5_tables_{report['scale']}")
    with open(combined + ".md", "w", encoding="utf-8") as f:
        f.write(markdown(report))
    write_json(combined + ".json", report)
    written += [os.path.join(sweep_dir, "loss_curves.png"), combined + ".md", combined + ".json"]
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        prefix = os.path.basename(out) + "_"
        discussion = ""
        if os.path.exists(out + "_discussion.md"):
            with open(out + "_discussion.md", encoding="utf-8") as f:
                discussion = f.read()
        with open(out + ".md", "w", encoding="utf-8") as f:
            f.write(markdown(report, image_prefix=prefix, discussion=discussion))
        write_json(out + ".json", report)
        for table_id, entry in report["tables"].items():
            plots.bar_chart(entry, f"{out}_{table_id}.png")
            written.append(f"{out}_{table_id}.png")
        plots.loss_curves(cells, sweep_dir, f"{out}_loss_curves.png")
        written += [out + ".md", out + ".json", f"{out}_loss_curves.png"]
    return written
