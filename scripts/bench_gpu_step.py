"""The train step on one GPU, for a lease: every variant compiled once, timed in interleaved rounds.

A lease is short (minutes) and a fresh process per measurement (`bench_train.py`) spends most of
it compiling and initialising. Here two long-lived workers hold every variant ready:

- the JAX worker compiles each variant of our jitted train step (model x batch x attention x
  XLA options, options given per compile so one process holds them all), warms it up and keeps
  its state and two device batches;
- the PyTorch worker builds the same models in Hugging Face transformers (fp32 weights, bf16
  autocast, T5's Adafactor), eager and `torch.compile`d.

The coordinator then runs rounds: in each, every ready variant times `--steps` steps
(dispatched back to back as the trainer does, one sync at the end), in an order rotated round
by round, so ours and PyTorch alternate on the same warm GPU. Variants still compiling after
`--ready_by` seconds join later rounds. `--torch_after_jax` runs PyTorch's rounds after ours
instead, each side alone on the GPU (memory: Hugging Face's eager T5-base at batch 128 needs
most of an 80 GB card). After the first round it traces the `--profile` variants with
`jax.profiler` and reduces the trace on the machine to a per-kernel table (kernel, HLO op,
kind, region, ms/step) and a sum by kind, small enough to come back from the lease, checked
against the step model of the same HLO (`t5x_like.aot.roofline`); it also keeps their
optimised HLO and XLA's autotuning results (`autotune.textproto`, loadable offline with
`--xla_gpu_load_autotune_results_from`).

Results go to `<out_dir>/gpu_step_rounds.jsonl` as they arrive (`--resume` keeps those and
measures only the missing), then `gpu_step.{json,md}`. `--budget_s` stops starting new
measurements in time to write the report. On CPU it runs as a smoke test (tiny model,
`--smoke`), which is how CI checks it.

    python scripts/bench_gpu_step.py --out_dir $OUT [--rounds 3] [--steps 10]
        [--variants base:128:cudnn,base:128:cudnn:cublas,...] [--torch base:128,small:128]
        [--profile base:128:cudnn] [--budget_s 480] [--torch_after_jax] [--resume]
    python scripts/bench_gpu_step.py --render --out_dir benchmarks/h100 \
        --hlo_tar benchmarks/h100/raw/gpu_step_hlo.tar

A variant is `model:batch:attention[:options]`; models are bench_train's (`base` and `small`
abbreviate `t5_1_1_base` / `t5_1_1_small`), attention a key of bench_train's `ATTENTIONS`
(`pallas_hopper`: our kernel's Hopper build), options a name in `OPTION_SETS`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_train  # noqa: E402  (model configs, random batches, the Hugging Face twin)
from gpu_profile import (  # noqa: E402  (the per-kernel table and its calibration)
    calibrate,
    hlo_index,
    load_trace,
    reclassify,
    reduce_trace,
)
from gpu_step_report import summarize, write_report  # noqa: E402  (the report)

ALIASES = {"base": "t5_1_1_base", "small": "t5_1_1_small"}
#: XLA options per compile (`Lowered.compile(compiler_options=...)`), by name.
OPTION_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    # Every GEMM through cuBLAS: no Triton GEMM fusions (XLA autotunes Triton vs cuBLAS otherwise).
    "cublas": {"xla_gpu_enable_triton_gemm": False},
    # cuBLASLt GEMMs (epilogue fusion of bias/activation in the library).
    "cublaslt": {"xla_gpu_enable_cublaslt": True},
    # Default XLA options, the optimizer on stacks of same-shaped parameters.
    "multi_tensor": {},
}
#: Option sets that change the optimizer rather than XLA: `create_optimizer` keywords.
OPTIMIZER_OPTIONS: dict[str, dict[str, Any]] = {"multi_tensor": {"multi_tensor": True}}
DEFAULT_VARIANTS = (
    "base:128:cudnn,base:128:pallas,base:128:xla,base:128:cudnn:cublas,base:32:cudnn,"
    "small:128:cudnn,small:128:pallas,small:128:xla,small:256:cudnn,small:32:cudnn"
)
DEFAULT_TORCH = "base:128,small:128"
DEFAULT_PROFILE = "base:128:cudnn,small:128:cudnn"
SMOKE = dict(variants="tiny:8:xla,tiny:8:xla:cublas", torch="tiny:8", profile="tiny:8:xla",
             rounds=2, steps=2, ready_by=240.0)  # --smoke: these unless given explicitly


def parse_variant(text: str) -> dict[str, Any]:
    """`model:batch:attention[:options]` -> a variant record (`name` is the text itself)."""
    parts = text.split(":")
    if len(parts) not in (3, 4):
        raise ValueError(f"variant {text!r}: expected model:batch:attention[:options]")
    model = ALIASES.get(parts[0], parts[0])
    options = parts[3] if len(parts) == 4 else "default"
    if model not in bench_train.MODELS:
        raise ValueError(f"variant {text!r}: unknown model; choose from "
                         f"{sorted(bench_train.MODELS)}")
    if parts[2] not in bench_train.ATTENTIONS:
        raise ValueError(f"variant {text!r}: attention must be one of "
                         f"{', '.join(bench_train.ATTENTIONS)}")
    if options not in OPTION_SETS:
        raise ValueError(f"variant {text!r}: options must be one of {sorted(OPTION_SETS)}")
    return {"name": text, "model": model, "batch": int(parts[1]), "attention": parts[2],
            "options": options}


def parse_torch(text: str, modes: tuple[str, ...] = ("eager", "compile")
                ) -> list[dict[str, Any]]:
    """`model:batch` -> its PyTorch variants, eager and/or `torch.compile`d."""
    model, batch = text.split(":")
    model = ALIASES.get(model, model)
    if not bench_train.MODELS.get(model, {}).get("torch"):
        raise ValueError(f"torch variant {text!r}: no Hugging Face twin for {model}")
    return [{"name": f"torch:{text}:{mode}", "model": model, "batch": int(batch), "mode": mode}
            for mode in modes]


# --- the JAX worker ----------------------------------------------------------------------------

class JaxVariant:
    """One compiled train step with its own state and device batches. `initial` caches one
    initialised state per model (parameters do not depend on the attention or XLA options),
    copied for each variant, so a lease compiles one init per model."""

    def __init__(self, spec: dict[str, Any], dtype: str, initial: dict[str, Any]) -> None:
        import jax
        import jax.numpy as jnp
        import numpy as np

        from t5x_like.models import make_model
        from t5x_like.train import partitioning, train_state, train_step
        from t5x_like.train.optimizers import create_optimizer

        self.spec = spec
        cfg = bench_train.model_config(spec["model"], dtype, spec["attention"])
        self.model = make_model(cfg)
        mesh = partitioning.create_mesh((-1, 1, 1))
        rules = partitioning.logical_axis_rules("fsdp")
        opt = create_optimizer("adafactor", **OPTIMIZER_OPTIONS.get(spec["options"], {}))
        self.seq = bench_train.MODELS[spec["model"]]["lengths"]
        example = self.model.example_batch(jax.device_count(), self.seq, packed=True)
        plan = train_state.sharded_state(self.model, opt, example, mesh, rules)
        if spec["model"] not in initial:
            initial[spec["model"]] = train_state.create_state(plan, jax.random.key(0), mesh,
                                                              rules)
        self.state = jax.tree.map(jnp.copy, initial[spec["model"]])
        self.step = train_step.jit_train_step(train_step.make_train_step(self.model, opt), plan,
                                              mesh, rules)
        rng = np.random.default_rng(0)
        sharding = partitioning.batch_sharding(mesh, rules)
        self.batches = [jax.device_put(bench_train.random_batch(
            self.model, self.seq, spec["batch"], rng, cfg.vocab_size), sharding)
            for _ in range(2)]
        self.rng = jax.random.key(1)
        self.lowered = self.step.lower(self.state, self.batches[0], self.rng)
        self.compiled = None
        self.flops_per_step = self.model.flops_per_sequence(self.seq) * spec["batch"]

    def compile(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.compiled = self.lowered.compile(OPTION_SETS[self.spec["options"]] or None)
        out = {"compile_s": time.perf_counter() - t0, "flops_per_step": self.flops_per_step}
        try:
            mem = self.compiled.memory_analysis()
            out["temp_gib"] = mem.temp_size_in_bytes / 2**30
            out["argument_gib"] = mem.argument_size_in_bytes / 2**30
        except Exception:  # noqa: BLE001 - not every backend reports it
            pass
        try:
            cost = self.compiled.cost_analysis()
            cost = cost[0] if isinstance(cost, list) else cost
            out["xla_flops"] = float(cost.get("flops", 0.0))
            out["xla_bytes"] = float(cost.get("bytes accessed", 0.0))
        except Exception:  # noqa: BLE001
            pass
        return out

    def run(self, steps: int) -> tuple[float, float]:
        """Seconds per step over `steps` steps dispatched back to back, and the last loss."""
        import jax

        jax.block_until_ready(self.state)
        t0 = time.perf_counter()
        for i in range(steps):
            self.state, metrics = self.compiled(self.state, self.batches[i % 2], self.rng)
        jax.block_until_ready((self.state, metrics))
        return (time.perf_counter() - t0) / steps, float(metrics["loss"])


class Preparer:
    """Builds and warms up variants in a background thread (in the given order; compiles after
    the first on `threads` threads) while the worker already answers commands: `status` says
    which are ready, so a coordinator can start measuring before the slowest compile ends."""

    def __init__(self, specs: list[dict[str, Any]], build, threads: int) -> None:
        self.ready: dict[str, Any] = {}
        self.info: dict[str, dict[str, Any]] = {}
        self.done = False
        self._specs, self._build, self._threads = specs, build, threads
        threading.Thread(target=self._run, daemon=True).start()

    def _one(self, name: str, variant: Any) -> None:
        try:
            self.info[name] = variant.compile()
            _log(f"compiled {name} in {self.info[name]['compile_s']:.0f} s")
            for _ in range(2):  # warm-up: first execution allocates, autotuned kernels load
                variant.run(1)
            self.ready[name] = variant
            _log(f"ready {name}")
        except Exception as e:  # noqa: BLE001 - e.g. out of memory: reported, others go on
            self.info[name] = {**self.info.get(name, {}), "error": _error(e)}
            _log(f"failed {name}: {self.info[name]['error']}")

    def _run(self) -> None:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(max(1, self._threads)) as pool:
            futures = []
            for i, spec in enumerate(self._specs):  # building (tracing) stays on this thread
                t0 = time.perf_counter()
                try:
                    variant = self._build(spec)
                except Exception as e:  # noqa: BLE001 - reported; the others go on
                    self.info[spec["name"]] = {"error": _error(e)}
                    _log(f"failed to build {spec['name']}: {_error(e)}")
                    continue
                _log(f"built {spec['name']} in {time.perf_counter() - t0:.0f} s")
                if i == 0:  # alone: its autotuning fills the process cache the others reuse
                    self._one(spec["name"], variant)
                else:
                    futures.append(pool.submit(self._one, spec["name"], variant))
            concurrent.futures.wait(futures)
        self.done = True
        _log("all variants prepared")

    def status(self) -> dict[str, Any]:
        return {"ready": list(self.ready), "done": self.done, "info": dict(self.info)}


def jax_worker(specs: list[dict[str, Any]], out_dir: Path, threads: int) -> None:
    """Serve `status` / `time` / `profile` / `peak` commands (JSON lines on stdin)."""
    import jax

    from t5x_like.train import metrics

    dtype = "float32" if jax.devices()[0].platform == "cpu" else "bfloat16"
    initial: dict[str, Any] = {}
    prep = Preparer(specs, lambda spec: JaxVariant(spec, dtype, initial), threads)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "quit":
                break
            if cmd["cmd"] == "status":
                _send({"event": "status", **prep.status(), "device": _jax_device()})
                continue
            if cmd["cmd"] == "peak":
                _send({"event": "result", **_jax_peak()})
                continue
            v = prep.ready.get(cmd["name"])
            if v is None:
                _send({"event": "result", "error": prep.info.get(cmd["name"], {}).get(
                    "error", "not ready")})
                continue
            if cmd["cmd"] == "time":
                step_s, loss = v.run(cmd["steps"])
                dev = jax.devices()[0]
                _send({"event": "result", "step_s": step_s, "loss": loss,
                       "mfu": metrics.mfu(v.flops_per_step / step_s, 1, dev.device_kind),
                       "tflops": v.flops_per_step / step_s / 1e12})
            elif cmd["cmd"] == "profile":
                _send({"event": "result", **_profile(v, cmd.get("steps", 3), out_dir)})
        except Exception as e:  # noqa: BLE001 - keep serving the other variants
            _send({"event": "result", "error": _error(e)})


def _profile(v: JaxVariant, steps: int, out_dir: Path) -> dict[str, Any]:
    import jax

    hlo_text = v.compiled.as_text()
    slug = re.sub(r"[^\w.-]", "_", v.spec["name"])
    with gzip.open(out_dir / f"hlo_{slug}.txt.gz", "wt") as f:
        f.write(hlo_text)
    v.run(2)
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d, create_perfetto_trace=True)
        step_s, _ = v.run(steps)
        jax.profiler.stop_trace()
        events = load_trace(d)
    profile = reduce_trace(events, hlo_index(hlo_text), steps, step_s)
    return {"profile": profile, "step_model": calibrate(profile, hlo_text),
            "hlo_file": f"hlo_{slug}.txt.gz"}


def _jax_peak() -> dict[str, Any]:
    """bench_train's matmul peak (bf16 8192^3 on random data on an accelerator), in TFLOP/s."""
    peak = bench_train.worker_peak()
    return {"peak_tflops": peak["jax_gflops"] / 1e3, "matmul": peak["matmul"]}


