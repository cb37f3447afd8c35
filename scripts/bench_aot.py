"""Compile docs/scaling.md's configs for TPU and GPU targets offline and compare the planner.

Each config runs `python -m t5x_like.aot --json_out` in its own process (one libtpu / CUDA
plugin per process, memory returned after each) under `flock LOCK`, so heavy compiles queue
behind other work. Results are cached one per config in `benchmarks/aot.json` (keyed by config
id): a rerun skips what is done, so the script is resumable; `benchmarks/aot.md` is rewritten
from the cache after every config.

    flock -n /tmp/bench_aot.pid true && nohup .venv-aot/bin/python scripts/bench_aot.py &
    .venv-aot/bin/python scripts/bench_aot.py --only base   # configs whose id contains 'base'
    .venv-aot/bin/python scripts/bench_aot.py --render      # rewrite aot.md from the cache

T5 v1.1-XXL on v5p-128 (~5 min) and T5-large on v5e-16 (over 24 GB host RAM) run only with
`--heavy`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # `replan` only traces shapes
GIB = 2**30
PRETRAIN = "gin/runs/pretrain.gin"


@dataclasses.dataclass(frozen=True)
class Config:
    """One compile: a model gin file, a sharding preset, a target and extra gin bindings."""

    model: str
    sharding: str
    target: str
    bindings: tuple[str, ...] = ()
    heavy: bool = False
    xla_options: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        extra = "".join("-" + b.split(".")[-1].replace("'", "").replace("=", "")
                        for b in self.bindings)
        extra += "".join("-" + o.split("=")[0].replace("xla_gpu_enable_", "no_")
                         for o in self.xla_options if o.endswith("=false"))
        extra += "".join("-" + o.split("=")[0].replace("xla_gpu_enable_", "")
                         for o in self.xla_options if o.endswith("=true"))
        return f"{self.model}-{self.sharding}-{self.target}{extra}"

    def argv(self, json_out: str) -> list[str]:
        files = [f"gin/models/{self.model}.gin", PRETRAIN, f"gin/sharding/{self.sharding}.gin"]
        return ([f"--gin_file={f}" for f in files] + [f"--gin.{b}" for b in self.bindings]
                + [f"--target={self.target}", f"--json_out={json_out}", "--step=train"]
                + [f"--xla_option={o}" for o in self.xla_options])


REMAT_MIN = "TransformerConfig.remat_policy='minimal'"
#: Deviceless GPU compiles use cuBLAS GEMMs by default (`aot.step.DEVICELESS_GPU_OPTIONS`):
#: XLA cannot tile Triton GEMMs without the GPU ("Couldn't find output tile sizes"). One row
#: asks for Triton GEMMs to keep that failure on record.
TRITON_GEMM = ("xla_gpu_enable_triton_gemm=true",)
CUDNN = "TransformerConfig.attention_impl='cudnn'"
PALLAS = "TransformerConfig.attention_impl='pallas'"
CONFIGS: tuple[Config, ...] = (
    # The quick "does not fit" answer: tiny model, absurd batch, 16 GiB v5e chips.
    Config("tiny", "data_parallel", "v5e-16", ("train.batch_size=65536",)),
    Config("t5_1_1_small", "data_parallel", "v5e-16"),
    Config("t5_1_1_small", "fsdp", "v5e-16"),
    Config("t5_1_1_small", "fsdp_tp", "v5e-16"),
    Config("t5_1_1_base", "data_parallel", "v5e-16"),
    Config("t5_1_1_base", "fsdp", "v5e-16"),
    Config("t5_1_1_base", "fsdp_tp", "v5e-16"),
    Config("t5_1_1_base", "data_parallel", "v5e-16", (REMAT_MIN,)),
    Config("t5_1_1_small", "data_parallel", "v5e-16", (PALLAS,)),
    Config("t5_1_1_base", "data_parallel", "v5e-16", (PALLAS,)),
    Config("t5_1_1_small", "data_parallel", "8xh100"),
    Config("t5_1_1_small", "data_parallel", "8xh100", (CUDNN,)),
    Config("t5_1_1_small", "data_parallel", "8xh100", (PALLAS,)),
    Config("t5_1_1_base", "data_parallel", "8xh100"),
    Config("t5_1_1_base", "data_parallel", "8xh100", (CUDNN,)),
    Config("t5_1_1_base", "data_parallel", "8xh100", (PALLAS,)),
    Config("t5_1_1_base", "fsdp", "8xh100"),
    Config("t5_1_1_base", "fsdp_tp", "8xh100"),
    Config("t5_1_1_small", "data_parallel", "8xh100", xla_options=TRITON_GEMM),
    Config("t5_1_1_large", "fsdp", "v5e-16", heavy=True),  # > 24 GB host RAM
    Config("t5_1_1_large", "fsdp", "8xh100"),
    Config("t5_1_1_xxl", "fsdp", "v5p-128", ("train.batch_size=2048", REMAT_MIN), heavy=True),
)


def _load(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _save(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True, default=str)
    os.replace(tmp, path)


def run_one(cfg: Config, python: str, lock: str | None, timeout_s: float) -> dict[str, Any]:
    """Compile one config in a subprocess; the CLI's JSON report plus wall time and exit code."""
    out = os.path.join("/tmp", f"bench_aot_{os.getpid()}_{cfg.id}.json")
    cmd = [python, "-m", "t5x_like.aot", *cfg.argv(out)]
    if lock:
        cmd = ["flock", lock, *cmd]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "PYTHONPATH": ROOT, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"})
    result: dict[str, Any] = {"returncode": proc.returncode, "wall_s": round(time.time() - t0)}
    if os.path.exists(out):
        result["report"] = _load(out)
        os.remove(out)
    else:
        result["stderr_tail"] = proc.stderr[-3000:]
    return result


