"""A GPU profile reduced to a per-kernel table, and checked against the offline step model.

`reduce_trace` turns the events of a `jax.profiler` trace (perfetto / chrome JSON) into
per-kernel rows (kernel, HLO op, kind, region, calls and ms per step), sums by kind and region,
and the GPU's busy time; kernels inside a CUDA graph carry the command buffer as their HLO op
and are matched to their fusion by name. `reclassify` reapplies the current rules to a saved
table, `calibrate` puts it beside `t5x_like.aot.roofline`'s prediction for the same HLO.
Used by `scripts/bench_gpu_step.py` on the leased machine and by its `--render` here.
"""

from __future__ import annotations

import collections
import gzip
import json
import re
from pathlib import Path
from typing import Any


def hlo_index(hlo_text: str) -> dict[str, str]:
    """Instruction name -> its line in an optimised HLO module (first definition wins)."""
    out: dict[str, str] = {}
    for line in hlo_text.splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = ", line)
        if m:
            out.setdefault(m.group(1), line)
    return out


def op_kind(line: str, kernel: str) -> str:
    """The kind of a GPU kernel, from its name and (where matched) its HLO line: attention
    (cuDNN's fused attention, our Pallas kernel), GEMM (cuBLAS/cuBLASLt, Triton), fusion kinds,
    copies. Kernels inside a CUDA graph are matched by name only."""
    name, text = kernel.lower(), f"{line} {kernel}".lower()
    if "sdpa" in name or "fmha" in text or "cudnn::fusion" in name or "cudnn$fmha" in text:
        return "attention (cuDNN)"
    if name.startswith("t5x_like_flash") or "__gpu$xla.gpu.triton" in text:
        return "attention (Pallas)"
    if "gemm_fusion" in name or "triton_gemm" in text or "triton" in name:
        return "gemm (Triton)"
    if "nvjet" in name or "xmma" in name or "cutlass" in name or "__cublas" in text or (
            "gemm" in name):
        return "gemm (cuBLAS)"
    if "memcpy" in name or "memset" in name:
        return "memcpy / memset"
    if "copy" in name or "transpose" in name or " copy(" in line:
        return "copy / transpose"
    if "reduce" in name or "kind=kinput" in text:
        return "reduction fusion"
    if "fusion" in name or "wrapped" in name or "kind=kloop" in text:
        return "elementwise fusion"
    return "other"


def hlo_name(kernel: str, hlo: dict[str, str]) -> str | None:
    """The HLO instruction a kernel was emitted for: XLA names a fusion's kernel after the
    fusion, with '_' where the instruction name has '.' (`loop_add_fusion_11`)."""
    for cand in (kernel, re.sub(r"_(\d+)$", r".\1", kernel), kernel.replace("_", ".")):
        if cand in hlo:
            return cand
    return None


def op_region(line: str) -> str:
    """forward / backward / optimizer from the op_name metadata (jvp / transpose(jvp))."""
    m = re.search(r'op_name="([^"]*)"', line)
    name = m.group(1) if m else ""
    if "transpose(jvp(" in name:
        return "backward"
    if "jvp(" in name:
        return "forward"
    return "optimizer / other" if name else "unknown"


