#!/usr/bin/env python3
"""CI check: the GPU flash-attention kernels compile, do not spill, fit and stay pipelined.

Compiles (deviceless, no GPU needed) the forward, dK/dV and dQ Triton kernels at the DEFAULT
blocks of `flash_attention.GPU_BLOCKS` for each arch x head_dim x variant (by default every GPU
generation in the table and every feature combination the public API reaches,
`t5x_like.aot.gpu.FLASH_VARIANTS`), and for sm_90 also the Hopper kernels
(`backend='mosaic_gpu'`: forward, dK/dV and dQ, every variant without a dense bias); prints a table
and exits 1 naming every kernel that failed to compile, spills registers, exceeds the arch's
shared memory, has no cp.async / TMA loads (its k loop is not software-pipelined) or has its
wgmma serialized by ptxas (C7514/C7515, sm_90: the MMAs stop overlapping the loop), and a
Hopper kernel whose SASS (nvdisasm, `make install-aot` links it) lacks HGMMA or TMA loads
(UTMALDG) or holds local-memory loads / stores (LDL / STL).

    JAX_PLATFORMS=cpu /tmp/aotvenv/bin/python scripts/check_gpu_kernels.py
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import multiprocessing
import os
import sys
import time


def _worker_init() -> None:
    """Before the worker imports jax: XLA logs its own ptxas -v report (read, not rerun)."""
    from t5x_like.aot import gpu

    os.environ.update(gpu.XLA_PTXAS_LOG_ENV)


def check(arch: str, head_dim: int, variants: list[str], seq_len: int,
          t0: float) -> tuple[list[tuple], list[str]]:
    """Compile each variant for one (arch, head_dim): (table rows, failure lines)."""
    from t5x_like.aot import gpu
    from t5x_like.kernels import flash

    target = gpu.gpu_target(arch)
    devices = gpu.target_devices(arch)
    rows, failures = [], []
    for variant in variants:
        fn, fargs = gpu.flash_grad_fn(variant, head_dim, devices, seq_len=seq_len)
        where = f"{arch} d={head_dim} {variant}"
        try:
            with flash.compile_target("gpu", arch):
                report = gpu.kernel_report(fn, *fargs, target=arch,
                                           kernel_filter=lambda n: n in gpu.FLASH_KERNELS)
        except Exception as e:  # noqa: BLE001 - any compile error fails the check
            failures.append(f"{where}: compile failed: {type(e).__name__}: {e}"[:400])
            continue
        for name in gpu.FLASH_KERNELS:
            k = report.get(name, {})
            bad = gpu.kernel_problems(k, target.smem_per_block_optin)
            if bad:
                failures.append(f"{where} {name}: " + "; ".join(bad))
            rows.append((arch, head_dim, variant, name.removeprefix("t5x_like_flash_"), k,
                         "FAIL" if bad else "ok"))
        print(f"[{time.time() - t0:5.0f}s] {where}", flush=True)
    if target.compute_capability >= (9, 0):  # the Hopper kernels (Mosaic GPU, sm_90a)
        for variant in [v for v in variants if v in gpu.MOSAIC_FLASH_VARIANTS]:
            fn, fargs = gpu.flash_grad_fn(variant, head_dim, devices, seq_len=seq_len,
                                          backend="mosaic_gpu")
            where = f"{arch} d={head_dim} {variant} (mosaic_gpu)"
            try:
                with flash.compile_target("gpu", arch):
                    report = gpu.mosaic_kernel_report(fn, *fargs, target=arch)
            except Exception as e:  # noqa: BLE001 - any compile error fails the check
                failures.append(f"{where}: compile failed: {type(e).__name__}: {e}"[:400])
                continue
            for name in gpu.MOSAIC_FLASH_KERNELS:
                k = report.get(name, {})
                bad = gpu.kernel_problems(k, target.smem_per_block_optin)
                bad += [] if k.get("wgmma") else ["no wgmma"]
                bad += _sass_problems(k)
                if bad:
                    failures.append(f"{where} {name}: " + "; ".join(bad))
                short = name.removeprefix("t5x_like_flash_").removesuffix("_mosaic_gpu_kernel")
                rows.append((arch, head_dim, variant, short, k, "FAIL" if bad else "ok"))
            print(f"[{time.time() - t0:5.0f}s] {where}", flush=True)
    return rows, failures


def _sass_problems(k: dict) -> list[str]:
    """What a Hopper kernel's SASS should show and does not: tensor-core MMAs (HGMMA), TMA
    loads (UTMALDG), no local memory (LDL / STL, what spills become)."""
    if "sass_instructions" not in k:
        return ["no SASS (nvdisasm beside ptxas: make install-aot)"]
    return ([] if k["hgmma"] else ["no HGMMA in SASS"]) + (
        [] if k["utmaldg"] else ["no UTMALDG in SASS"]) + (
        [f"{k['ldl_stl']} LDL/STL in SASS"] if k["ldl_stl"] else [])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--archs", default="sm_80,sm_86,sm_89,sm_90")
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--variants", default="all", help="comma-separated, or 'all'")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--jobs", type=int, default=2, help="compiling processes")
    args = p.parse_args()

    from t5x_like.aot import gpu

    gpu.require_gpu_compiler()
    t0 = time.time()
    variants = list(gpu.FLASH_VARIANTS) if args.variants == "all" else args.variants.split(",")
    unknown = sorted(set(variants) - set(gpu.FLASH_VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}; known: {sorted(gpu.FLASH_VARIANTS)}")
    archs, dims = zip(*[(arch, int(d)) for arch in args.archs.split(",")
                        for d in args.head_dims.split(",")], strict=True)
    run = functools.partial(check, variants=variants, seq_len=args.seq_len, t0=t0)
    # Fresh interpreters (not forks of this one, which has imported jax).
    with concurrent.futures.ProcessPoolExecutor(
            args.jobs, mp_context=multiprocessing.get_context("spawn"),
            initializer=_worker_init) as pool:
        done = list(pool.map(run, archs, dims))
    rows = [r for rs, _ in done for r in rs]
    failures = [f for _, fs in done for f in fs]
    print("\n| arch | D | variant | kernel | regs | spill st/ld B | smem B | blocks/SM (limit) | "
          "MMA | cp.async+TMA | SASS: HGMMA / UTMALDG / LDL+STL | status |")
    print("|---" * 12 + "|")
    for arch, d, variant, name, k, status in rows:
        smem = k.get("dyn_smem_bytes", 0) + k.get("static_smem_bytes", 0)
        sass = (f"{k['hgmma']} / {k['utmaldg']} / {k['ldl_stl']}" if "sass_instructions" in k
                else "-")
        print(f"| {arch} | {d} | {variant} | {name} | {k.get('registers')} | "
              f"{k.get('spill_store_bytes')}/{k.get('spill_load_bytes')} | {smem} | "
              f"{k.get('blocks_per_sm')} ({k.get('limited_by')}) | {k.get('mma')} | "
              f"{k.get('cp_async', 0) + k.get('tma', 0)} | {sass} | {status} |")
    print(f"\n{len(rows)} kernels in {time.time() - t0:.0f} s")
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    print("all kernels compile without spills, fit shared memory and are pipelined (loads and "
          "wgmma)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
