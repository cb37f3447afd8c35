"""Does the sweep's fine-tuning measure the pre-training, or its own failure to converge?

Re-evaluates finished sweep cells' pre-trained checkpoints with other fine-tuning lengths and
compares, per task, the scores and the fine-tunes that collapsed to one label
(`t5x_like.sweep.stats.collapsed`); or evaluates them on a suite task their scale left out
(`--tasks downstream_word_order`). The cell's own evaluation (`<cell>/eval`) is the entry for
the scale's fine-tuning length and tasks; every other length N (or task) runs
`python -m t5x_like.evaluate` into `<cell>/eval_steps<N>[_<tasks>]` (one of all the scale's
tasks serves any subset) with `--finetune_steps=N`, and a scale binding
`<schedule>.total_steps = ...` rebound to N (the schedule stretched to the new length). Nothing
else changes: same checkpoint, fine-tuning seed, lr, batch and scoring. Resumable: a finished
evaluation is reused.

    python scripts/bench_finetune_steps.py --sweep_dir runs/sweeps/tiny --steps 80,240 \\
        [--cells 'encdec_2x2__*'] [--tasks downstream_spam] [--parallel 2] \\
        [--compare 'table2: Encoder-decoder | Denoising::table2: Encoder-decoder | LM'] \\
        --out benchmarks/finetune_steps_tiny

Writes <out>.json and <out>.md: per task and length, the mean score, collapsed fine-tunes and
the paired difference to the shortest length with a bootstrap CI over cells; per sweep row and
per cell, every score. `<out>_discussion.md`, when it exists, is appended to `<out>.md`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from t5x_like.data import downstream  # noqa: E402
from t5x_like.runtime import host  # noqa: E402
from t5x_like.sweep import report, runner, stats  # noqa: E402

TOTAL_STEPS = re.compile(r"^\s*([\w.]+)\.total_steps\s*=")


def _spec(path: str) -> dict:
    with open(os.path.join(path, runner.CELL_SPEC), encoding="utf-8") as f:
        return json.load(f)


def scale_steps(spec: dict) -> int:
    """The fine-tuning length a cell's scale gives (its last `--finetune_steps=` flag)."""
    flags = [f for f in spec["scale"]["evaluate_flags"] if f.startswith("--finetune_steps=")]
    if not flags:
        raise SystemExit(f"cell {spec['cell_id']}: its scale sets no --finetune_steps")
    return int(flags[-1].split("=", 1)[1])


def scale_tasks(spec: dict) -> list[str]:
    """The tasks a cell's scale evaluates (its last `--tasks=` flag)."""
    flags = [f for f in spec["scale"]["evaluate_flags"] if f.startswith("--tasks=")]
    if not flags:
        raise SystemExit(f"cell {spec['cell_id']}: its scale sets no --tasks")
    return flags[-1].split("=", 1)[1].split(",")


def overrides(spec: dict, steps: int, tasks: list[str]) -> list[str]:
    """The evaluate flags and bindings that change only the fine-tuning length (and tasks)."""
    schedules = {m.group(1) for b in spec["scale"]["evaluate_bindings"]
                 if (m := TOTAL_STEPS.match(b))}
    return [f"--finetune_steps={steps}", f"--tasks={','.join(tasks)}",
            *[f"{s}.total_steps = {steps}" for s in sorted(schedules)]]


def out_name(steps: int, tasks: list[str], all_tasks: list[str]) -> str:
    suffix = "" if tasks == all_tasks else "_" + "+".join(
        t.removeprefix("downstream_") for t in tasks)
    return f"eval_steps{steps}{suffix}"


def evaluate(path: str, steps: int, tasks: list[str]) -> tuple[str, dict]:
    """(evaluation dir name, its results.json) of one cell at one length."""
    spec = _spec(path)
    if steps == scale_steps(spec) and set(tasks) <= set(scale_tasks(spec)):
        with open(os.path.join(path, runner.RESULTS), encoding="utf-8") as f:
            return "eval", json.load(f)["evaluation"]
    name = out_name(steps, tasks, scale_tasks(spec))
    every = out_name(steps, scale_tasks(spec), scale_tasks(spec))
    if os.path.exists(os.path.join(path, every, runner.RESULTS)):
        name = every  # an evaluation of all the scale's tasks at this length covers `tasks`
    return name, runner.run_evaluation(path, name, extra=overrides(spec, steps, tasks))