def replan(report: dict[str, Any]) -> dict[str, Any]:
    """The current planner, both activation models, for a cached report's config and mesh
    (cheap: no compile), so planner changes are re-scored against the cached compiles."""
    import gin

    from t5x_like import gin_utils, plan
    from t5x_like.models import TransformerConfig

    c = report["config"]
    platform = "tpu" if report["target"]["platform"] == "tpu" else "gpu"
    gin.clear_config()
    gin_utils.parse_gin(c["gin_files"], c["bindings"])
    cfg = TransformerConfig()
    out = {}
    for compiler in plan.COMPILERS:
        r = plan.plan(cfg, batch_size=c["batch_size"], sequence_length=c["sequence_length"],
                      mesh_shape=tuple(c["mesh"].values()), preset=c["preset"],
                      optimizer=c["optimizer"], num_microbatches=c["num_microbatches"],
                      compiler=compiler, platform=platform)
        b = r["bytes_per_device"]
        out[compiler] = {"temp": b["temp"][r["remat"]], "total": b["total"][r["remat"]]}
    gin.clear_config()
    return out


def ratios(res: dict[str, Any]) -> dict[str, float]:
    """plan/XLA temp and total for both activation models (from `replan`), where measured."""
    rep, plans = res.get("report") or {}, res.get("replan") or {}
    s = (rep.get("steps") or {}).get("train") or {}
    b = s.get("bytes_per_device") or {}
    temp = b.get("temp") or s.get("oom_temp_bytes")
    out = {}
    for compiler, p in plans.items():
        if temp:
            out[f"{compiler}_temp"] = round(p["temp"] / temp, 3)
        if b.get("peak"):
            out[f"{compiler}_total"] = round(p["total"] / b["peak"], 3)
    return out


def _short(error: str, n: int = 70) -> str:
    """The compiler's message without the exception class and status prefix, cut to n."""
    text = error.split(": ", 1)[-1]
    for prefix in ("INTERNAL: ", "INVALID_ARGUMENT: ", "RESOURCE_EXHAUSTED: "):
        text = text.removeprefix(prefix)
    return text[:n].replace("|", "/") + ("..." if len(text) > n else "")


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / GIB:.2f}"


