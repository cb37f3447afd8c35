"""The two workers of `scripts/bench_gpu_step.py` (the coordinator): processes it starts with
`--worker jax|torch`, each holding its variants ready and answering JSON-line commands on stdin
('@@'-prefixed JSON on stdout; everything else is the log).

- JAX: our jitted train step per variant (model x batch x attention x XLA options), compiled in
  the background (`Preparer`) while it already answers; `profile` traces a variant and reduces
  the trace here (`gpu_profile.py`).
- PyTorch: the same models in Hugging Face transformers with T5's Adafactor, eager and
  `torch.compile`d.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import bench_train  # (model configs, random batches, the Hugging Face twin)
from gpu_profile import calibrate, hlo_index, load_trace, reduce_trace

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