def predictions(path: str, name: str, tasks: list[str]) -> dict[str, stats.TaskPredictions]:
    """One evaluation's test predictions, coded (`report.cell_predictions` of `path/name`)."""
    preds = report.cell_predictions(path, tasks, eval_dir=name)
    if preds is None:
        raise SystemExit(f"{path}/{name}: test predictions missing")
    return preds


def measure(paths: list[str], steps: list[int], tasks: list[str], parallel: int,
            compare: tuple[str, str] | None = None) -> dict:
    """Run what is missing, then per cell and length: scores, collapse and top-label share."""
    jobs = [(p, n) for n in steps for p in paths]
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        done = list(pool.map(lambda job: evaluate(job[0], job[1], tasks), jobs))
    cells: dict[str, dict] = {}
    preds: dict[tuple[str, int], dict[str, stats.TaskPredictions]] = {}
    for (path, n), (name, result) in zip(jobs, done, strict=True):
        cell = cells.setdefault(os.path.basename(path), {"rows": _spec(path)["rows"]})
        preds[path, n] = predictions(path, name, tasks)
        cell[str(n)] = {"dir": name, "tasks": {t: {
            "score": result["tasks"][t]["score"],
            "baseline": result["tasks"][t]["baseline"],
            "top_output_share": stats.top_output_share(preds[path, n][t]),
            "collapsed": stats.collapsed(preds[path, n][t])} for t in tasks}}
    return {"cells": cells, "summary": summarize(paths, steps, tasks, preds),
            "rows": by_row(cells, steps, tasks),
            "difference": compare and row_difference(paths, steps, tasks, preds, compare)}


def row_difference(paths: list[str], steps: list[int], tasks: list[str],
                   preds: dict[tuple[str, int], dict[str, stats.TaskPredictions]],
                   compare: tuple[str, str]) -> dict:
    """First row minus second ('table: row' names), at each length: the difference of the
    rows' mean suite scores with a bootstrap CI over their cells (seeds) and shared test
    examples (`stats.row_replicates`, as the sweep report's claims)."""
    members = {name: [p for p in paths if name in {f"{t}: {r}" for t, r in _spec(p)["rows"]}]
               for name in compare}
    for name, found in members.items():
        if not found:
            raise SystemExit(f"--compare: no selected cell is in row {name!r}")
    out = {"rows": list(compare)}
    for n in steps:
        rows = {name: [preds[p, n] for p in found] for name, found in members.items()}
        boot = stats.row_replicates(rows, tasks)
        points = stats.point_scores(rows, tasks)
        a, b = compare
        out[str(n)] = {"difference": statistics.fmean(points[a]) - statistics.fmean(points[b]),
                       "ci": list(stats.percentile_ci(boot[a] - boot[b]))}
    return out


def by_row(cells: dict[str, dict], steps: list[int], tasks: list[str]) -> dict[str, dict]:
    """'table: row' -> per length, the mean over its cells of the mean score over `tasks`
    and the cells with a collapsed task (a cell in several rows counts in each)."""
    out: dict[str, dict] = {}
    for cell in cells.values():
        for table, row in cell["rows"]:
            entry = out.setdefault(f"{table}: {row}", {"cells": 0})
            entry["cells"] += 1
            for n in map(str, steps):
                result = cell[n]["tasks"]
                e = entry.setdefault(n, {"sum": 0.0, "collapsed": 0})
                e["sum"] += statistics.fmean(result[t]["score"] for t in tasks)
                e["collapsed"] += any(result[t]["collapsed"] for t in tasks)
    for entry in out.values():
        for n in map(str, steps):
            entry[n]["mean"] = entry[n].pop("sum") / entry["cells"]
    return dict(sorted(out.items()))