def _jax_device() -> str:
    import jax

    d = jax.devices()[0]
    return f"{jax.device_count()}x {d.device_kind} ({d.platform}), jax {jax.__version__}"


# --- the PyTorch worker ------------------------------------------------------------------------

class TorchVariant:
    """Hugging Face T5 with T5's Adafactor: fp32 weights, bf16 autocast on a GPU; `compile`
    wraps the model in `torch.compile` (the optimizer stays eager, as users run it). A batch
    that does not fit is split into microbatches with accumulated gradients (recorded)."""

    def __init__(self, spec: dict[str, Any], device: str) -> None:
        import torch
        from transformers import T5ForConditionalGeneration
        from transformers.optimization import Adafactor

        self.spec, self.device = spec, device
        torch.manual_seed(0)
        cfg = bench_train.model_config(spec["model"], "float32")
        self.model = T5ForConditionalGeneration(bench_train.torch_t5_config(cfg)).train().to(device)
        self.forward = torch.compile(self.model) if spec["mode"] == "compile" else self.model
        self.opt = Adafactor(self.model.parameters(), lr=1e-2, scale_parameter=True,
                             relative_step=False, warmup_init=False, decay_rate=-0.8,
                             clip_threshold=1.0)
        seq = bench_train.MODELS[spec["model"]]["lengths"]
        g = torch.Generator().manual_seed(0)
        hi = cfg.vocab_size - 100
        self.batches = [(torch.randint(3, hi, (spec["batch"], seq["inputs"]), generator=g),
                         torch.randint(3, hi, (spec["batch"], seq["targets"]), generator=g))
                        for _ in range(2)]
        self.batches = [(a.to(device), b.to(device)) for a, b in self.batches]
        self.microbatches = 1
        self.flops_per_step = None

    def _step(self, inputs, labels) -> float:
        import torch

        autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device == "cuda")
        n = self.microbatches
        total = 0.0
        for i in range(n):
            sl = slice(i * inputs.shape[0] // n, (i + 1) * inputs.shape[0] // n)
            with autocast:
                out = self.forward(input_ids=inputs[sl], labels=labels[sl])
            (out.loss / n).backward()
            total = out.loss.detach()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return total

    def warm_up(self) -> None:
        import torch

        while True:
            try:
                for _ in range(2):
                    self._step(*self.batches[0])
                self._sync()
                return
            except torch.OutOfMemoryError:
                self.opt.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                if self.microbatches >= 8:
                    raise
                self.microbatches *= 2

    def _sync(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()

    def run(self, steps: int) -> tuple[float, float]:
        self._sync()
        t0 = time.perf_counter()
        for i in range(steps):
            loss = self._step(*self.batches[i % 2])
        self._sync()
        return (time.perf_counter() - t0) / steps, float(loss)


def torch_worker(specs: list[dict[str, Any]], mem_fraction: float) -> None:
    """Serve `time` commands over the PyTorch variants (built and warmed up first)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.cuda.set_per_process_memory_fraction(mem_fraction)
    import transformers

    variants: dict[str, TorchVariant] = {}
    info: dict[str, dict[str, Any]] = {}
    for spec in specs:
        t0 = time.perf_counter()
        try:
            v = TorchVariant(spec, device)
            v.warm_up()
            variants[spec["name"]] = v
            info[spec["name"]] = {"compile_s": time.perf_counter() - t0,
                                  "microbatches": v.microbatches}
        except Exception as e:  # noqa: BLE001 - reported; the others go on
            info[spec["name"]] = {"error": _error(e)}
        if device == "cuda":
            torch.cuda.empty_cache()
    _send({"event": "ready", "info": info,
           "framework": f"transformers {transformers.__version__} + torch {torch.__version__} "
                        f"({device}{', bf16 autocast' if device == 'cuda' else ''})"})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            break
        v = variants.get(cmd["name"])
        if v is None:
            _send({"event": "result", "error": info.get(cmd["name"], {}).get("error",
                                                                              "not built")})
            continue
        try:
            step_s, loss = v.run(cmd["steps"])
            _send({"event": "result", "step_s": step_s, "loss": loss,
                   "microbatches": v.microbatches})
        except Exception as e:  # noqa: BLE001
            _send({"event": "result", "error": _error(e)})
        if device == "cuda":
            torch.cuda.empty_cache()


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _send(obj: dict[str, Any]) -> None:
    sys.stdout.write("@@" + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _error(e: BaseException) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}"[:400]


# --- the coordinator ---------------------------------------------------------------------------

class Worker:
    """A worker subprocess speaking JSON lines (prefixed '@@' on stdout; the rest is logged)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log.open("a")
        self.proc = subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("@@"):
                self.queue.put(json.loads(line[2:]))
            elif not self.log.closed:
                self.log.write(line)
                self.log.flush()
        self.queue.put({"event": "exit", "error": f"worker exited ({self.proc.wait()})"})

    def get(self, timeout: float) -> dict[str, Any]:
        try:
            return self.queue.get(timeout=max(1.0, timeout))
        except queue.Empty:
            return {"event": "timeout", "error": f"no answer in {timeout:.0f} s"}

    def poll(self) -> dict[str, Any] | None:
        """The next message if one is waiting, else None."""
        try:
            return self.queue.get_nowait()
        except queue.Empty:
            return None

    def ask(self, cmd: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self.proc.poll() is not None:
            return {"error": "worker is gone"}
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.get(timeout)

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001
            self.proc.kill()
        self.log.close()


def main() -> None:  # noqa: C901 - the coordinator's one sequence, read top to bottom
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=DEFAULT_VARIANTS)
    p.add_argument("--torch", default=DEFAULT_TORCH, help="model:batch list ('' for none)")
    p.add_argument("--torch_modes", default="eager,compile",
                   help="PyTorch variants per model: eager and/or compile (torch.compile)")
    p.add_argument("--profile", default=DEFAULT_PROFILE)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--budget_s", type=float, default=480.0,
                   help="start no measurement after this many seconds; the report is written")
    p.add_argument("--ready_by", type=float, default=300.0,
                   help="start measuring after this many seconds even if some variants are "
                        "still compiling (they join later rounds when ready)")
    p.add_argument("--compile_threads", type=int, default=3)
    p.add_argument("--torch_after_jax", action="store_true",
                   help="run PyTorch after ours (each alone on the GPU) instead of interleaved")
    p.add_argument("--jax_until", type=float, default=330.0,
                   help="with --torch_after_jax: seconds after which ours stops measuring")
    p.add_argument("--torch_mem_fraction", type=float, default=None,
                   help="PyTorch's share of GPU memory (default 0.45 interleaved, 0.9 after ours)")
    p.add_argument("--out_dir", default=str(REPO / "benchmarks" / "h100"))
    p.add_argument("--resume", action="store_true",
                   help="keep the rows already in <out_dir>/gpu_step_rounds.jsonl")
    p.add_argument("--smoke", action="store_true", help="the tiny CPU configuration (CI)")
    p.add_argument("--render", action="store_true",
                   help="rewrite gpu_step.md from <out_dir>/gpu_step.json, measuring nothing; "
                        "with --hlo_tar, first reclassify the profiles' kernels against the "
                        "optimised HLO the lease brought back")
    p.add_argument("--hlo_tar", default=None,
                   help="with --render: the tar of optimised HLO a lease brought back")
    p.add_argument("--worker", choices=("jax", "torch"), help=argparse.SUPPRESS)
    p.add_argument("--specs", help=argparse.SUPPRESS)
    args = p.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.worker == "jax":
        return jax_worker(json.loads(args.specs), out_dir, args.compile_threads)
    if args.worker == "torch":
        return torch_worker(json.loads(args.specs), args.torch_mem_fraction)
    if args.render:
        return render(out_dir, args.hlo_tar)
    if args.smoke:
        for k, v in SMOKE.items():  # what the command line left at its default
            if getattr(args, k) == p.get_default(k):
                setattr(args, k, v)
    if args.torch_mem_fraction is None:
        args.torch_mem_fraction = 0.9 if args.torch_after_jax else 0.45
    start = time.monotonic()
    specs = [parse_variant(v) for v in args.variants.split(",") if v]
    modes = tuple(m for m in args.torch_modes.split(",") if m)
    torch_specs = [t for v in args.torch.split(",") if v for t in parse_torch(v, modes)]
    profile_names = [v for v in args.profile.split(",") if v]
    log = out_dir / "gpu_step_rounds.jsonl"
    rows = ([json.loads(x) for x in log.read_text().splitlines() if x.strip()]
            if args.resume and log.exists() else [])
    if not args.resume:
        log.write_text("")
    done = {(r["kind"], r["name"], r.get("round")) for r in rows if "error" not in r}
    need = lambda kind, name, rnd=None: (kind, name, rnd) not in done
    todo = [s for s in specs if any(need("time", s["name"], i) for i in range(args.rounds))
            or (s["name"] in profile_names and need("profile", s["name"]))]
    todo_torch = [s for s in torch_specs
                  if any(need("time", s["name"], i) for i in range(args.rounds))]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
           "XLA_PYTHON_CLIENT_MEM_FRACTION": os.environ.get(
               "BENCH_JAX_MEM_FRACTION", "0.9" if args.torch_after_jax else "0.5"),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    flags = env.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = (f"{flags} --xla_gpu_dump_autotune_results_to="
                        f"{out_dir / 'autotune.textproto'} --xla_gpu_per_fusion_autotune_cache_dir="
                        f"{out_dir / 'autotune_cache'}").strip()
    seed = os.environ.get("BENCH_AUTOTUNE_SEED")  # a per-fusion cache from an earlier lease
    if seed and Path(seed).is_dir() and not (out_dir / "autotune_cache").exists():
        shutil.copytree(seed, out_dir / "autotune_cache")
    workers: dict[str, Worker] = {}
    info: dict[str, Any] = {r["name"]: {k: v for k, v in r.items() if k not in ("kind", "name")}
                            for r in rows if r["kind"] == "info"}  # compile times, memory
    header: dict[str, Any] = {"rounds": args.rounds, "steps": args.steps,
                              "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                              "torch_after_jax": args.torch_after_jax}
    ready: dict[str, set] = {"jax": set(), "torch": set()}
    owner = {s["name"]: "jax" for s in todo} | {s["name"]: "torch" for s in todo_torch}
    saved = out_dir / "gpu_step_profiles.json"
    profiles: dict[str, Any] = (json.loads(saved.read_text()) if args.resume and saved.exists()
                                else {})

    def launch(kind: str) -> None:
        if kind == "jax" and todo:
            workers["jax"] = Worker(["--worker", "jax", "--specs", json.dumps(todo),
                                     "--out_dir", str(out_dir), "--compile_threads",
                                     str(args.compile_threads)], env, out_dir / "worker_jax.log")
        if kind == "torch" and todo_torch:
            workers["torch"] = Worker(["--worker", "torch", "--specs", json.dumps(todo_torch),
                                       "--torch_mem_fraction", str(args.torch_mem_fraction)],
                                      {**os.environ, "PYTHONUNBUFFERED": "1"},
                                      out_dir / "worker_torch.log")

    def poll() -> bool:
        """Refresh which variants are ready; True when every worker has prepared all."""
        done = True
        if "jax" in workers:
            st = workers["jax"].ask({"cmd": "status"}, 60.0)
            info.update(st.get("info", {}))
            ready["jax"] = set(st.get("ready", []))
            header["device"] = st.get("device", header.get("device"))
            done &= bool(st.get("done")) or workers["jax"].proc.poll() is not None
        if "torch" in workers and not header.get("torch_framework"):
            msg = workers["torch"].poll()
            if msg and msg.get("event") == "ready":
                info.update(msg.get("info", {}))
                ready["torch"] = {n for n, i in msg["info"].items() if "error" not in i}
                header["torch_framework"] = msg.get("framework")
            elif msg and msg.get("event") in ("exit", "timeout"):
                header["torch_framework"] = f"not run ({msg.get('error')})"
            else:
                done = False
        return done

    def record(row: dict[str, Any]) -> None:
        rows.append(row)
        with log.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    def measure(until: float) -> None:
        """Rounds over the running workers' ready variants until `until` (monotonic)."""
        phase_start = time.monotonic()
        while not poll() and time.monotonic() - phase_start < args.ready_by:
            time.sleep(5)
        print(json.dumps({"ready": {k: sorted(v) for k, v in ready.items()},
                          "after_s": time.monotonic() - start}), flush=True)
        left_ = lambda: until - time.monotonic()
        for rnd in range(args.rounds):
            if rnd:
                poll()  # variants that became ready since join from this round on
            entries = ([("peak", "jax")] if "jax" in workers else []) + [
                (s["name"], owner[s["name"]]) for s in [*specs, *torch_specs]
                if owner.get(s["name"]) in workers]
            shift = rnd % max(1, len(entries))
            for name, who in entries[shift:] + entries[:shift]:
                kind = "peak" if name == "peak" else "time"
                if (not need(kind, name, rnd) or left_() < 5
                        or (kind == "time" and name not in ready[who])):
                    continue
                cmd = {"cmd": "peak"} if kind == "peak" else {"cmd": "time", "name": name,
                                                              "steps": args.steps}
                res = workers[who].ask(cmd, left_() + 60)
                res.pop("event", None)
                record({"kind": kind, "name": name, "round": rnd, **res})
            if rnd == 0 and "jax" in workers:
                for name in profile_names:
                    if name in ready["jax"] and need("profile", name) and left_() > 20:
                        res = workers["jax"].ask({"cmd": "profile", "name": name}, left_() + 60)
                        res.pop("event", None)
                        row = {"kind": "profile", "name": name, **res}
                        record({k: v for k, v in row.items() if k != "profile"} | {
                            "profile_top": (res.get("profile") or {}).get("by_kind_ms")})
                        profiles[name] = row
                        (out_dir / "gpu_step_profiles.json").write_text(
                            json.dumps(profiles) + "\n")

    def keep_info() -> None:
        for name in owner:
            if name in info and (not rows or all(
                    r["kind"] != "info" or r["name"] != name for r in rows)):
                record({"kind": "info", "name": name, **info[name]})

    end = start + args.budget_s
    if args.torch_after_jax:  # each side alone on the GPU (memory), ours first
        launch("jax")
        measure(min(end, start + args.jax_until))
        keep_info()
        for w in workers.values():
            w.close()
        workers.clear()
        launch("torch")
        measure(end)
    else:
        launch("jax")
        launch("torch")
        measure(end)
    keep_info()
    for w in workers.values():
        w.close()
    peak_row = next((r for r in rows if r.get("kind") == "peak" and "matmul" in r), {})
    header["matmul"] = peak_row.get("matmul", "")
    header["device"] = header.get("device") or next(
        (r.get("device") for r in rows if r.get("device")), "unknown")
    header["elapsed_s"] = time.monotonic() - start
    summary = summarize(rows, specs, torch_specs, info)
    write_report(summary, header, profiles, out_dir)
    _bundle(out_dir)
    print((out_dir / "gpu_step.md").read_text())


def render(out_dir: Path, hlo_tar: str | None = None) -> None:
    """gpu_step.md again from gpu_step.json (and the profiles reclassified, given the HLO)."""
    saved = json.loads((out_dir / "gpu_step.json").read_text())
    profiles = saved.pop("profiles", {})
    if hlo_tar:
        with tarfile.open(hlo_tar) as tar:
            for row in profiles.values():
                member = row.get("hlo_file")
                if "profile" in row and member in tar.getnames():
                    text = gzip.decompress(tar.extractfile(member).read()).decode()
                    row["profile"] = reclassify(row["profile"], text)
                    row["step_model"] = calibrate(row["profile"], text)
    summary = {k: saved.pop(k) for k in ("variants", "peak_tflops") if k in saved}
    write_report(summary, saved, profiles, out_dir)


def _bundle(out_dir: Path) -> None:
    """The optimised HLO files and the workers' logs into one archive (a lease returns at
    most 8 files)."""
    hlos = sorted(out_dir.glob("hlo_*.txt.gz")) + sorted(out_dir.glob("worker_*.log"))
    cache = out_dir / "autotune_cache"
    if not hlos and not cache.is_dir():
        return
    with tarfile.open(out_dir / "bundle.tar", "w") as tar:
        for h in hlos:
            tar.add(h, arcname=h.name)
        if cache.is_dir():
            tar.add(cache, arcname=cache.name)
    for h in hlos:
        h.unlink()
    if cache.is_dir():
        shutil.rmtree(cache)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        raise
