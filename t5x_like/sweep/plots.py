"""Matplotlib (Agg) figures: a bar chart per table (ours vs the paper) and all loss curves."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from t5x_like.sweep import paper  # noqa: E402
from t5x_like.sweep.grid import Cell  # noqa: E402
from t5x_like.sweep.runner import cell_dir, read_metrics  # noqa: E402


def bar_chart(entry: Mapping[str, Any], path: str) -> None:
    """Two panels: our suite average per row (± std over seeds) and the paper's GLUE."""
    rows = entry["rows"]
    ours = [r["ours_mean"] if r["ours_mean"] is not None else 0.0 for r in rows]
    theirs = [(r["paper"] or {}).get(paper.COMPARE_COLUMN, 0.0) for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 1.0 + 0.45 * len(rows)), sharey=True)
    ypos = list(range(len(rows)))
    left.barh(ypos, ours, xerr=[r["ours_std"] or 0.0 for r in rows], color="tab:blue")
    left.set_xlabel("ours: downstream suite average")
    if entry.get("baseline_average") is not None:
        left.axvline(entry["baseline_average"], color="black", linestyle="--", linewidth=1,
                     label="majority baseline")
        left.legend(fontsize=7, loc="lower right")
    right.barh(ypos, theirs, color="tab:gray")
    right.set_xlabel(f"paper: {paper.COMPARE_COLUMN}")
    left.set_yticks(ypos, [r["row"] for r in rows])
    left.invert_yaxis()
    positive = [v for v in theirs if v]
    if positive:
        right.set_xlim(min(positive) * 0.9, max(positive) * 1.05)
    left.set_xlim(0, max([*ours, entry.get("baseline_average") or 0.0, 1.0]) * 1.1)
    tau = entry.get("kendall_tau")
    fig.suptitle(entry["title"] + (f"  (Kendall τ = {tau:.2f})" if tau is not None else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def loss_curves(cells: Sequence[Cell], sweep_dir: str, path: str) -> None:
    """Pre-training loss vs step of every cell (from its pretrain/metrics.jsonl), one figure."""
    fig, axis = plt.subplots(figsize=(10, 6))
    for index, cell in enumerate(cells):
        records = read_metrics(os.path.join(cell_dir(sweep_dir, cell), "pretrain"))
        by_step = {r["step"]: r["loss"] for r in records
                   if r.get("split") == "train" and "loss" in r}
        if not by_step:
            continue
        steps = sorted(by_step)
        label = " / ".join(sorted({row for _, row in cell.rows})) + f" (seed {cell.seed})"
        style = ("-", "--", ":", "-.")[index // 10 % 4]  # the colour cycle repeats after 10
        axis.plot(steps, [by_step[s] for s in steps], label=label, linewidth=1.2, linestyle=style)
    axis.set_xlabel("pre-training step")
    axis.set_ylabel("training loss (per target token)")
    axis.set_title("Pre-training loss of every cell")
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
