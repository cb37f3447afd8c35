"""Static PTX instruction counts of the flash kernels, compiled deviceless for one GPU arch, and
the instructions per tile they imply for the T5 dQ kernel (predicted from the compiler, not timed).

    JAX_PLATFORMS=cpu .venv-aot/bin/python scripts/bench_flash_instructions.py [--arch sm_90]

writes `benchmarks/flash_instructions.{json,md}`. Per kernel (plain and with a T5 table): its
static PTX instruction count, its loop body (the largest basic block, ended by a label or a
branch: in the Triton kernels one k tile's work without the epilogue; the Hopper kernels' loops
also hold barrier waits, so there it is the largest piece between them) and, in
the dQ kernel with a table, one bucket-run threshold's masked row sum (the block the kernel
unrolls once per run). Per length: how many run thresholds fall strictly inside a dQ tile on
average (T5's 32 buckets, max_distance 128, `bucket_run_starts`), and loop body + that many masked
sums as the T5 dQ kernel's instructions per tile, against the plain dQ kernel's loop body. Not
counted: a near-diagonal tile's scalar checks of each threshold (a few instructions each).
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
import time
import types

LENGTHS = (512, 1024, 2048, 4096, 8192)
T5 = {"num_buckets": 32, "rel_max_distance": 128}


def kernel_counts(arch: str, head_dim: int, backend: str, variant: str) -> dict[str, dict]:
    """{flash kernel: total, loop (largest block), threshold (the repeated masked sum's block)}
    of one variant's forward + backward, compiled for `arch`."""
    from t5x_like.aot import gpu
    from t5x_like.kernels import flash

    fn, args = gpu.flash_grad_fn(variant, head_dim, gpu.target_devices(arch), backend=backend)
    with flash.compile_target("gpu", arch):
        ptx_of = gpu.kernel_ptx(fn, *args, target=arch)
    counts = {}
    for name, ptx in sorted(ptx_of.items()):
        if not name.startswith("t5x_like_flash"):
            continue
        sizes = [n for _, n in gpu.ptx_blocks(ptx, name)]
        repeated = collections.Counter(n for n in sizes if n >= 50).most_common(1)
        short = name.removeprefix("t5x_like_flash_").removesuffix("_mosaic_gpu_kernel")
        counts[short] = {"total": sum(sizes), "loop": max(sizes),
                         "threshold": repeated[0][0] if repeated and repeated[0][1] >= 8 else 0}
    return counts


def thresholds_inside(length: int, rows: int, cols: int, bidirectional: bool) -> tuple[int, float]:
    """(tiles, mean thresholds strictly inside a tile's offsets) of one (batch, head) of a
    T5-table dQ kernel at `length`, tiles `rows` x `cols`, causal tiles above the diagonal
    skipped."""
    import numpy as np

    from t5x_like.kernels import _flash_gpu_inputs

    cfg = types.SimpleNamespace(rel_bidirectional=bidirectional, num_buckets_pad=32, **T5)
    starts = np.asarray(_flash_gpu_inputs.bucket_run_starts(cfg))[1:T5["num_buckets"]]
    tiles = inside = 0
    for q0 in range(0, length, rows):
        for k0 in range(0, length, cols):
            if not bidirectional and k0 > q0 + rows - 1:
                continue
            rmin, rmax = k0 - q0 - (rows - 1), k0 + cols - 1 - q0
            tiles += 1
            inside += int(((starts > rmin) & (starts <= rmax)).sum())
    return tiles, inside / tiles


def dq_tile(arch: str, head_dim: int, backend: str) -> tuple[int, int]:
    """(rows, keys) of the dQ kernel's tile: the Triton backward's blocks for the arch, or one
    Hopper warpgroup's 64 rows by the dQ kernel's key tile (`_flash_mosaic_gpu._dq_cfg`)."""
    from t5x_like.kernels import flash

    if backend == "mosaic_gpu":
        return 64, 32 if head_dim > 64 else 64
    bq, bk, _, _ = flash.default_block_sizes(head_dim, "triton", flash.Target("gpu", arch), "bwd")
    return bq, bk


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--out", default="benchmarks/flash_instructions")
    args = p.parse_args()

    import jax

    from t5x_like.aot import gpu

    gpu.require_gpu_compiler()
    t0 = time.time()
    backends = ["triton"] + (["mosaic_gpu"] if args.arch == "sm_90" else [])
    kernels = {f"{b}/{v}": kernel_counts(args.arch, args.head_dim, b, v)
               for b in backends for v in ("full", "rel")}
    tiles = []
    for backend in backends:
        dq = [name for name in kernels[f"{backend}/rel"] if name.startswith("bwd_dq")][0]
        plain, t5 = kernels[f"{backend}/full"][dq], kernels[f"{backend}/rel"][dq]
        rows, cols = dq_tile(args.arch, args.head_dim, backend)
        for length in LENGTHS:
            for bidirectional in (True, False):
                n, inside = thresholds_inside(length, rows, cols, bidirectional)
                per_tile = t5["loop"] + t5["threshold"] * inside
                tiles.append({"backend": backend, "length": length,
                              "mask": "bidirectional" if bidirectional else "causal",
                              "tile": [rows, cols], "tiles": n,
                              "thresholds_inside": round(inside, 2),
                              "t5_per_tile": round(per_tile), "plain_per_tile": plain["loop"],
                              "t5_over_plain": round(per_tile / plain["loop"], 2)})
    result = {"arch": args.arch, "head_dim": args.head_dim, "jax": jax.__version__,
              "ptxas": gpu.ptxas_version(), "seconds": round(time.time() - t0),
              "kernels": kernels, "dq_per_tile": tiles}
    out = pathlib.Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


def markdown(r: dict) -> str:
    lines = [
        "# Flash kernels: static PTX instruction counts (deviceless compile)", "",
        f"{r['arch']}, head_dim {r['head_dim']}, jax {r['jax']}, {r['ptxas']}; "
        "`scripts/bench_flash_instructions.py`. Counts from the compiler, **not timings**: they "
        "predict issue work, what limits a kernel once its tensor-core work is overlapped. "
        "Loop body: the largest basic block (the Hopper kernels' loops also hold barrier waits, "
        "outside it). Not counted per tile: a near-diagonal tile's scalar check of each "
        "threshold (about 4 instructions each).", "",
        "| backend / variant | kernel | PTX instructions | loop body "
        "| one threshold's masked sum |",
        "|---|---|---|---|---|"]
    for key, kernels in r["kernels"].items():
        for name, k in kernels.items():
            lines.append(f"| {key} | {name} | {k['total']:,} | {k['loop']:,} | "
                         f"{k['threshold'] or '-'} |")
    lines += [
        "", "T5-table dQ kernel, instructions per tile (predicted: loop body + mean thresholds "
        "inside a tile x one masked sum; T5's 32 buckets, max_distance 128):", "",
        "| backend | length | mask | tile | tiles | thresholds inside | T5 per tile | "
        "plain per tile | T5 / plain |", "|---|---|---|---|---|---|---|---|---|"]
    for t in r["dq_per_tile"]:
        lines.append(f"| {t['backend']} | {t['length']} | {t['mask']} | {t['tile'][0]}x"
                     f"{t['tile'][1]} | {t['tiles']:,} | {t['thresholds_inside']} | "
                     f"{t['t5_per_tile']:,} | {t['plain_per_tile']:,} | {t['t5_over_plain']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
