"""Static PTX instruction counts of the flash kernels, compiled deviceless for one GPU arch, and
the instructions per tile they imply for the T5 dQ kernels (predicted from the compiler, not timed).

    JAX_PLATFORMS=cpu .venv-aot/bin/python scripts/bench_flash_instructions.py [--arch sm_90]

writes `benchmarks/flash_instructions.{json,md}`. Per kernel (plain and with a T5 table): its
static PTX instruction count, its loop body (the largest basic block, ended by a label or a
branch: in the Triton kernels one k tile's work without the epilogue; the Hopper kernels' loops
also hold barrier waits, so there it is the largest piece between them) and its whole loop (a
label to the last branch back to it, blocks it may branch over included). Per length, a T5 dQ
kernel's instructions per tile against the plain dQ kernel's whole loop: its loop on each path,
weighted by the share of tiles in their q block's window (`gpu_inputs.near_window`, T5's 32
buckets, max_distance 128): such a tile stores its dS (2 bytes an element to HBM), another adds
its row sums (the loop's smaller blocks holding a global store / `shfl.sync`; one runs per tile).
Per kernel with packed segment ids: the loop's segment test when it sits in a block of its own
(`gpu.mask_branches`: the kernels branch over it on tiles inside one example), so what such a
tile's path leaves out.
"""

from __future__ import annotations

import argparse
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
        ptx_of, sass_of = gpu.kernel_code(fn, *args, target=arch)
    counts = {}
    for name, ptx in sorted(ptx_of.items()):
        if not name.startswith("t5x_like_flash"):
            continue
        sizes = [n for _, n in gpu.ptx_blocks(ptx, name)]
        short = name.removeprefix("t5x_like_flash_").removesuffix("_mosaic_gpu_kernel")
        loop = gpu.ptx_loop(ptx, name)
        whole = sum(len(lines) for _, lines in loop)

        def branch(is_marker, loop=loop, whole=whole) -> int:
            """Instructions of the loop's smaller blocks with a marked line: one path's code."""
            return sum(len(lines) for _, lines in loop
                       if len(lines) < whole / 2 and any(map(is_marker, lines)))

        def is_store(line: str) -> bool:  # st.global (Triton) or a generic st (Mosaic GPU)
            return line.startswith("st.") and not line.startswith("st.shared")

        counts[short] = {"total": sum(sizes), "loop": max(sizes), "whole_loop": whole,
                         "store_block": branch(is_store),
                         "row_sum_block": branch(lambda line: line.startswith("shfl.sync")),
                         "mask_branches": list(gpu.mask_branches(ptx, name)),
                         "sass": (gpu.sass_features(sass_of[name])["sass_instructions"]
                                  if name in sass_of else None)}
    return counts


def window_share(length: int, rows: int, cols: int, bidirectional: bool) -> float:
    """Share of one (batch, head)'s visited dQ tiles in their q block's window, whose dS the
    Triton dQ kernel stores (`gpu_inputs.near_window`), causal tiles above the diagonal
    skipped."""
    from t5x_like.kernels import _flash_gpu_inputs

    cfg = types.SimpleNamespace(block_q=rows, block_k=cols, nq=length // rows,
                                nk=length // cols, rel_bidirectional=bidirectional, **T5)
    nwin, tiles, stored = _flash_gpu_inputs.near_window(cfg), 0, 0
    for q0 in range(0, length, rows):
        j0 = int(_flash_gpu_inputs.near_first_block(cfg, q0))
        for j in range(length // cols):
            if not bidirectional and j * cols > q0 + rows - 1:
                continue
            tiles += 1
            stored += j0 <= j < j0 + nwin
    return stored / tiles


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
               for b in backends for v in ("full", "rel", "packed")}
    tiles = []
    for backend in backends:
        dq = [name for name in kernels[f"{backend}/rel"] if name.startswith("bwd_dq")][0]
        plain, t5 = kernels[f"{backend}/full"][dq], kernels[f"{backend}/rel"][dq]
        rows, cols = dq_tile(args.arch, args.head_dim, backend)
        window_rows = 128 if backend == "mosaic_gpu" else rows  # Hopper: per 128-row block
        stored = t5["whole_loop"] - t5["row_sum_block"]
        far = t5["whole_loop"] - t5["store_block"]
        for length in LENGTHS:
            for bidirectional in (True, False):
                share = window_share(length, window_rows, cols, bidirectional)
                per_tile = share * stored + (1 - share) * far
                tiles.append({"backend": backend, "length": length,
                              "mask": "bidirectional" if bidirectional else "causal",
                              "tile": [rows, cols], "stored_share": round(share, 3),
                              "t5_per_tile": round(per_tile),
                              "plain_per_tile": plain["whole_loop"],
                              "t5_over_plain": round(per_tile / plain["whole_loop"], 2)})
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
        "SASS: the kernel's whole machine code (nvdisasm), where one PTX instruction may be "
        "several (Triton's `ex2.approx.f32` was four). Loop body: the largest basic block "
        "(the Hopper kernels' loops also hold barrier waits, outside it); whole loop: a label "
        "to the last branch back to it, blocks it may skip included.", "",
        "| backend / variant | kernel | PTX instructions | loop body | whole loop | "
        "SASS instructions |", "|---|---|---|---|---|---|"]
    for key, kernels in r["kernels"].items():
        for name, k in kernels.items():
            sass = f"{k['sass']:,}" if k.get("sass") else "-"
            lines.append(f"| {key} | {name} | {k['total']:,} | {k['loop']:,} | "
                         f"{k['whole_loop']:,} | {sass} |")
    lines += [
        "", "Packed segment ids: the whole loop, and the segment test (two compares and a select "
        "a score) where it sits in a block of its own, which a tile inside one example branches "
        "over (0: inline, run on every tile).", "",
        "| backend | kernel | whole loop | segment test | one example's tile | left out |",
        "|---|---|---|---|---|---|"]
    for key, kernels in r["kernels"].items():
        if not key.endswith("/packed"):
            continue
        for name, k in kernels.items():
            test = k["mask_branches"][0] - k["mask_branches"][1]
            lines.append(f"| {key.split('/')[0]} | {name} | {k['whole_loop']:,} | {test:,} | "
                         f"{k['whole_loop'] - test:,} | {100 * test / k['whole_loop']:.0f}% |")
    lines += [
        "", "T5-table dQ kernels, instructions per tile (predicted; T5's 32 buckets, "
        "max_distance 128): the loop with the store of a window tile's dS (2 bytes an element "
        "to HBM, summed by offset after the kernel) for the stored share of tiles, with the "
        "row sums for the others; plain: the plain dQ kernel's whole loop.", "",
        "| backend | length | mask | tile | dS stored | T5 per tile | plain per tile | "
        "T5 / plain |", "|---|---|---|---|---|---|---|---|"]
    for t in r["dq_per_tile"]:
        lines.append(f"| {t['backend']} | {t['length']} | {t['mask']} | {t['tile'][0]}x"
                     f"{t['tile'][1]} | {100 * t['stored_share']:.0f}% | "
                     f"{t['t5_per_tile']:,} | {t['plain_per_tile']:,} | {t['t5_over_plain']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
