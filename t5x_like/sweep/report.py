"""Tables from finished cells: Markdown in the paper's layout, JSON (DESIGN.md schema), Kendall τ.

Per sweep (paper table) and row: our suite average (mean ± std over seeds), per-task scores,
pre-training loss, parameters, FLOPs and the paper's published columns; our ranking against the
paper's `COMPARE_COLUMN` by Kendall's τ. From the test predictions, `stats` adds row intervals,
verdicts on `paper.CLAIMS`, which rows differ, and host as a factor.
"""

from __future__ import annotations

import collections
import fractions
import json
import math
import os
import pathlib
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import special

from t5x_like.sweep import paper, stats
from t5x_like.sweep.config import SweepSpec
from t5x_like.sweep.grid import Cell, cells_of
from t5x_like.sweep.runner import RESULTS, cell_dir, write_json

METRIC = "suite_average"
METRIC_NOTE = ("suite average: mean of the downstream tasks' primary scores (0-100); compared "
               f"with the paper's {paper.COMPARE_COLUMN} column")
#: How the claims' verdicts are reached (`stats.evaluate_claims`), in the JSON and the report.
VERDICT_METHOD = (
    f"Holm over the table's claims: family-wise error rate {stats.FAMILY_ALPHA:.0%}. Each claim "
    "is an unpaired t-test of a difference of row means; its variance adds the seed variance "
    "pooled over the table's rows and the test examples' (a jackknife over the shared test "
    "examples, between different cells only). No random draws.")
KENDALL_TEST = "exact two-sided permutation test over every order of the rows"


def collect(cells: Sequence[Cell], sweep_dir: str) -> dict[str, dict[str, Any]]:
    """cell_id -> its results.json, for the finished cells."""
    paths = {cell.cell_id: os.path.join(cell_dir(sweep_dir, cell), RESULTS) for cell in cells}
    return {cell_id: json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
            for cell_id, path in paths.items() if os.path.exists(path)}