def render(results: dict[str, Any]) -> str:
    """Markdown of every cached result: compiler bytes per device, planner, ratios."""
    rows = []
    for cfg in CONFIGS:
        res = results.get(cfg.id)
        if res is None:
            continue
        rep = res.get("report")
        if rep is None:
            rows.append(f"| {cfg.model} | {cfg.sharding} | {cfg.target} | failed (exit "
                        f"{res['returncode']}) |" + " - |" * 12)
            continue
        t, c = rep["target"], rep["config"]
        s = rep["steps"]["train"]
        b = s.get("bytes_per_device", {})
        r, q = rep.get("plan_over_compiler") or {}, ratios(res)
        plans = res.get("replan") or {}
        status = ("compiled" if s.get("compiled") else
                  "compiler OOM" if s.get("fits") is False else
                  f"**error** ({_short(s.get('error', ''))})")
        fits = {True: "yes", False: "**no**", None: "-"}[s.get("fits")]
        mesh = "x".join(str(v) for v in c["mesh"].values())
        temp = (_gib(b.get("temp")) if b else f"{_gib(s['oom_temp_bytes'])} (OOM message)"
                if s.get("oom_temp_bytes") else "-")
        flops = r.get("flops", "-") if t["platform"] != "cuda" else "n/a (XLA:GPU)"
        sm, fm = s.get("step_model"), s.get("flash_model")
        model = (f"{sm['predicted_ms']:.0f} ms, {100 * sm['mfu_ceiling']:.0f}%"
                 if sm and sm.get("mfu_ceiling") else "-")
        if fm and fm.get("mfu"):  # our kernels costed by their latency model, not their FLOPs
            model += f"; flash model {fm['predicted_ms']:.0f} ms, {100 * fm['mfu']:.0f}%"
        opts = "".join(f" `{o}`" for o in cfg.xla_options)
        if c.get("attention_impl", "xla") != "xla":
            opts += f", {c['attention_impl']} attention" + (
                f" (compiled as {rep['attention_compiled_as']})"
                if rep.get("attention_compiled_as", c["attention_impl"]) != c["attention_impl"]
                else "")
        rows.append(
            f"| {cfg.model} | {cfg.sharding}{opts} | {t['name']} ({t['num_devices']} x "
            f"{t['device_kind']}) | ({mesh}) | {c['batch_size']} / {c['remat']} | {status}, "
            f"{s.get('compile_s', '-')} s | {_gib(b.get('argument'))} | {temp} | "
            f"{_gib(b.get('peak'))} | {_gib(t.get('hbm_bytes'))} | {fits} | "
            f"{_gib((plans.get('accelerator') or {}).get('total'))} | "
            f"{r.get('state', '-')} | {q.get('accelerator_temp', '-')} | "
            f"**{q.get('accelerator_total', '-')}** | {q.get('cpu_temp', '-')} | "
            f"{q.get('cpu_total', '-')} | {flops} | {model} |")
    head = ("| model | sharding | target | mesh (data x fsdp x model) | batch / remat | compile |"
            " XLA args GiB | XLA temp GiB | XLA peak GiB | HBM GiB | fits | planner GiB |"
            " plan/XLA state | plan/XLA temp | plan/XLA total | every-residual plan/XLA temp |"
            " every-residual plan/XLA total | plan/XLA FLOPs | step model (predicted, MFU "
            "ceiling) |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    return head + "\n" + "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "aot.json"))
    p.add_argument("--md", default=os.path.join(ROOT, "benchmarks", "aot.md"))
    p.add_argument("--python", default=sys.executable, help="interpreter with the compilers")
    p.add_argument("--lock", default="/tmp/t5x_heavy.lock", help="flock file ('' for none)")
    p.add_argument("--only", default="", help="run configs whose id contains this")
    p.add_argument("--heavy", action="store_true", help="also the 11B configs (~19 GB RAM)")
    p.add_argument("--redo", action="store_true", help="recompile cached configs")
    p.add_argument("--render", action="store_true", help="only rewrite the markdown")
    p.add_argument("--replan", action="store_true",
                   help="re-run the current planner for every cached result (no compiles)")
    p.add_argument("--timeout_s", type=float, default=3600)
    args = p.parse_args(argv)
    results = _load(args.json)
    if args.replan:
        for key, res in list(results.items()):
            if res.get("report"):
                res["replan"] = replan(res["report"])
                print(f"[bench_aot] replanned {key}: {ratios(res)}", flush=True)
                latest = _load(args.json)  # a running compile may have added results meanwhile
                latest[key] = res
                _save(args.json, latest)
        results = _load(args.json)
    todo = [] if args.render or args.replan else [
        c for c in CONFIGS if args.only in c.id and (args.heavy or not c.heavy)
        and (args.redo or c.id not in results)]
    for i, cfg in enumerate(todo):
        if not args.redo and cfg.id in _load(args.json):  # done meanwhile by another run
            continue
        print(f"[bench_aot] {i + 1}/{len(todo)} {cfg.id} ...", flush=True)
        try:
            res = run_one(cfg, args.python, args.lock or None, args.timeout_s)
        except subprocess.TimeoutExpired:
            res = {"returncode": None, "wall_s": args.timeout_s, "timeout": True}
        if res["returncode"] == 2 and "report" not in res:  # setup error: report, do not cache
            print(f"[bench_aot] {cfg.id}: not run: {res['stderr_tail'].strip()[-500:]}",
                  flush=True)
            continue
        if res.get("report"):
            res["replan"] = replan(res["report"])
        results = _load(args.json)  # another run may have added results meanwhile
        results[cfg.id] = res
        _save(args.json, results)
        ratio = (res.get("report") or {}).get("plan_over_compiler")
        print(f"[bench_aot] {cfg.id}: exit {res['returncode']} in {res['wall_s']} s; "
              f"plan/XLA {ratio}", flush=True)
        _write_md(args.md, results)
    _write_md(args.md, results)
    return 0