def summarize(paths: list[str], steps: list[int], tasks: list[str],
              preds: dict[tuple[str, int], dict[str, stats.TaskPredictions]]) -> dict:
    """Per task (and the mean over tasks, 'suite'): for each length, the mean score and the
    collapsed fine-tunes; against the shortest length, the paired difference with a bootstrap
    CI over cells and shared test examples (`stats.row_replicates`)."""
    everything = {t: np.arange(len(preds[paths[0], steps[0]][t].targets))[None] for t in tasks}
    out: dict[str, dict] = {}
    for key in [*tasks, "suite"]:
        chosen = tasks if key == "suite" else [key]
        runs = {n: [{t: preds[p, n][t] for t in chosen} for p in paths] for n in steps}
        boot = stats.row_replicates({str(n): runs[n] for n in steps}, chosen)
        entry = {}
        for n in steps:
            values = [float(np.mean([stats.scores(r[t], everything[t])[0] for t in chosen]))
                      for r in runs[n]]
            entry[str(n)] = {
                "mean": statistics.fmean(values), "values": values,
                "collapsed": sum(any(stats.collapsed(r[t]) for t in chosen) for r in runs[n])}
            if n != steps[0]:
                entry[str(n)]["difference"] = entry[str(n)]["mean"] - entry[str(steps[0])]["mean"]
                entry[str(n)]["ci"] = list(stats.percentile_ci(boot[str(n)] - boot[str(steps[0])]))
        if key != "suite":
            entry["best_constant"] = stats.best_constant_score(preds[paths[0], steps[0]][key])
        out[key] = entry
    return out


