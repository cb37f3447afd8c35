#!/usr/bin/env python3
"""Offline search of the GPU flash-attention block sizes, from real deviceless compiles.

For each (arch, head_dim) this compiles the forward + both backward Triton kernels for every
candidate pair (forward blocks, backward blocks) and each variant (no bias, the T5 table, a dense
bias; `scripts/check_gpu_kernels.py` then checks the picks on every public variant),
reads registers, spills, shared memory, blocks per SM and cp.async/TMA counts
(`t5x_like.aot.gpu.kernel_report`), and picks per (arch, head_dim, kernel) by RULE below. It
writes every candidate's numbers and the picks to `benchmarks/flash_gpu_blocks.json` + `.md`;
`t5x_like/kernels/flash.py:GPU_BLOCKS` must equal the picks (a test checks).

Each candidate compiles in its own process (its variants one after another, ~10-30 s) and is
cached as one JSON file per candidate and variant under --cache-dir, so an interrupted run
resumes where it stopped. Run in the aot venv:

    JAX_PLATFORMS=cpu /tmp/aotvenv/bin/python scripts/tune_flash_gpu.py [--archs sm_80,sm_90]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from t5x_like.aot import gpu  # noqa: E402

# sm_89 (L4, L40S) shares sm_86's table: same 99 KB shared-memory opt-in, same mma.sync code.
ARCHS = ("sm_90", "sm_80", "sm_86")
HEAD_DIMS = (64, 128)
# The T5 table, a dense bias (each with every mask) and no bias: the most registers and shared
# memory each kind of kernel needs.
VARIANTS = ("causal_rel", "packed_prefix_rel", "packed_prefix_dense", "causal")
# (block_q, block_k, num_warps, num_stages): forward and backward candidates, compiled in pairs
# (candidate i of each list in the same compile) so each compile measures one of each.
FWD_CANDIDATES = (
    (128, 128, 8, 2), (128, 64, 8, 3), (128, 64, 4, 3), (64, 128, 4, 2),
    (64, 64, 4, 3), (64, 64, 4, 2), (128, 32, 4, 3), (64, 32, 4, 2), (64, 32, 8, 2),
)
BWD_CANDIDATES = (
    (128, 64, 8, 2), (64, 128, 8, 2), (64, 64, 8, 2), (64, 64, 4, 2),
    (32, 64, 4, 2), (64, 32, 4, 2), (32, 32, 4, 2), (32, 32, 4, 1),
    (64, 32, 8, 2),  # 8 warps: fewer registers per thread (sm_86 / sm_89 at head_dim 128)
)
KERNELS = {"fwd": ("t5x_like_flash_fwd",),
           "bwd": ("t5x_like_flash_bwd_dkdv", "t5x_like_flash_bwd_dq")}
RULE = (
    "Per (arch, head_dim, kernel in fwd | bwd): keep candidates whose kernels (fwd; or dkdv and "
    "dq) compile for every variant with 0 spill bytes, shared memory <= the arch's opt-in limit "
    "and cp.async/TMA loads present. Among those take the largest tile area block_q*block_k; "
    "ties: most resident warps per SM (min over variants and kernels), then fewer stages, then "
    "fewer registers. If none qualifies, the one with the fewest spill bytes that fits (flagged)."
)


def _kernel_src_hash() -> str:
    """Hash of the kernel sources: a changed kernel invalidates the cache. (Not
    flash.py: its block table is what this script writes, and the workers override
    it.)"""
    h = hashlib.sha256()
    for rel in ("t5x_like/kernels/_flash_triton.py", "t5x_like/kernels/_flash_common.py",
                "t5x_like/kernels/relpos.py"):
        with open(os.path.join(ROOT, rel), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:12]


def worker(arch: str, head_dim: int, variants: list[str], fwd: tuple, bwd: tuple) -> None:
    """Compile one candidate for each variant in this process; prints one REPORT line (the
    kernels' reports) or ERROR line (the compiler's last error line) per variant."""
    from t5x_like.kernels import flash
    # This process only: make the table answer the candidate's blocks for this arch.
    flash.GPU_BLOCKS[arch] = {head_dim: {"fwd": fwd, "bwd": bwd}}
    devices = gpu.target_devices(arch)
    for variant in variants:
        t0 = time.time()
        fn, args = gpu.flash_grad_fn(variant, head_dim, devices)
        try:
            with flash.compile_target("gpu", arch):
                report = gpu.kernel_report(fn, *args, target=arch,
                                           kernel_filter=lambda n: n in gpu.FLASH_KERNELS)
            line = "REPORT " + json.dumps(report)
        except Exception as e:  # noqa: BLE001 - a candidate that does not compile is a result
            line = "ERROR " + f"{type(e).__name__}: {e}".splitlines()[0][:500]
        print(f"{variant} {time.time() - t0:.1f} {line}", flush=True)


def _cache_path(cache_dir: str, arch: str, head_dim: int, variant: str, fwd: tuple,
                bwd: tuple) -> str:
    key = f"{arch}_d{head_dim}_{variant}_f{'-'.join(map(str, fwd))}_b{'-'.join(map(str, bwd))}"
    return os.path.join(cache_dir, key + ".json")


def run_candidate(cache_dir: str, arch: str, head_dim: int, fwd: tuple, bwd: tuple,
                  timeout: int) -> list[dict]:
    """Cached results of one candidate, one per variant (the missing ones compiled in a fresh
    process)."""
    paths = {v: _cache_path(cache_dir, arch, head_dim, v, fwd, bwd) for v in VARIANTS}
    todo = [v for v, path in paths.items() if not os.path.exists(path)]
    if todo:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(
            [arch, head_dim, todo, list(fwd), list(bwd)])]
        env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, **gpu.XLA_PTXAS_LOG_ENV)
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                  timeout=timeout, check=False)
            out = proc.stdout + re.sub(r"(?m)^I\d{4} .*\n?", "", proc.stderr)  # XLA's INFO log
        except subprocess.TimeoutExpired:
            out = "timeout"
        lines = {ln.split(" ", 1)[0]: ln.split(" ", 3)[1:] for ln in out.splitlines()
                 if ln.split(" ", 1)[0] in todo and (" REPORT " in ln or " ERROR " in ln)}
        for variant in todo:
            res = {"arch": arch, "head_dim": head_dim, "variant": variant, "fwd": list(fwd),
                   "bwd": list(bwd)}
            wall, kind, body = lines.get(variant, ("0", "ERROR", out[-300:].strip()))
            res.update(wall_s=float(wall), ok=kind == "REPORT")
            if kind == "REPORT":
                res["kernels"] = json.loads(body)
            else:
                res["error"] = body[:500]
            with open(paths[variant], "w") as f:
                json.dump(res, f)
    results = []
    for variant in VARIANTS:
        with open(paths[variant]) as f:
            results.append(json.load(f))
    return results


def pick(results: list[dict], kernel: str, smem_limit: int) -> dict:
    """Apply RULE to one (arch, head_dim) and kernel group; returns the pick and its stats."""
    by_cand: dict[tuple, list[dict]] = {}
    for r in results:
        by_cand.setdefault(tuple(r[kernel]), []).append(r)
    scored = []
    for cand, rs in by_cand.items():
        ks = [r.get("kernels", {}).get(name, {}) for r in rs for name in KERNELS[kernel]]
        ok = all(r["ok"] for r in rs) and len(rs) == len(VARIANTS)
        clean = ok and not any(gpu.kernel_problems(k, smem_limit) for k in ks)
        fits = ok and all(k.get("dyn_smem_bytes", 0) + k.get("static_smem_bytes", 0)
                          <= smem_limit for k in ks)
        spill = sum(k.get("spill_store_bytes", 0) + k.get("spill_load_bytes", 0) for k in ks)
        warps = min((k.get("blocks_per_sm", 0) * cand[2] for k in ks), default=0)
        regs = max((k.get("registers", 0) for k in ks), default=0)
        scored.append(dict(blocks=list(cand), clean=clean, fits=fits, spill_bytes=spill,
                           warps_per_sm=warps, max_registers=regs))
    clean = [s for s in scored if s["clean"]]
    if clean:
        best = max(clean, key=lambda s: (s["blocks"][0] * s["blocks"][1], s["warps_per_sm"],
                                         -s["blocks"][3], -s["max_registers"]))
        return {**best, "flag": ""}
    fits = [s for s in scored if s["fits"]] or scored
    best = min(fits, key=lambda s: (s["spill_bytes"], -s["blocks"][0] * s["blocks"][1]))
    return {**best, "flag": "no candidate without spills / with pipelined loads"}


def write_outputs(all_results: list[dict], picks: dict, targets: dict, out_base: str,
                  versions: dict) -> None:
    doc = {"rule": RULE, "variants": list(VARIANTS), "fwd_candidates": FWD_CANDIDATES,
           "bwd_candidates": BWD_CANDIDATES, "targets": targets, "versions": versions,
           "picks": picks, "candidates": all_results}
    with open(out_base + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    lines = ["# GPU flash-attention block sizes (offline search)", "",
             "Written by `scripts/tune_flash_gpu.py` from deviceless compiles (no GPU): "
             "registers, spills and shared memory from ptxas -v, launch shape from XLA, "
             "cp.async/TMA and MMA kind from the PTX. bf16, B=2, L=1024, H=8, 32 buckets.", "",
             f"Rule: {RULE}", "",
             "sm_89 (L4, L40S) uses sm_86's picks: same 99 KB shared-memory opt-in per block "
             "and the same mma.sync code. head_dim 256 is not searched.", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()), "",
             "## Picks", "",
             "| arch | head_dim | kernel | (block_q, block_k, warps, stages) | warps/SM | "
             "max regs | note |", "|---|---|---|---|---|---|---|"]
    for arch, by_d in picks.items():
        for d, by_k in by_d.items():
            for kern, p in by_k.items():
                lines.append(f"| {arch} | {d} | {kern} | {tuple(p['blocks'])} | "
                             f"{p['warps_per_sm']} | {p['max_registers']} | {p['flag']} |")
    lines += ["", "## Targets", "", "| arch | model | SMs | smem/SM | smem/block opt-in |",
              "|---|---|---|---|---|"]
    for arch, t in targets.items():
        lines.append(f"| {arch} | {t['device_kind']} | {t['sm_count']} | {t['smem_per_sm']} | "
                     f"{t['smem_per_block_optin']} |")
    lines += ["", "## Every candidate", "",
              "| arch | D | variant | fwd blocks | bwd blocks | kernel | regs | spill st/ld B | "
              "smem B | blocks/SM (limit) | MMA | cp.async+TMA |", "|---" * 12 + "|"]
    for r in all_results:
        if not r["ok"]:
            lines.append(f"| {r['arch']} | {r['head_dim']} | {r['variant']} | {tuple(r['fwd'])}"
                         f" | {tuple(r['bwd'])} | FAILED: {r.get('error', '')[:80]} |"
                         " | | | | | |")
            continue
        for name, k in sorted(r["kernels"].items()):
            smem = k.get("dyn_smem_bytes", 0) + k.get("static_smem_bytes", 0)
            lines.append(
                f"| {r['arch']} | {r['head_dim']} | {r['variant']} | {tuple(r['fwd'])} | "
                f"{tuple(r['bwd'])} | {name.removeprefix('t5x_like_flash_')} | "
                f"{k.get('registers')} | {k.get('spill_store_bytes')}/"
                f"{k.get('spill_load_bytes')} | {smem} | {k.get('blocks_per_sm')} "
                f"({k.get('limited_by')}) | {k.get('mma')} | "
                f"{k.get('cp_async', 0) + k.get('tma', 0)} |")
    with open(out_base + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--archs", default=",".join(ARCHS))
    p.add_argument("--head-dims", default=",".join(map(str, HEAD_DIMS)))
    p.add_argument("--cache-dir", default="/tmp/t5x_like_flash_gpu_tune")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "flash_gpu_blocks"))
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--jobs", type=int, default=2, help="compiles in parallel (processes)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        arch, d, variants, fwd, bwd = json.loads(args.worker)
        worker(arch, d, variants, tuple(fwd), tuple(bwd))
        return 0

    gpu.require_gpu_compiler()
    cache = os.path.join(args.cache_dir, _kernel_src_hash())
    os.makedirs(cache, exist_ok=True)
    archs = args.archs.split(",")
    dims = [int(x) for x in args.head_dims.split(",")]
    import jax

    versions = {"jax": jax.__version__, "ptxas": gpu.ptxas_version(),
                "python": platform.python_version(), "kernel_src": _kernel_src_hash()}
    all_results, picks, targets = [], {}, {}
    t0 = time.time()
    for arch in archs:
        tgt = gpu.gpu_target(arch)
        targets[arch] = {"device_kind": tgt.device_kind, "sm_count": tgt.sm_count,
                         "smem_per_sm": tgt.smem_per_sm,
                         "smem_per_block_optin": tgt.smem_per_block_optin,
                         "hbm_bytes": tgt.hbm_bytes}
        for d in dims:
            def one(job, arch=arch, d=d):
                fwd, bwd = job
                rs = run_candidate(cache, arch, d, fwd, bwd, args.timeout)
                status = ", ".join(f"{r['variant']} {'ok' if r['ok'] else 'FAILED'}" for r in rs)
                print(f"[{time.time() - t0:6.0f}s] {arch} d={d} fwd={fwd} bwd={bwd}: {status}",
                      flush=True)
                return rs

            with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
                results = [r for rs in pool.map(one, zip(FWD_CANDIDATES, BWD_CANDIDATES,
                                                         strict=True)) for r in rs]
            all_results += results
            picks.setdefault(arch, {})[str(d)] = {
                kern: pick(results, kern, tgt.smem_per_block_optin) for kern in KERNELS}
            write_outputs(all_results, picks, targets, args.out, versions)
    print(f"wrote {args.out}.json/.md in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