INTRO = """# Offline (deviceless) compiles of the train step vs the planner

`scripts/bench_aot.py` compiles the trainer's real jitted train step (`python -m t5x_like.aot`,
pretrain.gin: span corruption 512/114, Adafactor, bf16, batch 128 unless named) for TPU slices
with libtpu's XLA:TPU and for GPUs with the XLA GPU compiler, on a 2-core CPU host with no
accelerator, and puts `t5x_like.plan`'s per-device estimate beside XLA's `memory_analysis`
(args = parameters + optimizer state + batch shard; peak = args + outputs - donated + temp).
plan/XLA state: (params + optimizer) / (args - batch); temp: the planner's temporaries
(`plan()['bytes_per_device']['temp']`) / XLA's temp; total: planner total / XLA peak; FLOPs:
planner / `cost_analysis` (XLA:GPU's compile-only executables report no cost analysis).
"every-residual": the planner's previous activation model (`plan(..., compiler='cpu')`: every
residual of the jaxpr, which XLA:CPU keeps), beside the default fused model
(`compiler='accelerator'`).

"""


NOTES = """
## What the compilers showed

- **Planner, XLA:TPU (fixed).** The planner counted every residual `jax.vjp` keeps in the jaxpr.
  Per attention layer that is the masked f32 scores, their f32 exponentials, the bf16
  probabilities and a bool mask, all of one `[batch, heads, q, k]` size; per MLP the GELU's
  four elementwise intermediates; per norm several f32 copies of the residual stream. XLA:CPU
  keeps these (the planner matched it, `tests/test_plan.py`), XLA:TPU recomputes every
  elementwise chain inside the backward fusions and stores only its roots (matmul /
  reduction / gather outputs). The default estimate counts those roots
  (`plan.activations._fusion_roots_*`, `plan(..., compiler='accelerator')`); the
  every-residual model was 2.3-2.7x XLA:TPU's peak. Parameters and
  optimizer state are exact (0.9995-1.0001), FLOPs within 2% (0.981-0.987).
- **XLA:GPU, deviceless (jax 0.10.2): cuBLAS GEMMs by default.** With Triton GEMMs the T5
  train steps do not compile deviceless: `Couldn't find output tile sizes that satisfy hlo`
  on the decoder self-attention out-projection (`bf16[1824, d_model]`, 1824 = 16 sequences x
  114 targets per GPU; the `triton_gemm` row). On a real H100 (jax 0.11.2, with autotuning)
  the same step compiles, and its autotuner chose cuBLAS/cuBLASLt for 103 of its 114 GEMMs
  (`h100/autotune_h100_jax0.11.2.textproto`), so `python -m t5x_like.aot` now compiles GPU
  targets with `xla_gpu_enable_triton_gemm=false` unless told otherwise. The step model of the
  deviceless T5-base Pallas step is within 3% of the one of the H100's own compile
  (134.2 vs 138.0 ms, `h100/gpu_step.md`).
- **`attention_impl='cudnn'` compiles as XLA attention deviceless**: cuDNN builds its graphs on
  the GPU and jax's cuDNN path needs the library to trace, so those rows hold XLA's dense f32
  scores (the planner, modelling cuDNN, reads 0.51-0.56x there). The Pallas rows compile the
  real kernels.
- **Step model (predicted, per GPU).** At the paper's batch split over 8 H100s (16 sequences
  per GPU) it gives T5-base data parallel 14-22% MFU, against 41% for the whole batch on one
  GPU: the optimizer's ~9 ms and the small GEMMs do not shrink with the per-GPU batch. Keep
  the per-GPU batch at 128 or more on GPUs. The Pallas rows add the flash kernels' latency
  model (`aot.flash_time`, fitted on the H100 loan; one segment per row, nothing skipped):
  our kernels costed from their code rather than their FLOPs.
- **Planner, XLA:GPU (not calibrated).** XLA:GPU keeps more than XLA:TPU (no convert/epilogue
  fusion into cuBLAS GEMMs): the fused estimate is 0.61-0.76x of its peak for T5-small and
  T5-base on 8 x H100 with XLA or Pallas attention (every sharding), the every-residual one
  1.7-2.3x.
- **Planner, Pallas attention on TPU (fixed).** With `attention_impl='pallas'` the planner
  was 0.73x (T5-small) and 0.71x (T5-base) of XLA:TPU's peak, data parallel on v5e-16. The
  buffer assignment (`--xla_option=xla_dump_to=DIR`) shows why: the flash kernels' q, k, v and
  o keep the custom call's layout, head_dim minor, so a bf16[8,512,12,64] operand takes 12 MiB
  (64 lanes padded to 128), and XLA stores them as they are (six per layer live at the peak)
  where the planner had recomputed them from their projections at their logical size. It now
  counts them stored and padded on TPUs (`plan(..., platform='tpu')`,
  `plan.activations.is_kernel_operand`): 0.93x for both.
- **Planner, tensor parallelism (fixed).** With 12 heads on a model axis of 8 (`fsdp_tp` on
  8 x H100: mesh (1, 1, 8)) the planner kept the attention activations whole because 12 % 8
  != 0; GSPMD pads the split instead (2 of 16 padded heads per GPU). Counting ceil(d / m) of
  d: 0.89x of XLA:GPU's peak, was 2.09x.
- **Two fusion plans.** Deciding over all residuals at once stores a softmax's score matrix
  once, but over-counts residual-stream chains (under full remat it stored both layer outputs
  of every layer instead of their sum); visiting residuals in program order does the
  opposite. The planner takes the cheaper of the two per config (`plan.activations._FUSION_PLANS`).
- XLA:GPU's compile-only executables return no `cost_analysis` (no FLOPs column for GPU).
- **Planner, where XLA:TPU's peak is (fixed).** The buffer-assignment dumps of T5-small on
  v5e-16 (`python -m t5x_like.aot ... --xla_option=xla_dump_to=DIR`: `*-live-range.txt`,
  `*-buffer-assignment.txt`) put the peak where the backward pass starts: every residual, the
  logits and their f32 gradient live, almost no parameter gradient yet (gradients accumulate
  as residuals are freed). The planner added the whole gradient on top of the activations and
  left the logits gradient out, which matched data parallel (0.98-1.10x) by two errors
  cancelling and missed everywhere else (`remat='minimal'` 1.24x: the gradient, 0.92 GiB for
  T5-base, is a third of that step's temp). It now counts `max(activations + f32 logits
  gradient, gradients)` plus the gathered weights and the microbatch accumulator, times the
  allocator's fragmentation measured in the same dumps (heap / live peak: 1.06 data parallel,
  1.09 FSDP; `plan.HEAP_OVERHEAD = 1.08`). T5-base `remat='minimal'`: 1.24x -> 0.96x.
- **Planner, FSDP (fixed).** At the same per-device batch XLA:TPU's FSDP step keeps twice the
  residual-stream copies of data parallel: a norm's `x * rsqrt(var) * scale` reads the
  all-gathered `scale` (an all-reduce output), and XLA does not recompute a chain through a
  collective's output inside the backward fusion, it stores it. The planner now stores such
  chains when the weights are split over `fsdp` (`plan.activations._fusion_roots_*(..., gathered)`):
  `fsdp` on v5e-16 T5-small 0.68x -> 0.87x, T5-base 0.735x -> 0.87x. With a `model` axis as
  well (`fsdp_tp`) the dumps show XLA recomputing the norm outputs again (only the norm inputs
  are stored, T5-small and T5-base alike), so the rule is for pure FSDP. The rest of the FSDP
  gap is collective buffers and MLP / projection copies XLA's schedule keeps longer (per-shape
  diff of the live sets), unmodelled.
  XLA's `cost_analysis` reports ~22% fewer FLOPs for the FSDP steps than for the same model
  data parallel (hence plan/XLA FLOPs 1.26-1.28 there); the computation is the same, so the
  planner is left as it is.
- **Planner, FSDP + TP (fixed).** With heads x head_dim == d_model (T5: 12 x 64 = 768) the
  planner could not tell the q/k/v / attention-output activations (split over `model`) from
  the residual stream (replicated) and counted them whole. It now traces with head_dim + 2 and
  counts each dimension at its true size. T5-base `fsdp_tp` (1x4x4): 1.21x -> 0.97x, T5-small
  0.87x.
- **T5 v1.1-XXL (11B), the scaling guide's pod config.** `fsdp`, remat='minimal', batch 2,048
  on v5p-128 compiles in 5 min on this 2-core host (`--heavy`): 56.2 GiB peak of 95 per chip,
  fits; planner 0.968x of XLA's peak, parameters and optimizer state exact (0.9997), FLOPs
  0.997.
- **T5-large.** `fsdp` on 8 x H100 (cuBLAS GEMMs) compiles: 25.8 GiB peak of 80, planner 0.67x
  (the uncalibrated GPU model). On v5e-16 the compile ran out of this machine's 24 GiB host RAM
  after 7 min (killed by the kernel OOM killer), so it runs only with `--heavy`; not measured.
- The kernels' own compile results are in `flash_gpu_blocks.md` (every candidate block size
  on sm_80 / sm_86 / sm_90: registers, spills, shared memory, pipelined loads) and
  `flash_tpu_compile.md` (v4 / v5e / v5p / v6e, every variant, VMEM, FLOPs).
"""


def _write_md(path: str, results: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(INTRO)
        f.write(render(results))
        f.write(NOTES)


if __name__ == "__main__":
    sys.exit(main())
