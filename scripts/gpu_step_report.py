"""The lease benchmark's report: per-variant medians over rounds, the per-round ratio to
PyTorch, and `gpu_step.md` / `gpu_step.json` (profiles and their step-model calibration
included). Used by `scripts/bench_gpu_step.py`, on the leased machine and by its `--render`.
"""

from __future__ import annotations

import collections
import json
import statistics
from pathlib import Path
from typing import Any


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def summarize(rows: list[dict[str, Any]], specs: list[dict], torch_specs: list[dict],
              info: dict[str, Any]) -> dict[str, Any]:
    """Per variant the median [min-max] step time over rounds; per JAX variant the per-round
    ratio to the matching PyTorch variants (their step / ours: above 1 means we are faster)."""
    by = collections.defaultdict(dict)
    for r in rows:
        if r.get("kind") == "time" and "step_s" in r:
            by[r["name"]][r["round"]] = r
    out: dict[str, Any] = {"variants": {}}
    peaks = [r["peak_tflops"] for r in rows if r.get("kind") == "peak" and "peak_tflops" in r]
    if peaks:
        out["peak_tflops"] = spread(peaks)
    for spec in [*specs, *torch_specs]:
        name = spec["name"]
        got = by.get(name, {})
        rec: dict[str, Any] = {**spec, **info.get(name, {})}
        if got:
            rec["step_ms"] = spread([1e3 * r["step_s"] for r in got.values()])
            if "mfu" in next(iter(got.values())):
                mfus = [r["mfu"] for r in got.values() if r.get("mfu") is not None]
                rec["mfu"] = spread(mfus) if mfus else None
                rec["tflops"] = spread([r["tflops"] for r in got.values()])
            rec["microbatches"] = next(iter(got.values())).get("microbatches")
        out["variants"][name] = rec
    for spec in specs:
        mine = by.get(spec["name"], {})
        for t in torch_specs:
            if (t["model"], t["batch"]) != (spec["model"], spec["batch"]):
                continue
            theirs = by.get(t["name"], {})
            ratios = [theirs[i]["step_s"] / mine[i]["step_s"] for i in mine if i in theirs]
            if ratios:
                out["variants"][spec["name"]][f"vs_{t['mode']}"] = spread(ratios)
    return out


