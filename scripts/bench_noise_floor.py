"""Noise floor of the T5-table sweep: how far a row's scores move with the seeds and the test
sample, measured on two contrasting rows.

For each row (default: Table 3's BERT-style and Prefix LM at the `tiny` scale):
- `--seeds` sweep cells, pre-training seed s fine-tuned with seed s (what `--seeds` gives a
  sweep), under `--sweep_dir` (finished cells of a sweep of the same scale there are reused);
- the seed-0 cell fine-tuned again with fine-tuning seeds 1..seeds-1 (`<cell>/eval_ft<k>/`):
  the pre-trained model fixed, only the fine-tuning data order and dropout change;
- the test sample: the bootstrap std of each run's score over its test examples.
Per task and for the suite average it reports the std over the sweep's seeds, over fine-tuning
seeds alone, and from the test sample; the pre-training seed's share follows as
sqrt(var(sweep seeds) - var(fine-tuning seeds)). Then the rows' difference: mean, bootstrap CI
(`t5x_like.sweep.stats`, over seeds and shared test examples) and the seeds per row a 95% CI
excluding 0 would need. Resumable: rerunning skips what is finished.

    python scripts/bench_noise_floor.py [--scale tiny] [--seeds 5] [--parallel 2] \\
        [--rows 'table3:BERT-style,table3:Prefix LM'] [--sweep_dir runs/sweeps/tiny] \\
        [--out benchmarks/noise_floor_tiny]
Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from t5x_like.runtime import host  # noqa: E402
from t5x_like.sweep import grid, report, runner, stats  # noqa: E402

SWEEPS = {"table2": "gin/sweeps/t5_table2_architectures.gin",
          "table3": "gin/sweeps/t5_table3_objectives.gin"}


def _std(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) >= 2 else None


def test_sample_std(preds: dict[str, stats.TaskPredictions], tasks: list[str],
                    replicates: int = 2000) -> dict[str, float]:
    """Bootstrap std over test examples of one run: per task and of the suite average."""
    rng = np.random.default_rng(0)
    per_task = {t: stats.scores(preds[t], rng.integers(0, len(preds[t].targets),
                                                       (replicates, len(preds[t].targets))))
                for t in tasks}
    out = {t: float(v.std(ddof=1)) for t, v in per_task.items()}
    out["suite"] = float(np.mean([per_task[t] for t in tasks], axis=0).std(ddof=1))
    return out


TIME_PARTS = ("pretrain_steps", "pretrain_rest", "finetune", "scoring", "evaluate_rest", "total")


def time_breakdown(path: str) -> dict[str, float | None] | None:
    """Where one finished cell's wall time went (seconds): pre-training steps 2..N (from the
    trainer's logged step times) and the rest of that process (start-up, imports, data pipeline,
    compilation, step 1, eval, checkpoints); fine-tuning runs, test-set scoring, and the rest of
    the evaluate process (start-up, imports, loading predictors). None for a resumed cell."""
    with open(os.path.join(path, runner.RESULTS), encoding="utf-8") as f:
        results = json.load(f)
    times = [r["time"] for r in runner.read_metrics(os.path.join(path, "pretrain"))
             if r.get("split") == "train" and "time" in r]
    steps = max(times) - min(times) if len(times) >= 2 else None
    evaluation = results["evaluation"]
    finetune = sum(r.get("seconds") or 0.0 for r in evaluation["finetune"]["runs"])
    scoring = [t.get("seconds") for t in evaluation["tasks"].values()]
    scoring_total = None if None in scoring else float(sum(scoring))
    wall = results["seconds"]
    if (steps is not None and wall["pretrain"] < steps) or not all(
            r.get("trained") for r in evaluation["finetune"]["runs"]):
        return None  # resumed after an interruption: its wall times cover only the last part
    return {
        "pretrain_steps": steps,
        "pretrain_rest": None if steps is None else wall["pretrain"] - steps,
        "finetune": finetune,
        "scoring": scoring_total,
        "evaluate_rest": (None if scoring_total is None
                          else wall["evaluate"] - finetune - scoring_total),
        "total": wall["total"],
    }


def summarize(runs: list[dict], tasks: list[str]) -> dict:
    """Scores of several evaluations (results.json dicts): per task and suite, values/mean/std."""
    out = {}
    for key in [*tasks, "suite"]:
        values = [float(np.mean([r["tasks"][t]["score"] for t in tasks])) if key == "suite"
                  else float(r["tasks"][key]["score"]) for r in runs]
        out[key] = {"values": values, "mean": statistics.fmean(values), "std": _std(values)}
    return out


def run_all(rows: dict[str, list[grid.Cell]], scale: grid.ScaleSpec, sweep_dir: str,
            parallel: int, finetune_seeds: int) -> None:
    """Every row's cells, then the extra fine-tunes of each row's seed-0 cell, `parallel` at
    a time (finished ones skipped)."""
    cells = [c for cs in rows.values() for c in cs]
    failures = runner.run_cells(cells, scale, sweep_dir, parallel=parallel)
    if failures:
        raise SystemExit(f"cells failed: {failures}")
    jobs = [(runner.cell_dir(sweep_dir, min(cs, key=lambda c: c.seed)), k)
            for k in range(1, finetune_seeds) for cs in rows.values()]  # rows interleaved
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(lambda job: runner.run_evaluation(job[0], f"eval_ft{job[1]}",
                                                        finetune_seed=job[1]), jobs))


def measure_row(row: str, cells: list[grid.Cell], sweep_dir: str, finetune_seeds: int) -> dict:
    """A row's noise summary from its finished cells and extra fine-tunes."""
    cells = sorted(cells, key=lambda c: c.seed)
    paths = [runner.cell_dir(sweep_dir, c) for c in cells]
    sweep_runs = []
    for path in paths:
        with open(os.path.join(path, runner.RESULTS), encoding="utf-8") as f:
            sweep_runs.append(json.load(f)["evaluation"])
    base = paths[0]  # pre-training seed 0 (fine-tuned with seed 0 by the sweep)
    finetune_runs = [sweep_runs[0]]
    for k in range(1, finetune_seeds):
        finetune_runs.append(runner.run_evaluation(base, f"eval_ft{k}", finetune_seed=k))
    tasks = list(sweep_runs[0]["tasks"])
    sweep = summarize(sweep_runs, tasks)
    finetune = summarize(finetune_runs, tasks)
    pretrain_share = {}
    for key in sweep:
        a, b = sweep[key]["std"], finetune[key]["std"]
        pretrain_share[key] = (None if a is None or b is None
                               else float(np.sqrt(max(0.0, a * a - b * b))))
    preds = report.cell_predictions(base, tasks)
    breakdowns = [b for b in map(time_breakdown, paths) if b is not None]
    return {"row": row, "cells": [c.cell_id for c in cells], "tasks": tasks,
            "sweep_seeds": sweep, "finetune_seeds": finetune,
            "pretrain_seed_std": pretrain_share,
            "test_sample_std": test_sample_std(preds, tasks) if preds else None,
            "baseline": {t: sweep_runs[0]["tasks"][t]["baseline"] for t in tasks},
            "timed_cells": len(breakdowns),
            "seconds_per_cell": {k: (statistics.fmean(b[k] for b in breakdowns)
                                     if breakdowns and all(b[k] is not None for b in breakdowns)
                                     else None) for k in TIME_PARTS}}


