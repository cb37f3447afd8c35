"""`python -m t5x_like.sweep`: run a paper-table sweep, print its cell commands, or report.

    python -m t5x_like.sweep --scale=tiny \\
        --sweep=gin/sweeps/t5_table2_architectures.gin,gin/sweeps/t5_table3_objectives.gin \\
        [--seeds=3] [--parallel=N] [--rows=a,b] [--sweep_dir=DIR] [--archive=FILE.jsonl.gz] \\
        [--print_commands | --report_only] [--out=benchmarks/t5_tables_tiny]
    python -m t5x_like.sweep --run_cell=DIR     # one cell (what --print_commands prints)
    python -m t5x_like.sweep --init_cell=DIR    # a control cell's fresh model (the runner runs it)

Cells run seed-major (every row's seed 0, then seed 1, ...; `runner.run_order`), so a sweep
spread over sessions and hosts splits each row's seeds across those hosts.

Exit status: 0 all cells done, 1 some cell failed (the others still ran; reports cover the
finished ones), 2 bad arguments, sweep/scale files or archive.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from t5x_like import flags
from t5x_like.sweep import grid, runner


def build_parser() -> argparse.ArgumentParser:
    """The flags."""
    p = argparse.ArgumentParser(prog="python -m t5x_like.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", help="comma-separated sweep gin files")
    p.add_argument("--scale", default="tiny", help="micro|tiny|small|paper or a scale .gin file")
    p.add_argument("--seeds", type=flags.positive_int, help="seeds per row (default: the scale's)")
    p.add_argument("--parallel", type=flags.positive_int, default=1, help="cells run at once")
    p.add_argument("--rows", help="comma-separated row names (or table:row)")
    p.add_argument("--sweep_dir", help="default: runs/sweeps/<scale>")
    p.add_argument("--archive", help="finished cells' records, one .jsonl.gz file (or a directory, "
                   "the earlier layout): restored first, each new cell added")
    p.add_argument("--print_commands", action="store_true",
                   help="print one shell command per unfinished cell instead of running")
    p.add_argument("--report_only", action="store_true", help="only regenerate the reports")
    p.add_argument("--out", help="also write the report to this path prefix "
                   "(<out>.md/.json/_*.png)")
    p.add_argument("--run_cell", help="run the one cell dir holding cell.json")
    p.add_argument("--init_cell", help="write a control cell's freshly initialised model into "
                   "DIR/pretrain (what the runner runs instead of pre-training it)")
    return p


def main(argv: Sequence[str]) -> int:
    """Entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.init_cell:
        try:
            runner.init_model(args.init_cell)
        except (OSError, ValueError, KeyError) as err:
            print(f"error: --init_cell={args.init_cell}: {err}", file=sys.stderr)
            return 1
        return 0
    if args.run_cell:
        try:
            runner.run_cell_dir(args.run_cell)
        except runner.CellFailed as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        return 0
    if not args.sweep:
        print("error: --sweep is required (or --run_cell)", file=sys.stderr)
        return 2
    try:
        specs = [grid.load_sweep(p) for p in args.sweep.split(",") if p]
        tables = [s.table for s in specs]
        if len(set(tables)) != len(tables):
            raise grid.SweepError(f"two sweep files name the same table: {tables}")
        scale = grid.load_scale(args.scale)
        cells = grid.expand(specs, scale, seeds=args.seeds, rows=args.rows and args.rows.split(","))
    except grid.SweepError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sweep_dir = os.path.abspath(args.sweep_dir or os.path.join("runs", "sweeps", scale.name))
    if args.archive:
        try:
            restored = runner.restore(cells, args.archive, sweep_dir)
        except (OSError, ValueError) as err:
            print(f"error: --archive={args.archive}: {err}", file=sys.stderr)
            return 2
        print(f"[sweep] {restored} finished cells restored from {args.archive}", flush=True)
    if args.print_commands:
        for line in runner.print_commands(cells, scale, sweep_dir):
            print(line)
        return 0
    failures: list[str] = []
    if not args.report_only:
        print(f"[sweep] {len(cells)} cells ({', '.join(tables)}, scale {scale.name}) "
              f"in {sweep_dir}", flush=True)
        start = time.time()
        failures = runner.run_cells(cells, scale, sweep_dir, parallel=args.parallel,
                                    archive=args.archive)
        print(f"[sweep] finished in {time.time() - start:.0f}s, {len(failures)} failed", flush=True)
    from t5x_like.sweep import report

    data = report.build(specs, cells, sweep_dir, scale.name)
    for path in report.write(data, cells, sweep_dir, out=args.out):
        print(f"[sweep] wrote {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