def write_report(summary: dict[str, Any], header: dict[str, Any], profiles: dict[str, Any],
                 out_dir: Path) -> None:
    """gpu_step.json (everything) and gpu_step.md (the tables)."""
    (out_dir / "gpu_step.json").write_text(json.dumps(
        {**header, **summary, "profiles": profiles}, indent=1) + "\n")
    f = lambda s: f"{s['median']:.1f} [{s['min']:.1f}-{s['max']:.1f}]" if s else "-"
    lines = [
        "# Train step on one GPU (`scripts/bench_gpu_step.py`)", "",
        f"Device: **{header['device']}**; {header['date_utc']} UTC; {header['rounds']} "
        f"interleaved rounds of {header['steps']} steps per variant (dispatched back to back, "
        "one sync), median [min-max] over rounds. Ours: the trainer's jitted step (forward + "
        "backward + Adafactor, fp32 parameters, bf16 activations, packed random batches, "
        f"512/114). PyTorch: {header.get('torch_framework', 'not run')}, same shapes unpacked, "
        "same Adafactor settings" + ("; its rounds ran after ours in the same call, each side "
                                     "alone on the GPU, so the ratios pair round i with round "
                                     "i but are not interleaved." if header.get("torch_after_jax")
                                     else ", interleaved with ours."), "",
    ]
    if "peak_tflops" in summary:
        lines += [f"Matmul peak ({header.get('matmul', '')}, JAX, per round): "
                  f"{f(summary['peak_tflops'])} TFLOP/s.", ""]
    lines += ["| variant | batch | attention | XLA options | step ms | TFLOP/s | MFU | "
              "HF eager / ours | HF compile / ours | compile s | temp GiB |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in summary["variants"].items():
        if name.startswith("torch:"):
            continue
        if "step_ms" not in r:
            lines.append(f"| {r['model']} | {r['batch']} | {r['attention']} | {r['options']} | "
                         f"{r.get('error', 'not measured')} | | | | | | |")
            continue
        mfu = r.get("mfu")
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['attention']} | {r['options']} | "
            f"{f(r['step_ms'])} | {r['tflops']['median']:.0f} | "
            f"{'-' if not mfu else '%.1f%%' % (100 * mfu['median'])} | "
            f"{f(r['vs_eager']) if 'vs_eager' in r else '-'} | "
            f"{f(r['vs_compile']) if 'vs_compile' in r else '-'} | "
            f"{r.get('compile_s', 0):.0f} | {r.get('temp_gib', float('nan')):.1f} |")
    lines += ["", "| PyTorch variant | step ms | microbatches | build + warm-up s |",
              "|---|---|---|---|"]
    for name, r in summary["variants"].items():
        if name.startswith("torch:"):
            cell = f(r["step_ms"]) if "step_ms" in r else r.get("error", "not measured")
            lines.append(f"| {name[6:]} | {cell} | {r.get('microbatches', '-')} | "
                         f"{r.get('compile_s', float('nan')):.0f} |")
    for name, p in profiles.items():
        if "profile" not in p:
            lines += ["", f"## Profile {name}: {p.get('error', 'failed')}"]
            continue
        pr = p["profile"]
        lines += ["", f"## Where the step's time goes: {name}", "",
                  f"{pr['steps']} traced steps: {pr['wall_ms_per_step']:.1f} ms per step on the "
                  f"host clock; GPU kernels {pr['kernel_ms_per_step']:.1f} ms "
                  f"({pr['kernels_per_step']:.0f} launches), the GPU busy "
                  f"{pr['busy_ms_per_step']:.1f} ms.", "",
                  "| kind | ms/step | share |", "|---|---|---|"]
        tot = max(pr["kernel_ms_per_step"], 1e-9)
        for k, ms in pr["by_kind_ms"].items():
            lines.append(f"| {k} | {ms:.2f} | {100 * ms / tot:.0f}% |")
        regions = pr.get("top_by_region_ms", pr["by_region_ms"])
        lines += ["", "| region (of the kernels below; library kernels inside a CUDA graph "
                  "carry no HLO op: unknown) | ms/step |", "|---|---|"]
        lines += [f"| {k} | {ms:.2f} |" for k, ms in regions.items()]
        cal = p.get("step_model")
        if cal:
            dev = cal["device"]
            lines += ["", f"Against the offline step model (`t5x_like.aot.roofline`: each kernel "
                      f"of this HLO at max(FLOPs / {dev['matmul_flops'] / 1e12:.0f} TFLOP/s, "
                      f"bytes / {dev['hbm_bytes_per_s'] / 1e12:.1f} TB/s), attention at "
                      f"{dev['attention_efficiency']:.2f} of the matmul rate):", "",
                      "| kind | measured ms | predicted ms | measured / predicted |",
                      "|---|---|---|---|"]
            for k, r in cal["by_kind"].items():
                ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
                lines.append(f"| {k} | {r['measured_ms']:.1f} | {r['predicted_ms']:.1f} | "
                             f"{ratio} |")
        lines += ["", "| kernel | HLO op | kind | region | calls/step | ms/step |",
                  "|---|---|---|---|---|---|"]
        for r in pr["top"][:25]:
            lines.append(f"| `{r['kernel'][:60]}` | {r['hlo_op'][:40]} | {r['kind']} | "
                         f"{r['region']} | {r['calls']:.0f} | {r['ms_per_step']:.3f} |")
    (out_dir / "gpu_step.md").write_text("\n".join(lines) + "\n")