def _f(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def render(data: dict) -> str:
    """The Markdown report."""
    steps, tasks = data["steps"], data["tasks"]
    n = len(data["cells"])
    argv = [a for i, a in enumerate(data["argv"]) if not a.startswith("--note")
            and not (i and data["argv"][i - 1] == "--note")]  # the note is printed below
    what = ("Fine-tuning length" if len(steps) > 1
            else ", ".join(t.removeprefix("downstream_") for t in data["tasks"]))
    lines = [f"# {what} on the `{data['scale']}` sweep's checkpoints", "",
             f"Machine: {data['machine']}. {n} cells from `{data['sweep_dir']}`, {data['date']}; "
             f"`python scripts/bench_finetune_steps.py {' '.join(argv)}`.", "",
             "Each cell's pre-trained checkpoint fine-tuned per task for "
             f"{', '.join(map(str, steps))} steps (the schedule stretched to the length; seed, "
             "lr, batch and scoring "
             "unchanged). Collapsed: one output for ≥ "
             f"{stats.COLLAPSED_SHARE:.0%} of the test examples (a constant predictor)."
             + (f" Δ: paired against {steps[0]} steps, 95% bootstrap CI over cells and test "
                "examples." if len(steps) > 1 else ""), ""]
    if data.get("note"):
        lines += [f"Note: {data['note']}", ""]
    head = ["Task", "best constant"]
    for s in steps:
        head += [f"{s} steps: mean", "collapsed"] + (["Δ [95% CI]"] if s != steps[0] else [])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in [*tasks, "suite"] if len(tasks) > 1 else tasks:
        entry = data["summary"][key]
        cells = [key.removeprefix("downstream_") if key != "suite" else "**mean of tasks**",
                 _f(entry.get("best_constant"))]
        for s in map(str, steps):
            e = entry[s]
            cells += [_f(e["mean"]), f"{e['collapsed']}/{n}"]
            if "difference" in e:
                cells.append(f"{e['difference']:+.1f} [{e['ci'][0]:+.1f}, {e['ci'][1]:+.1f}]")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Per sweep row (mean over its cells of the mean over tasks; cells with a "
              "collapsed task):", "",
              "| Row | cells | " + " | ".join(f"{s} steps | collapsed" for s in steps) + " |",
              "|---|---|" + "---|---|" * len(steps)]
    for row, entry in data["rows"].items():
        lines.append(f"| {row.replace(' | ', ' / ')} | {entry['cells']} | " + " | ".join(
            f"{_f(entry[str(s)]['mean'])} | {entry[str(s)]['collapsed']}" for s in steps) + " |")
    d = data.get("difference")
    if d:
        a, b = (r.replace(" | ", " / ") for r in d["rows"])
        lines += ["", f"{a} − {b} (mean over tasks; 95% bootstrap CI over seeds and test "
                  "examples): " + "; ".join(
                      f"{s} steps {d[str(s)]['difference']:+.1f} [{d[str(s)]['ci'][0]:+.1f}, "
                      f"{d[str(s)]['ci'][1]:+.1f}]" for s in steps) + "."]
    lines += ["", "Per cell (score; * = collapsed):", "",
              "| Cell | " + " | ".join(f"{t.removeprefix('downstream_')} @{s}"
                                      for t in tasks for s in steps) + " |",
              "|---|" + "---|" * (len(tasks) * len(steps))]
    for cell_id, cell in data["cells"].items():
        lines.append(f"| {cell_id} | " + " | ".join(
            _f(cell[str(s)]["tasks"][t]["score"]) + ("*" if cell[str(s)]["tasks"][t]["collapsed"]
                                                     else "")
            for t in tasks for s in steps) + " |")
    return "\n".join([*lines, ""])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep_dir", required=True)
    p.add_argument("--steps", required=True, help="comma-separated fine-tuning lengths")
    p.add_argument("--cells", default="*", help="comma-separated cell-id globs")
    p.add_argument("--tasks", default=None,
                   help="default: the scale's tasks; any suite task (one the scale does not "
                        "evaluate is fine-tuned anew even at the scale's length)")
    p.add_argument("--parallel", type=int, default=1, help="evaluations run at once")
    p.add_argument("--out", required=True, help="path prefix of <out>.json / <out>.md")
    p.add_argument("--compare", default=None,
                   help="'TABLE: ROW::TABLE: ROW': that difference of rows, with its CI")
    p.add_argument("--note", default="", help="a remark on this run, printed in the report")
    args = p.parse_args(argv)
    try:
        steps = sorted({int(s) for s in args.steps.split(",") if s.strip()})
    except ValueError:
        steps = []
    if not steps or steps[0] < 1:
        raise SystemExit(f"--steps must be positive integers, got {args.steps!r}")
    cells_dir = os.path.join(args.sweep_dir, "cells")
    if not os.path.isdir(cells_dir):
        raise SystemExit(f"no sweep cells in {cells_dir}")
    globs = [g.strip() for g in args.cells.split(",") if g.strip()]
    paths = [os.path.join(cells_dir, c) for c in sorted(os.listdir(cells_dir))
             if any(fnmatch.fnmatch(c, g) for g in globs)
             and runner.is_done(os.path.join(cells_dir, c))]
    if not paths:
        raise SystemExit(f"no finished cell in {cells_dir} matches {args.cells!r}")
    if args.compare and len(args.compare.split("::")) != 2:
        raise SystemExit(f"--compare wants 'TABLE: ROW::TABLE: ROW', got {args.compare!r}")
    first = _spec(paths[0])
    tasks = args.tasks.split(",") if args.tasks else scale_tasks(first)
    unknown = set(tasks) - set(downstream.SUITE)
    if unknown:
        raise SystemExit(f"--tasks: {sorted(unknown)} not in the downstream suite "
                         f"{list(downstream.SUITE)}")
    data = {"machine": host.describe(), "scale": first["scale"]["name"],
            "sweep_dir": args.sweep_dir, "steps": steps, "tasks": tasks,
            "date": time.strftime("%Y-%m-%d"), "argv": argv, "note": args.note,
            **measure(paths, steps, tasks, args.parallel,
                      tuple(args.compare.split("::")) if args.compare else None)}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    runner.write_json(args.out + ".json", data)
    discussion = Path(args.out + "_discussion.md")  # the analysis survives regenerating
    text = render(data) + ("\n" + discussion.read_text(encoding="utf-8")
                           if discussion.exists() else "")
    Path(args.out + ".md").write_text(text, encoding="utf-8")
    print(f"wrote {args.out}.json, {args.out}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
