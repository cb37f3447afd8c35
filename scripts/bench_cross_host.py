"""Cross-host reproducibility of sweep cells: rerun archived cells on this machine and compare.

XLA:CPU compiles for the host's instruction set, so the same cell (same commit, gin, seed)
may round differently on another CPU. A sweep spread over sessions can land on different VMs;
this measures whether that matters. For each `--cells` id finished in `--archive` (records
of another host; an archive file is unpacked into `<sweep_dir>/archive/` first), the cell is
rerun here under `--sweep_dir` from its archived `cell.json` (resumable: a finished rerun is
skipped), then compared:
- pre-training: every logged train step's loss, bitwise and max |difference|, the first step
  whose loss or gradient norm differs (rounding shows in the gradient before the loss); final
  and eval loss;
- per task: score on each host, its difference, and the fraction of test examples whose
  predicted label agrees (rank classification: the most likely label);
- the suite average's difference, next to the row's seed-to-seed std on the archived host
  (the suite scores of the same row's other seeds in `--archive`, same configuration but the
  seed).

    python scripts/bench_cross_host.py --cells ID[,ID...]
        [--archive benchmarks/sweep_cells/tiny.jsonl.gz] [--sweep_dir runs/cross_host]
        [--parallel 2] [--out benchmarks/cross_host_tiny]
Writes <out>.json and <out>.md (linking <out>_discussion.md when there is one).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import time
from typing import Any

from t5x_like.runtime import host  # noqa: E402
from t5x_like.sweep import runner  # noqa: E402


def _read_json(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _predictions(cell_path: str, task: str) -> list[str]:
    path = os.path.join(cell_path, "eval", "predictions", f"{task}.jsonl")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["output"] for line in f if line.strip()]


def _train_records(cell_path: str) -> dict[int, dict[str, Any]]:
    return {r["step"]: r for r in runner.read_metrics(os.path.join(cell_path, "pretrain"))
            if r.get("split") == "train" and "loss" in r}


def _same_config_but_seed(x: dict[str, Any], y: dict[str, Any]) -> bool:
    def strip(spec: dict[str, Any]) -> dict[str, Any]:
        return {**{k: v for k, v in spec.items() if k not in ("cell_id", "seed", "config_hash")},
                "bindings": [b for b in spec["bindings"] if not b.startswith("train.seed")]}
    return strip(x) == strip(y)


def archive_dir(archive: str, sweep_dir: str) -> str:
    """The archive as a directory of `cells/<cell_id>/` dirs: an archive file is unpacked into
    `<sweep_dir>/archive/` (a directory archive, the earlier layout, is used as it is)."""
    if not runner.is_archive_file(archive):
        return archive
    directory = os.path.join(sweep_dir, "archive")
    runner.unpack(archive, directory)
    return directory


def seed_std(archive: str, cell_id: str) -> tuple[float | None, int]:
    """Std of the suite score over the archived cells (in archive dir `archive`) that differ
    from `cell_id` only in the seed (itself included), and how many there are."""
    cells = os.path.join(archive, "cells")
    spec = _read_json(os.path.join(cells, cell_id, runner.CELL_SPEC))
    prefix = cell_id.rsplit("__", 2)[0] + "__s"  # <arch>__<objective>__s<seed>__<hash>
    scores = [_read_json(os.path.join(cells, c, runner.RESULTS))["suite_average"]
              for c in sorted(os.listdir(cells)) if c.startswith(prefix)
              and runner.is_done(os.path.join(cells, c))
              and _same_config_but_seed(spec, _read_json(os.path.join(cells, c, runner.CELL_SPEC)))]
    return (statistics.stdev(scores) if len(scores) >= 2 else None), len(scores)


def compare_cells(a: str, b: str) -> dict[str, Any]:
    """Compare two finished cell dirs of the same cell id (`a`: the archived host, `b`: here)."""
    ra, rb = (_read_json(os.path.join(d, runner.RESULTS)) for d in (a, b))
    if ra["cell_id"] != rb["cell_id"]:
        raise ValueError(f"different cells: {ra['cell_id']} vs {rb['cell_id']}")
    la, lb = _train_records(a), _train_records(b)
    steps = sorted(set(la) & set(lb))
    if not steps:
        raise ValueError(f"{ra['cell_id']}: no pre-training step logged on both hosts")
    diffs = [abs(la[s]["loss"] - lb[s]["loss"]) for s in steps]
    grads = [la[s].get("grad_norm") != lb[s].get("grad_norm") for s in steps]
    tasks = {}
    for task in ra["tasks"]:
        pa, pb = _predictions(a, task), _predictions(b, task)
        if len(pa) != len(pb):
            raise ValueError(f"{task}: {len(pa)} vs {len(pb)} test predictions")
        tasks[task] = {"score": [ra["tasks"][task], rb["tasks"][task]],
                       "difference": rb["tasks"][task] - ra["tasks"][task],
                       "agreement": sum(x == y for x, y in zip(pa, pb, strict=True)) / len(pa)}
    return {
        "cell_id": ra["cell_id"], "hosts": [ra.get("host"), rb.get("host")],
        "code": [ra.get("code"), rb.get("code")],
        "pretrain": {
            "steps_compared": len(steps),
            "identical_steps": sum(d == 0.0 for d in diffs),
            "first_different_step": next((s for s, d in zip(steps, diffs, strict=True) if d), None),
            "first_different_grad_norm_step": next(
                (s for s, g in zip(steps, grads, strict=True) if g), None),
            "max_abs_loss_difference": max(diffs),
            "final_loss": [ra["pretrain"]["final_loss"], rb["pretrain"]["final_loss"]],
            "eval_loss": [ra["pretrain"]["eval_loss"], rb["pretrain"]["eval_loss"]],
        },
        "tasks": tasks,
        "suite_average": [ra["suite_average"], rb["suite_average"]],
        "suite_difference": rb["suite_average"] - ra["suite_average"],
        "cpu_seconds": [ra["cpu_seconds"]["total"], rb["cpu_seconds"]["total"]],
    }


def rerun(cell_ids: list[str], archive: str, sweep_dir: str, parallel: int) -> list[str]:
    """Rerun each cell of archive dir `archive` here (from its cell.json); returns the new
    cell dirs."""
    paths = []
    for cell_id in cell_ids:
        src = os.path.join(archive, "cells", cell_id)
        if not runner.is_done(src):
            raise SystemExit(f"error: {cell_id} is not a finished cell in {archive}")
        dst = os.path.join(sweep_dir, "cells", cell_id)
        os.makedirs(dst, exist_ok=True)
        if not os.path.exists(os.path.join(dst, runner.CELL_SPEC)):
            shutil.copyfile(*(os.path.join(d, runner.CELL_SPEC) for d in (src, dst)))
        paths.append(dst)
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(lambda p: runner.run_cell_dir(p, runner._locked_print), paths))
    return paths


def markdown(report: dict[str, Any], discussion: str | None = None) -> str:
    rows = report["cells"]
    lines = ["# Cross-host reproducibility of sweep cells", "",
             f"Archived host (A): {rows[0]['hosts'][0]}. This host (B): {report['host']}, "
             f"{report['date']}.", "",
             "Each cell was rerun on B from A's `cell.json` (same gin, seed and data recipe; the "
             "corpus and vocabulary rebuilt on B). Written by `scripts/bench_cross_host.py`."
             + (f" What it means: [`{discussion}`]({discussion})." if discussion else ""), "",
             "## Pre-training", "",
             "| cell | code A / B | losses identical | first step differing: loss / grad norm "
             "| max abs loss diff | final loss A / B | eval loss A / B |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["pretrain"]
        lines.append(
            f"| {r['cell_id']} | {r['code'][0]} / {r['code'][1]} "
            f"| {p['identical_steps']}/{p['steps_compared']} | {p['first_different_step'] or '—'}"
            f" / {p['first_different_grad_norm_step'] or '—'} "
            f"| {p['max_abs_loss_difference']:.2e} "
            f"| {p['final_loss'][0]:.6f} / {p['final_loss'][1]:.6f} "
            f"| {p['eval_loss'][0]:.6f} / {p['eval_loss'][1]:.6f} |")
    tasks = list(rows[0]["tasks"])
    lines += ["", "## Downstream", "",
              "Score A / B (difference B - A; share of test predictions that agree).", "",
              "| cell | " + " | ".join(tasks) + " | suite A / B (diff) |",
              "|---|" + "---|" * (len(tasks) + 1)]
    for r in rows:
        cells = [f"{t['score'][0]:.2f} / {t['score'][1]:.2f} ({t['difference']:+.2f}; "
                 f"{100 * t['agreement']:.1f}%)" for t in (r["tasks"][k] for k in tasks)]
        lines.append(f"| {r['cell_id']} | " + " | ".join(cells)
                     + f" | {r['suite_average'][0]:.2f} / {r['suite_average'][1]:.2f} "
                       f"({r['suite_difference']:+.2f}) |")
    lines += ["", "Seed-to-seed std of the suite score on host A (the row's archived seeds):", ""]
    lines += [f"- {r['cell_id']}: {r['seed_std']:.2f} over {r['seeds']} seeds; the cross-host "
              f"difference is {abs(r['suite_difference']) / r['seed_std']:.2f} of it"
              if r["seed_std"] else f"- {r['cell_id']}: fewer than 2 archived seeds"
              for r in rows]
    s = report["summary"]
    lines += ["", "## Summary", "",
              f"- cells: {len(rows)}; bitwise-identical pre-training: {s['identical_pretraining']}"
              f" of {len(rows)}",
              f"- |suite difference|: mean {s['mean_abs_suite_difference']:.2f}, "
              f"max {s['max_abs_suite_difference']:.2f} suite points",
              f"- prediction agreement: {100 * s['min_agreement']:.1f}% at least, "
              f"{100 * s['mean_agreement']:.1f}% on average"]
    return "\n".join(lines) + "\n"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    suite = [abs(r["suite_difference"]) for r in rows]
    agreement = [t["agreement"] for r in rows for t in r["tasks"].values()]
    return {
        "identical_pretraining": sum(r["pretrain"]["identical_steps"]
                                     == r["pretrain"]["steps_compared"] for r in rows),
        "mean_abs_suite_difference": statistics.fmean(suite),
        "max_abs_suite_difference": max(suite),
        "min_agreement": min(agreement), "mean_agreement": statistics.fmean(agreement)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", required=True, help="comma-separated archived cell ids")
    p.add_argument("--archive", default="benchmarks/sweep_cells/tiny.jsonl.gz",
                   help="the sweep's archive file (or a directory of cells/<cell_id>/ dirs)")
    p.add_argument("--sweep_dir", default="runs/cross_host")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--out", default="benchmarks/cross_host_tiny")
    args = p.parse_args(argv)
    cell_ids = [c for c in args.cells.split(",") if c]
    archive = archive_dir(args.archive, args.sweep_dir)
    paths = rerun(cell_ids, archive, args.sweep_dir, args.parallel)
    rows = []
    for cell_id, path in zip(cell_ids, paths, strict=True):
        std, n = seed_std(archive, cell_id)
        rows.append({**compare_cells(os.path.join(archive, "cells", cell_id), path),
                     "seed_std": std, "seeds": n})
    report = {"host": host.describe(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
              "cells": rows, "summary": summarize(rows)}
    runner.write_json(f"{args.out}.json", report)
    discussion = f"{args.out}_discussion.md"
    text = markdown(report, os.path.basename(discussion) if os.path.exists(discussion) else None)
    with open(f"{args.out}.md", "w", encoding="utf-8") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