def cell_predictions(path: str, tasks: Sequence[str],
                     eval_dir: str = "eval") -> dict[str, stats.TaskPredictions] | None:
    """A finished cell's test predictions per task (from `path/eval_dir`), coded; None if a
    task's predictions file is missing (a cell from before they were kept)."""
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
                sweep_dir: str) -> dict[str, Any] | None:
    """From the test predictions of the finished `cells` ((row, cell_id)): row intervals, claim
    verdicts, per task the best constant score, the rows above it and the collapsed fine-tunes."""
    rows: dict[str, list[dict[str, stats.TaskPredictions]]] = {}
    for row, cell_id in cells:
        preds = cell_predictions(os.path.join(sweep_dir, "cells", cell_id), tasks)
        if preds is None:
            return None
        rows.setdefault(row, []).append(preds)
    if not rows or not tasks:
        return None
    data = stats.table_data(rows, tasks)
    claims = stats.evaluate_claims([c for c in paper.CLAIMS if c.table == spec.table], data)
    best = {t: stats.best_constant_score(next(iter(rows.values()))[0][t]) for t in tasks}
    row_ci = lambda table, row: stats.interval(stats.contrast(table, {row: 1.0}))  # 95% t
    above: dict[str, list[str] | None] = {}
    for t in tasks:  # the task's own score per row, with the same design as the suite average
        per_task = stats.table_data(rows, [t])
        cis = {r: row_ci(per_task, r) for r in spec.rows if r in rows}
        above[t] = (None if per_task.seed_var is None else
                    [r for r, ci in cis.items() if ci and ci[0] > best[t]])
    return {"row_ci": {r: row_ci(data, r) for r in rows}, "claims": claims,
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
    """Kendall's τ-b and its exact two-sided permutation p-value (`stats.kendall_permutation_p`)
    between two score lists (None when undefined: < 2 rows or a constant list)."""
    p = stats.kendall_permutation_p(ours, theirs)  # first: it raises on a length mismatch
    tau = float(stats.kendall_tau(np.array([ours], np.float64), np.array(theirs, np.float64))[0])
    return (None if math.isnan(tau) else tau), p


def rows_differ(groups: Sequence[Sequence[float]]) -> dict[str, Any] | None:
    """One-way ANOVA of per-seed scores (one list per row; rows with < 2 seeds left out): F, p,
    and `seed_std` (`stats.pooled_variance`: the sweep's noise floor per seed). None below 2
    such rows. Plain Python sums (NumPy's round by the CPU's vector width)."""
    groups = [[float(x) for x in g] for g in groups if len(g) >= 2]
    if len(groups) < 2:
        return None
    var, df = stats.pooled_variance(groups)
    grand = sum(x for g in groups for x in g) / (df + len(groups))
    between = sum(len(g) * (sum(g) / len(g) - grand) ** 2 for g in groups)
    # every row constant across its seeds: F undefined (infinite if the rows differ)
    f = (between / (len(groups) - 1)) / var if var > 0 else None
    p = (float(special.fdtrc(len(groups) - 1, df, f)) if f is not None else
         0.0 if between > 0 else None)
    finite = lambda x: x if x is not None and math.isfinite(x) else None
    return {"f": finite(f), "p": finite(p), "rows": len(groups), "seed_std": math.sqrt(var),
            "seed_df": df}


def _row_entry(spec: SweepSpec, row: str, done: Sequence[Mapping[str, Any]], ids: Sequence[str],
               found: Mapping[str, Any]) -> dict[str, Any]:
    """One row of a table entry, from its cells' results and the table's `uncertainty`."""
    tasks = sorted({t for r in done for t in r.get("tasks", {})})
    params, cost = spec.bookkeeping.get(row, (None, None))
    first = done[0] if done else {}
    return {
        "row": row, "ours_mean": _mean([r.get(METRIC) for r in done]),
        "ours_std": _std([r.get(METRIC) for r in done]), "num_seeds": len(done),
        "paper": paper.published(spec.table, row),
        "per_task": {t: _mean([r["tasks"].get(t) for r in done]) for t in tasks},
        "per_task_std": {t: _std([r["tasks"].get(t) for r in done]) for t in tasks},
        "pretrain_loss": _mean([r["pretrain"].get("final_loss") for r in done]),
        "paper_params": params, "paper_cost": cost, "parameters": first.get("parameters"),
        "flops_per_sequence": first.get("flops_per_sequence"),
        # wall time (two cells at a time, any pauses included) and the CPU time the cell used
        "seconds_per_cell": _mean([r.get("seconds", {}).get("total") for r in done]),
        "cpu_seconds_per_cell": _mean([r.get("cpu_seconds", {}).get("total") for r in done]),
        "cells": list(ids),
        # a control (no pre-training) is shown beside the paper's rows, not ranked with them
        "control": row in paper.CONTROL_ROWS or any(r.get("control") for r in done),
        "ci": found.get("row_ci", {}).get(row), "collapsed": found.get("collapsed", {}).get(row),
    }


def _recorded(result: Mapping[str, Any], key: str) -> str:
    """What a cell's results.json records under `key` (e.g. its host); 'unrecorded' if none."""
    return str(result.get(key) or "unrecorded")


def _tally(results: Iterable[Mapping[str, Any]], key: str) -> dict[str, int]:
    """What the cells' results record under `key` (`_recorded`) -> how many, in sorted order."""
    return dict(sorted(collections.Counter(_recorded(r, key) for r in results).items()))


def claim_hosts(claim: paper.Claim, by_row: Mapping[str, Sequence[Mapping[str, Any]]]
                ) -> dict[str, Any]:
    """The hosts of the cells on each side of a claim, and whether the sides' shares of each
    host differ (`warning`): then the difference carries the hosts' difference too."""
    sides = {side: _tally((r for row in rows for r in by_row.get(row, ())), "host")
             for side, rows in (("better", claim.better), ("worse", claim.worse))}
    shares = [{h: fractions.Fraction(n, sum(c.values())) for h, n in c.items()}
              for c in sides.values() if c]
    return {**sides, "warning": len(shares) == 2 and shares[0] != shares[1]}


def table_entry(spec: SweepSpec, cells: Sequence[Cell],
                results: Mapping[str, Mapping[str, Any]], sweep_dir: str) -> dict[str, Any]:
    """One table of the JSON report (DESIGN.md: title, metric, rows[], kendall_tau, claims)."""
    ids = [(row, cell.cell_id) for row, cell in cells_of(cells, spec.table)]
    finished = [(row, cell_id) for row, cell_id in ids if cell_id in results]
    by_row = {row: [results[i] for r, i in finished if r == row] for row in spec.rows}
    done = [r for rs in by_row.values() for r in rs]
    tasks = sorted({t for r in done for t in r.get("tasks", {})})
    found = uncertainty(spec, finished, tasks, sweep_dir) or {}
    rows = [_row_entry(spec, row, by_row[row], [i for r, i in ids if r == row], found)
            for row in spec.rows]
    paired = [r for r in rows if r["ours_mean"] is not None and r["paper"] and not r["control"]]
    ours = {r["row"]: r["ours_mean"] for r in paired}
    theirs = {r["row"]: r["paper"][paper.COMPARE_COLUMN] for r in paired}
    tau, p = kendall(list(ours.values()), list(theirs.values()))
    differ = {t: rows_differ([[r["tasks"][t] for r in rs if r["tasks"].get(t) is not None]
                              for rs in by_row.values()]) for t in tasks}
    suite = {row: [r[METRIC] for r in rs if r.get(METRIC) is not None]
             for row, rs in by_row.items()}
    differ[METRIC] = rows_differ(list(suite.values()))
    claims = found.get("claims", [])
    for c in claims:
        claim = next(k for k in paper.CLAIMS if k.table == spec.table and k.text == c["claim"])
        sides = [theirs.get(r) for r in (*claim.better, *claim.worse)]
        c["paper_difference"] = (
            None if None in sides else
            float(np.mean(sides[:len(claim.better)]) - np.mean(sides[len(claim.better):])))
        c["hosts"] = claim_hosts(claim, by_row)
    return {
        "title": spec.title, "metric": METRIC_NOTE, "rows": rows, "kendall_tau": tau,
        "kendall_p_value": p, "kendall_rows": len(paired), "kendall_test": KENDALL_TEST,
        "claims": claims, "verdict_method": VERDICT_METHOD if claims else None,
        "ranking_ours": sorted(ours, key=lambda row: -ours[row]),  # best first
        "ranking_paper": sorted(theirs, key=lambda row: -theirs[row]),
        "paper_table": paper.TABLE_NUMBERS.get(spec.table),
        "baseline_average": _mean([r.get("baseline_average") for r in done]),
        "best_constant": found.get("best_constant"), "above_constant": found.get("above_constant"),
        "exploratory_tasks": sorted({t for r in done
                                     for t, flag in (r.get("exploratory") or {}).items() if flag}),
        "rows_differ": differ, "pairs_differ": stats.pairwise(suite),
        "hosts": _tally(done, "host"),
        "host_factor": stats.host_factor([(row, _recorded(r, "host"), r[METRIC])
                                          for row, rs in by_row.items() for r in rs
                                          if r.get(METRIC) is not None]),
    }


def _task(task: str, entry: Mapping[str, Any]) -> str:
    """A task's column name: without 'downstream_', '†' when exploratory."""
    return task.removeprefix("downstream_") + (
        " †" if task in (entry.get("exploratory_tasks") or ()) else "")


def _num(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _si(value: float | None) -> str:
    if value is None:
        return "—"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"


def _md_row(cells: Iterable[str]) -> str:
    """One line of a Markdown table."""
    return "| " + " | ".join(cells) + " |"


def _md_head(names: Sequence[str]) -> list[str]:
    """A Markdown table's header line and rule."""
    return [_md_row(names), "|" + "---|" * len(names)]


def _row_head(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The columns naming the rows: a name 'Architecture | Objective' fills two."""
    return ["Architecture", "Objective"] if all(" | " in r["row"] for r in rows) else ["Row"]


def table_markdown(table_id: str, entry: Mapping[str, Any]) -> str:
    """The table in the paper's layout, ours beside the published scores, plus the rankings."""
    rows = entry["rows"]
    tasks = sorted({t for r in rows for t in r["per_task"]})
    has_cost = any(r["paper_params"] for r in rows)
    head = [*_row_head(rows), *(["Params (paper)", "Cost (paper)"] if has_cost else []),
            "Params (ours)", "FLOPs/seq (ours)", "Ours: suite avg", "seeds",
            *[_task(t, entry) for t in tasks], "pre-train loss",
            *[f"paper {c}" for c in paper.COLUMNS]]
    lines = [f"### {entry['title']}", "",
             f"Paper: Table {entry.get('paper_table')}. Ours = {entry['metric']}.", "",
             *_md_head(head)]
    for r in rows:
        ours = _num(r["ours_mean"]) + ("" if r["ours_std"] is None else f" ± {r['ours_std']:.2f}")
        ours += f" [{r['ci'][0]:.1f}, {r['ci'][1]:.1f}]" if r.get("ci") else ""
        cost = [r["paper_params"] or "—", r["paper_cost"] or "—"] if has_cost else []
        lines.append(_md_row([
            r["row"], *cost, _si(r["parameters"]), _si(r["flops_per_sequence"]), f"**{ours}**",
            str(r["num_seeds"]), *[_num(r["per_task"].get(t)) for t in tasks],
            _num(r["pretrain_loss"], 3), *[_num((r["paper"] or {}).get(c)) for c in paper.COLUMNS],
        ]))
    if entry.get("exploratory_tasks"):
        lines += ["", "† Exploratory task: designed after results were seen, so its scores (and "
                  "a suite average that includes them) test no prediction made in advance."]
    tau, p, n = entry["kendall_tau"], entry["kendall_p_value"], entry["kendall_rows"]
    lines += ["", f"- Ranking, ours: {' > '.join(entry['ranking_ours']) or '—'}",
              f"- Ranking, paper ({paper.COMPARE_COLUMN}): "
              f"{' > '.join(entry['ranking_paper']) or '—'}",
              f"- Kendall τ (ours vs paper over {n} rows): {_num(tau)} (exact permutation "
              f"p = {_num(p, 3)})",
              f"- Majority-class / trivial baseline, suite average: "
              f"{_num(entry.get('baseline_average'))}", ""]
    if any(r.get("ci") for r in rows):
        df = ((entry.get("rows_differ") or {}).get(METRIC) or {}).get("seed_df")
        lines += [f"Ours = mean ± std over seeds [95% t interval: the seed variance pooled over "
                  f"the table's rows (df {df}) plus the test examples' (jackknife)].", ""]
    sections = (claims_markdown, signal_markdown, pairs_markdown, host_markdown, collapsed_markdown)
    return "\n".join(lines + [line for section in sections for line in section(entry)])


def signal_markdown(entry: Mapping[str, Any]) -> list[str]:
    """Per task: the best constant score and the rows whose 95% CI lies above it (a task no row
    beats may measure the fine-tune, not the pre-training), and the ANOVA across rows."""
    best, above = entry.get("best_constant"), entry.get("above_constant")
    differ = entry.get("rows_differ") or {}
    tasks = sorted(best or (t for t in differ if t != METRIC))
    has_anova = any(differ.get(k) for k in (*tasks, METRIC))
    if not tasks or (not best and not has_anova):
        return []
    done = sum(1 for r in entry["rows"] if r["num_seeds"])
    note = "Signal per task." + (
        " *Best constant*: the score of the same output for every test example (often above the "
        "majority-class baseline when the test split's label shares differ from training's), and "
        "the rows whose 95% t interval of the task score lies above it." if best else "") + (
        " *Rows differ*: one-way ANOVA of the per-seed scores across the rows with >= 2 seeds, F "
        "(p): a task whose rows differ no more than its seeds cannot rank them. *Seed std, "
        "pooled*: the std between seeds of one row, pooled over those rows (df = seeds minus "
        "rows): this run's own noise floor." if has_anova else "")
    columns = [*[_task(t, entry) for t in tasks], *(["suite average"] if has_anova else [])]
    body = []
    if best and above is not None:
        extra = ["—"] if has_anova else []
        body += [["best constant score", *[_num(best[t]) for t in tasks], *extra],
                 ["rows above it", *["—" if above.get(t) is None else f"{len(above[t])}/{done}"
                                     for t in tasks], *extra]]
    if has_anova:
        found = [differ.get(k) or {} for k in (*tasks, METRIC)]
        body += [["rows differ: F (p)", *["—" if d.get("f") is None else
                                          f"{d['f']:.1f} (p {_p(d['p'])})" for d in found]],
                 ["seed std, pooled (df)", *["—" if d.get("seed_std") is None else
                                             f"{d['seed_std']:.2f} ({d['seed_df']})"
                                             for d in found]]]
    return [note, "", "| | " + " | ".join(columns) + " |", "|" + "---|" * (1 + len(columns)),
            *map(_md_row, body), ""]


def collapsed_markdown(entry: Mapping[str, Any]) -> list[str]:
    """Per row and task, the seeds whose fine-tune collapsed to one label (`stats.collapsed`):
    their scores measure the fine-tune's failure rather than the pre-training."""
    rows = [r for r in entry["rows"] if r.get("collapsed")]
    if not rows or not any(n for r in rows for n in r["collapsed"].values()):
        return []
    tasks = sorted({t for r in rows for t in r["collapsed"]})
    body = [[r["row"], *[f"{r['collapsed'].get(t, 0)}/{r['num_seeds']}" for t in tasks]]
            for r in rows]
    return [f"Fine-tunes collapsed to one label (≥ {stats.COLLAPSED_SHARE:.0%} of the test "
            "examples given the same output), seeds per row:", "",
            *_md_head([*_row_head(entry["rows"]), *[_task(t, entry) for t in tasks]]),
            *map(_md_row, body), ""]


def _host_label(hosts: Sequence[str], host: str) -> str:
    return chr(ord("A") + hosts.index(host)) if host in hosts else "?"


def _claim_hosts(c: Mapping[str, Any], hosts: Sequence[str]) -> str:
    sides = c.get("hosts") or {}
    text = " vs ".join(" ".join(f"{_host_label(hosts, h)}{n}" for h, n in sides.get(side, {})
                                .items()) or "—" for side in ("better", "worse"))
    return text + (" ⚠" if sides.get("warning") else "")


def _seeds_needed(c: Mapping[str, Any]) -> str:
    if c.get("seeds_limit") or c.get("seeds_needed") is None:
        return c.get("seeds_limit") or "—"
    low, high = c.get("seeds_needed_range") or [None, None]
    return f"{c['seeds_needed']} [{low or '—'}-{high or '—'}]"


def claims_markdown(entry: Mapping[str, Any]) -> list[str]:
    """The claims table (`stats.evaluate_claims`); with cells on several hosts, each side's
    hosts (⚠ where they differ)."""
    claims, hosts = entry.get("claims", []), sorted(entry.get("hosts") or {})
    if not claims:
        return []
    family = sum(1 for c in claims if c.get("p") is not None)
    many = len(hosts) > 1
    note = (f"Claims. {VERDICT_METHOD} *Interval*: at Holm's level for the claim (its "
            "confidence in brackets), so it clears 0 (for '≈': lies inside or outside ±margin) "
            "exactly when the verdict is settled. *Seeds needed*: seeds per row, every row of the "
            f"table at that count, for {stats.POWER:.0%} power at α = {stats.FAMILY_ALPHA:g}/"
            f"{family} (Holm's first step), noncentral t, the observed difference taken as "
            "true; in brackets the same at the ends of the pooled seed std's 95% interval. "
            "*test examples*: no number of seeds gets there on these test sets.")
    if not family:
        note = ("Claims. With one seed per row there is no seed spread to test a difference "
                "against: no claim is tested (every verdict unresolved).")
    lines = [note, "", *_md_head(
        ["Claim (paper)", "paper Δ GLUE", "ours: Δ suite avg", "interval at Holm's level",
         "p (Holm)", "verdict", "seeds", "seeds needed [range]", *(["hosts"] if many else [])])]
    for c in claims:
        rel = f" (within ±{c['margin']:g})" if c["relation"] == "≈" else ""
        ci = ("—" if not c.get("ci") else f"[{c['ci'][0]:+.2f}, {c['ci'][1]:+.2f}] "
              f"({100 * c['ci_confidence']:.1f}%)")
        p = "—" if c.get("p") is None else f"{_p(c['p'])} ({_p(c['p_holm'])})"
        lines.append(_md_row([
            c["claim"] + rel, _num(c.get("paper_difference")), f"{c['difference']:+.2f}", ci, p,
            c["verdict"], str(c["seeds"]), _seeds_needed(c),
            *([_claim_hosts(c, hosts)] if many else [])]))
    lines.append("")
    if many:
        lines += ["Hosts: " + "; ".join(f"{_host_label(hosts, h)} = {h}" for h in hosts)
                  + ". ⚠: the claim's two sides ran on different hosts (or in different shares),"
                  " so its difference also holds any difference between the hosts.", ""]
    return lines


def _p(p: float | None) -> str:
    return "—" if p is None else "< 0.001" if p < 0.001 else f"{p:.3f}"


def pairs_markdown(entry: Mapping[str, Any]) -> list[str]:
    """Which rows differ (suite average): the pairs Holm's correction keeps (`stats.pairwise`)."""
    found = entry.get("pairs_differ")
    if not found:
        return []
    pairs = found["pairs"]
    differ = [p for p in pairs if p["differ"]]
    head = (f"Which rows differ (suite average): a t-test per pair of rows on the per-seed scores "
            f"with the pooled seed std (df {found['seed_df']}), Holm over the {len(pairs)} pairs "
            f"(family-wise {found['alpha']:.0%}); like the ANOVA, on these test sets. ")
    if not differ:
        return [head + "No pair differs (smallest Holm p "
                f"{_p(min(p['p_holm'] for p in pairs))}).", ""]
    verb = "1 pair differs" if len(differ) == 1 else f"{len(differ)} pairs differ"
    return [head + verb + ": " + "; ".join(
                f"{p['better']} > {p['worse']} (+{p['difference']:.2f}, Holm p {_p(p['p_holm'])})"
                for p in differ) + ".", ""]


def host_markdown(entry: Mapping[str, Any]) -> list[str]:
    """Host as a factor (`stats.host_factor`), when a table's cells ran on several hosts."""
    found = entry.get("host_factor")
    if not found:
        return []
    hosts = found["hosts"]
    head = f"Host as a factor: this table's cells ran on {len(hosts)} hosts. "
    if not found["testable"]:
        return [head + "No row has cells on more than one, so the host cannot be told apart "
                "from the rows (untested): a claim marked ⚠ compares hosts as well as rows.", ""]
    effects = ", ".join(f"{_host_label(hosts, h)} − A {e:+.2f}" for h, e in
                        found["effects"].items() if e is not None)
    test = ("F undefined" if found["f"] is None else
            f"F = {found['f']:.2f}, p = {_num(found['p'], 3)}, df {found['df'][0]}, "
            f"{found['df'][1]}")
    return [head + f"{found['rows_spanning_hosts']} row(s) span hosts. Suite average = row + "
            f"host, host tested after the rows: {test}; within-row host effect {effects}.", ""]


def build(specs: Sequence[SweepSpec], cells: Sequence[Cell], sweep_dir: str,
          scale: str) -> dict[str, Any]:
    """The whole report: {'scale', 'tables': {table_id: entry}} (DESIGN.md schema)."""
    results = collect(cells, sweep_dir)
    return {"scale": scale, "num_cells": len(cells), "num_cells_done": len(results),
            "code_versions": _tally(results.values(), "code"),
            "hosts": _tally(results.values(), "host"),
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
    `loss_curves.png`; with `out` (a path prefix) also `<out>.md/.json` and `<out>_*.png`,
    appending `<out>_discussion.md` if any, so a committed analysis survives regenerating."""
    from t5x_like.sweep import plots

    written = []
    for table_id, entry in report["tables"].items():
        base = os.path.join(sweep_dir, table_id)
        page = table_markdown(table_id, entry) + f"\n![{table_id}]({table_id}.png)\n"
        pathlib.Path(base + ".md").write_text(page, encoding="utf-8")
        write_json(base + ".json", {"scale": report["scale"], "tables": {table_id: entry}})
        plots.bar_chart(entry, base + ".png")
        written += [base + ".md", base + ".json", base + ".png"]
    plots.loss_curves(cells, sweep_dir, os.path.join(sweep_dir, "loss_curves.png"))
    combined = os.path.join(sweep_dir, f"t5_tables_{report['scale']}")
    pathlib.Path(combined + ".md").write_text(markdown(report), encoding="utf-8")
    write_json(combined + ".json", report)
    written += [os.path.join(sweep_dir, "loss_curves.png"), combined + ".md", combined + ".json"]
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        notes = pathlib.Path(out + "_discussion.md")
        discussion = notes.read_text(encoding="utf-8") if notes.exists() else ""
        page = markdown(report, image_prefix=os.path.basename(out) + "_", discussion=discussion)
        pathlib.Path(out + ".md").write_text(page, encoding="utf-8")
        write_json(out + ".json", report)
        for table_id, entry in report["tables"].items():
            plots.bar_chart(entry, f"{out}_{table_id}.png")
            written.append(f"{out}_{table_id}.png")
        plots.loss_curves(cells, sweep_dir, f"{out}_loss_curves.png")
        written += [out + ".md", out + ".json", f"{out}_loss_curves.png"]
    return written