def reduce_trace(events: list[dict], hlo: dict[str, str], steps: int,
                 wall_s: float) -> dict[str, Any]:
    """A GPU trace -> per-kernel rows (ms per step), sums by kind and region, the busy time.

    GPU events are the trace's complete events ('X') on processes named like a device
    (`/device:GPU:0`, 'GPU', 'Stream'); each is matched to its HLO instruction through its
    `hlo_op` argument (or its name), which gives the kind and the region.
    """
    pname = {e.get("pid"): e.get("args", {}).get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    tname = {(e.get("pid"), e.get("tid")): e.get("args", {}).get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    gpu_pids = {pid for pid, n in pname.items() if re.search(r"gpu|device:|stream", n, re.I)
                and "host" not in n.lower()}
    derived = re.compile(r"xla (ops|modules)|steps|framework|source|launch", re.I)
    streams = {k for k, n in tname.items() if k[0] in gpu_pids and re.search("stream", n, re.I)}
    keep = ((lambda e: (e.get("pid"), e.get("tid")) in streams) if streams else
            (lambda e: e.get("pid") in gpu_pids
             and not derived.search(tname.get((e.get("pid"), e.get("tid")), ""))))
    if not gpu_pids:  # a CPU trace (the smoke test): XLA:CPU's thunks, named as HLO ops
        keep = lambda e: e.get("name") in hlo
    rows: dict[str, dict[str, Any]] = {}
    spans = []
    sample = []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e or not keep(e):
            continue
        args = e.get("args", {}) or {}
        op = str(args.get("hlo_op") or args.get("name") or e["name"])
        if op not in hlo:  # in a CUDA graph hlo_op is the command buffer: match the kernel's
            op = hlo_name(e["name"], hlo) or hlo_name(op, hlo) or op  # name instead
        if len(sample) < 200:
            sample.append({"name": e["name"][:120], "dur": e["dur"],
                           "thread": tname.get((e.get("pid"), e.get("tid")), ""),
                           "args": {k: str(v)[:120] for k, v in args.items()}})
        key = f"{op} | {e['name']}"
        line = hlo.get(op, "")
        row = rows.setdefault(key, {"hlo_op": op, "kernel": e["name"][:90],
                                    "kind": op_kind(line, e["name"]), "region": op_region(line),
                                    "us": 0.0, "calls": 0, "matched": bool(line)})
        row["us"] += float(e["dur"])
        row["calls"] += 1
        spans.append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    spans.sort()
    busy, end = 0.0, float("-inf")
    for s, t in spans:
        busy += max(0.0, t - max(s, end))
        end = max(end, t)
    total = sum(r["us"] for r in rows.values())
    table = sorted(rows.values(), key=lambda r: -r["us"])
    for r in table:
        r["ms_per_step"] = r.pop("us") / 1e3 / steps
        r["calls"] = r["calls"] / steps
    by = lambda field: dict(sorted(_sum_by(table, field).items(), key=lambda kv: -kv[1]))
    return {"steps": steps, "wall_ms_per_step": 1e3 * wall_s,
            "kernel_ms_per_step": total / 1e3 / steps, "busy_ms_per_step": busy / 1e3 / steps,
            "kernels_per_step": sum(r["calls"] for r in table),
            "by_kind_ms": by("kind"), "by_region_ms": by("region"), "top": table[:80],
            "unmatched_ms_per_step": sum(r["ms_per_step"] for r in table if not r["matched"]),
            "processes": sorted(set(pname.values()))[:20],
            "threads": sorted({n for (pid, _), n in tname.items() if pid in gpu_pids})[:40],
            "sample": sample}


def _sum_by(table: list[dict], field: str) -> dict[str, float]:
    """ms per step summed over the rows sharing `field`."""
    out: dict[str, float] = collections.Counter()
    for r in table:
        out[r[field]] += r["ms_per_step"]
    return dict(out)


def reclassify(profile: dict[str, Any], hlo_text: str | None) -> dict[str, Any]:
    """A reduced profile with its top rows' kind and region recomputed (kinds and regions
    from the current rules; HLO lines matched by kernel name when `hlo_text` is given), the
    by-kind sums moved accordingly, and by-region sums over the top rows (`top_*`)."""
    hlo = hlo_index(hlo_text) if hlo_text else {}
    out = json.loads(json.dumps(profile))
    by_kind = collections.Counter(out["by_kind_ms"])
    for r in out["top"]:
        by_kind[r["kind"]] -= r["ms_per_step"]
        op = hlo_name(r["kernel"], hlo) or r["hlo_op"]
        line = hlo.get(op, "")
        r.update(hlo_op=op, kind=op_kind(line, r["kernel"]), region=op_region(line),
                 matched=bool(line))
        by_kind[r["kind"]] += r["ms_per_step"]
    out["by_kind_ms"] = {k: v for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])
                         if abs(v) > 1e-6}
    out["top_by_region_ms"] = _sum_by(out["top"], "region")
    out["top_ms_per_step"] = sum(r["ms_per_step"] for r in out["top"])
    return out


#: The step model's kinds (t5x_like.aot.roofline) for the profile's kinds.
MODEL_KIND = {"gemm (cuBLAS)": "gemm", "gemm (Triton)": "gemm", "attention (cuDNN)": "attention",
              "attention (Pallas)": "attention", "copy / transpose": "copy"}


def calibrate(profile: dict[str, Any], hlo_text: str) -> dict[str, Any]:
    """The offline step model of the profiled module against the measured kernels, by kind:
    measured ms, predicted (roofline) ms and their ratio; `model_flops` from the profile row."""
    from t5x_like.aot import roofline

    model = roofline.step_model(hlo_text, top=10)
    measured: dict[str, float] = collections.Counter()
    for kind, ms in profile["by_kind_ms"].items():
        measured[MODEL_KIND.get(kind, "fusion")] += ms
    kinds = sorted(set(measured) | set(model["by_kind_ms"]), key=lambda k: -measured.get(k, 0))
    rows = {k: {"measured_ms": measured.get(k, 0.0),
                "predicted_ms": model["by_kind_ms"].get(k, 0.0)} for k in kinds}
    rows["total"] = {"measured_ms": profile["kernel_ms_per_step"],
                     "predicted_ms": model["predicted_ms"]}
    for r in rows.values():
        r["ratio"] = r["measured_ms"] / r["predicted_ms"] if r["predicted_ms"] else None
    return {"by_kind": rows, "device": model["device"], "top": model["top"]}


def load_trace(trace_dir: str) -> list[dict]:
    """The events of the perfetto/chrome trace `jax.profiler` wrote under `trace_dir`."""
    files = sorted(Path(trace_dir).rglob("*.trace.json.gz")) or sorted(
        Path(trace_dir).rglob("perfetto_trace.json.gz"))
    if not files:
        raise FileNotFoundError(f"no trace json under {trace_dir}: "
                                f"{[str(p) for p in Path(trace_dir).rglob('*')][:20]}")
    trace = json.load(gzip.open(files[0]))
    return trace["traceEvents"] if isinstance(trace, dict) else trace