def difference(rows: dict[str, dict], sweep_dir: str) -> dict:
    """First row minus second: point, bootstrap CI over seeds and shared test examples, and
    the seeds per row a CI excluding 0 would need (from the per-seed differences)."""
    (a, ra), (b, rb) = list(rows.items())[:2]
    tasks = ra["tasks"]
    preds = {name: [report.cell_predictions(os.path.join(sweep_dir, "cells", c), tasks)
                    for c in r["cells"]] for name, r in rows.items()}
    boot = stats.row_replicates(preds, tasks)
    diff = boot[a] - boot[b]
    per_seed = [x - y for x, y in zip(ra["sweep_seeds"]["suite"]["values"],
                                      rb["sweep_seeds"]["suite"]["values"], strict=False)]
    return {"rows": [a, b], "difference": ra["sweep_seeds"]["suite"]["mean"]
            - rb["sweep_seeds"]["suite"]["mean"], "ci": list(stats.percentile_ci(diff)),
            "seeds_needed": stats.seeds_needed(per_seed)}


def _f(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _at_a_time(parallel: int) -> str:
    return "cells run one at a time" if parallel == 1 else f"cells run {parallel} at a time"


def render(data: dict) -> str:
    """The Markdown report."""
    lines = [f"# Noise floor of the `{data['scale']}` sweep", "",
             f"Machine: {data['machine']}. {data['seeds']} seeds per row "
             f"({data.get('finetune_seeds', data['seeds'])} fine-tuning seeds), "
             f"{data['date']}; `python scripts/bench_noise_floor.py` "
             f"(`{' '.join(data['argv'])}`).", "",
             "Std of each score (0-100) over: the sweep's seeds (pre-training seed s, fine-tuned "
             "with seed s), fine-tuning seeds alone (pre-training seed 0), one run's test sample "
             "(bootstrap over test examples); the pre-training seed's share is "
             "sqrt(var(sweep) − var(fine-tuning)).", ""]
    if data.get("note"):
        lines += [f"Note: {data['note']}", ""]
    for r in data["rows"].values():
        keys = [*r["tasks"], "suite"]
        lines += [f"## {r['row']}", "",
                  "| | " + " | ".join(k.removeprefix("downstream_") for k in keys) + " |",
                  "|---|" + "---|" * len(keys)]
        baseline = {**r["baseline"], "suite": statistics.fmean(r["baseline"].values())}
        table = [("mean (sweep seeds)", {k: r["sweep_seeds"][k]["mean"] for k in keys}),
                 ("majority baseline", baseline),
                 ("std, sweep seeds", {k: r["sweep_seeds"][k]["std"] for k in keys}),
                 ("std, fine-tuning seeds", {k: r["finetune_seeds"][k]["std"] for k in keys}),
                 ("std, pre-training seed (derived)", r["pretrain_seed_std"]),
                 ("std, test sample", r["test_sample_std"])]
        lines += [f"| {label} | " + " | ".join(_f(values.get(k)) for k in keys) + " |"
                  for label, values in table if values]
        lines += ["", "Suite average per sweep seed: "
                  + ", ".join(_f(v) for v in r["sweep_seeds"]["suite"]["values"])
                  + "; per fine-tuning seed: "
                  + ", ".join(_f(v) for v in r["finetune_seeds"]["suite"]["values"]) + ".", ""]
    lines += ["## Where a cell's time goes", "",
              f"Mean seconds per cell (wall, {_at_a_time(data.get('parallel', 1))}): "
              "pre-training steps 2..N; the rest of the trainer process (start-up, imports, data "
              "pipeline, compilation, step 1, eval, checkpoints); the fine-tuning runs; scoring "
              "the test sets; the rest of the evaluate process (start-up, imports, loading).", "",
              "| row | pre-train steps | pre-train rest | fine-tuning | scoring | evaluate rest "
              "| total | cells timed (not resumed) |", "|---|---|---|---|---|---|---|---|"]
    for r in data["rows"].values():
        t = r["seconds_per_cell"]
        lines.append(f"| {r['row']} | " + " | ".join(
            "—" if t.get(k) is None else f"{t[k]:.0f}"
            for k in TIME_PARTS) + f" | {r['timed_cells']} |")
    lines.append("")
    d = data.get("difference")
    if d:
        lines += ["## The rows' difference", "",
                  f"{d['rows'][0]} − {d['rows'][1]}: {d['difference']:+.2f} suite points, "
                  f"95% CI [{d['ci'][0]:+.2f}, {d['ci'][1]:+.2f}] over {data['seeds']} seeds; "
                  f"seeds per row for a CI that excludes 0: {d['seeds_needed'] or '—'}.", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", default="tiny")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--rows", default="table3:BERT-style,table3:Prefix LM")
    p.add_argument("--sweep_dir", default=None, help="default: runs/sweeps/<scale>")
    p.add_argument("--finetune_seeds", type=int, default=None,
                   help="fine-tuning seeds of the seed-0 cell (default: --seeds)")
    p.add_argument("--parallel", type=int, default=1, help="cells / fine-tunes run at once")
    p.add_argument("--out", default=None, help="default: benchmarks/noise_floor_<scale>")
    p.add_argument("--render", action="store_true", help="only rewrite <out>.md from <out>.json")
    p.add_argument("--note", default="", help="a remark on this run, printed in the report")
    args = p.parse_args(argv)
    out = args.out or str(ROOT / "benchmarks" / f"noise_floor_{args.scale}")
    if args.render:
        with open(out + ".json", encoding="utf-8") as f:
            data = json.load(f)
        data["note"] = args.note or data.get("note", "")
        runner.write_json(out + ".json", data)
        Path(out + ".md").write_text(render(data), encoding="utf-8")
        return 0
    finetune_seeds = args.finetune_seeds or args.seeds
    if min(args.seeds, finetune_seeds) < 2:
        raise SystemExit("--seeds and --finetune_seeds must be >= 2 (a std needs two values)")
    scale = grid.load_scale(args.scale)
    sweep_dir = os.path.abspath(args.sweep_dir or os.path.join("runs", "sweeps", scale.name))
    wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
    cells = {}
    for name in wanted:
        table, row = name.split(":", 1)
        cells[name] = grid.expand([grid.load_sweep(SWEEPS[table])], scale, seeds=args.seeds,
                                  rows=[row])
    run_all(cells, scale, sweep_dir, args.parallel, finetune_seeds)
    rows = {name: measure_row(name, cs, sweep_dir, finetune_seeds) for name, cs in cells.items()}
    data = {"machine": host.describe(), "scale": scale.name, "seeds": args.seeds,
            "finetune_seeds": finetune_seeds, "parallel": args.parallel,
            "date": time.strftime("%Y-%m-%d"), "argv": argv, "note": args.note, "rows": rows,
            "difference": difference(rows, sweep_dir) if len(rows) >= 2 else None}
    os.makedirs(os.path.dirname(out), exist_ok=True)
    runner.write_json(out + ".json", data)
    Path(out + ".md").write_text(render(data), encoding="utf-8")
    print(f"wrote {out}.json, {out}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
