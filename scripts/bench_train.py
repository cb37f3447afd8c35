"""Benchmark the full train step (forward + backward + Adafactor update) against PyTorch.

Each measurement runs in a fresh process: ours (the trainer's jitted step, packed random
batches) and the same model in Hugging Face transformers + PyTorch (Adafactor, identical shapes;
fp32 on CPU, bf16 autocast on a GPU). A round runs every model on both sides, rotating which side
goes first, plus a large matmul in JAX (and PyTorch on CPU): the machine's measured matmul peak,
fp32 2048^3 on CPU, bf16 8192^3 on an accelerator. On an accelerator our side runs once per
`--attention` implementation (default xla, cudnn, pallas), activations in bf16, and later rounds
load our steps from a JAX compilation cache. The report gives per model (and attention) the
median step time of each side, the per-round ratio (PyTorch step / ours: above 1 means we are
faster) as median [min-max], our model FLOP/s against that peak, and MFU where the device's
peak is known. `--profile` adds where our step's time goes (XLA:CPU thunks from a
`jax.profiler` trace, grouped by forward / backward / optimizer and by kind). Writes
benchmarks/train.{md,json} (`--out_dir` elsewhere), and each worker's result to
train_rounds.jsonl as it arrives: `--resume` reruns only the workers missing there (a run cut
off by a time limit, e.g. on a leased GPU).

    python scripts/bench_train.py [--rounds 5] [--steps 5] [--models t5_1_1_small,tiny]
        [--attention xla,cudnn,pallas,pallas_hopper] [--profile] [--no_torch] [--note "..."]
        [--resume] [--render]

Models: `t5_1_1_small` (512/114, batch 2 on CPU), `tiny` (gin/models/tiny.gin at the tiny sweep
scale: BERT-style 64/64, batch 32), `t5_1_1_base` (512/114, batch 2 on CPU), and ours only:
`decoder_only_small`. On an accelerator the batch is 32 per device.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from t5x_like.runtime import host  # noqa: E402

#: name -> gin file, feature lengths, per-device batch on CPU, whether PyTorch has a twin.
MODELS: dict[str, dict[str, Any]] = {
    "t5_1_1_small": {"gin": "t5_1_1_small", "lengths": {"inputs": 512, "targets": 114},
                     "cpu_batch": 2, "torch": True},
    "tiny": {"gin": "tiny", "lengths": {"inputs": 64, "targets": 64}, "cpu_batch": 32,
             "torch": True},
    "t5_1_1_base": {"gin": "t5_1_1_base", "lengths": {"inputs": 512, "targets": 114},
                    "cpu_batch": 2, "torch": True},
    "decoder_only_small": {"gin": "decoder_only_small", "lengths": {"targets": 626},
                           "cpu_batch": 2, "torch": False},
}


#: Attention names the benchmarks take: an `attention_impl`, or `pallas_hopper` (our kernel's
#: Hopper build, `flash_backend='mosaic_gpu'`).
ATTENTIONS = {"xla": ("xla", "auto"), "cudnn": ("cudnn", "auto"), "pallas": ("pallas", "auto"),
              "pallas_hopper": ("pallas", "mosaic_gpu")}


def model_config(name: str, dtype: str, attention: str = "xla") -> Any:
    """The TransformerConfig of gin/models/<gin>.gin (dropout off, activations in ``dtype``,
    attention through ``attention``, a key of `ATTENTIONS`)."""
    import gin

    from t5x_like.models import TransformerConfig

    gin.clear_config()
    gin.add_config_file_search_path(str(REPO))  # the presets include gin/models/common/*.gin
    gin.parse_config_file(str(REPO / "gin" / "models" / f"{MODELS[name]['gin']}.gin"))
    cfg = TransformerConfig()
    gin.clear_config()
    if attention not in ATTENTIONS:
        raise ValueError(f"attention {attention!r}: choose from {sorted(ATTENTIONS)}")
    impl, backend = ATTENTIONS[attention]
    return cfg.replace(dropout_rate=0.0, dtype=dtype, attention_impl=impl, flash_backend=backend)


def random_batch(model: Any, seq: dict[str, int], batch: int, rng: Any,
                 vocab: int) -> dict[str, Any]:
    """Fresh random tokens, packed layout with two segments per row (never all zeros)."""
    import numpy as np

    out = {}
    for key, arr in model.example_batch(batch, seq, packed=True).items():
        n = arr.shape[1]
        if key.endswith("segment_ids"):
            out[key] = np.where(np.arange(n) < n // 2, 1, 2)[None].repeat(batch, 0)
        elif key.endswith("positions"):
            pos = np.arange(n)
            out[key] = np.where(pos < n // 2, pos, pos - n // 2)[None].repeat(batch, 0)
        elif key == "decoder_loss_weights":
            out[key] = np.ones((batch, n))
        elif key == "decoder_causal_attention":
            out[key] = np.zeros((batch, n))
        else:
            out[key] = rng.integers(3, vocab - 100, (batch, n))
    return {k: v.astype(np.int32) for k, v in out.items()}


def _our_step(name: str, batch: int, dtype: str, attention: str = "xla") -> tuple[Any, ...]:
    """(model, config, jitted train step, initial state), data parallel over the local devices."""
    import jax

    from t5x_like.models import make_model
    from t5x_like.train import partitioning, train_state, train_step
    from t5x_like.train.optimizers import create_optimizer

    cfg = model_config(name, dtype, attention)
    model = make_model(cfg)
    n_dev = jax.device_count()
    mesh = partitioning.create_mesh((-1, 1, 1))
    rules = partitioning.logical_axis_rules("fsdp")
    opt = create_optimizer("adafactor")
    example = model.example_batch(n_dev, MODELS[name]["lengths"], packed=True)
    plan = train_state.sharded_state(model, opt, example, mesh, rules)
    state = train_state.create_state(plan, jax.random.key(0), mesh, rules)
    step = train_step.jit_train_step(train_step.make_train_step(model, opt), plan, mesh, rules)
    return model, cfg, step, state


def worker_ours(name: str, batch: int, steps: int, dtype: str,
                attention: str = "xla") -> dict[str, Any]:
    """Median step time of our jitted train step (data parallel over the local devices)."""
    import jax
    import numpy as np

    from t5x_like.train import metrics

    model, cfg, step, state = _our_step(name, batch, dtype, attention)
    seq = MODELS[name]["lengths"]
    global_batch = batch * jax.device_count()
    rng = np.random.default_rng(0)
    batches = [random_batch(model, seq, global_batch, rng, cfg.vocab_size)
               for _ in range(steps + 1)]
    t0 = time.perf_counter()
    state, m = step(state, batches[0], jax.random.key(1))
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t0
    times = []
    for b in batches[1:]:
        t0 = time.perf_counter()
        state, m = step(state, b, jax.random.key(1))
        jax.block_until_ready((state, m))
        times.append(time.perf_counter() - t0)
    dt = statistics.median(times)
    flops = model.flops_per_sequence(seq) * global_batch
    return {"side": "ours", "model": name, "attention": attention,
            "framework": f"t5x_like (jax {jax.__version__}, {dtype} activations)",
            "device_kind": jax.devices()[0].device_kind, "num_devices": jax.device_count(),
            "batch": global_batch, "compile_s": compile_s, "step_s": dt, "steps_s": times,
            "flops_per_step": flops, "tokens_per_step": global_batch * sum(seq.values()),
            "mfu": metrics.mfu(flops / dt, jax.device_count(), jax.devices()[0].device_kind),
            "loss": float(m["loss"])}


def torch_t5_config(cfg: Any) -> Any:
    """The Hugging Face T5Config of an encoder-decoder TransformerConfig (same shapes)."""
    from transformers import T5Config

    acts = tuple(cfg.mlp_activations)
    ffn = {("gelu", "linear"): "gated-gelu", ("relu",): "relu", ("silu", "linear"): "gated-silu"}
    if acts not in ffn or cfg.family != "encoder_decoder":
        raise ValueError(f"no Hugging Face T5 twin for {cfg.family} with MLP {acts}")
    return T5Config(
        vocab_size=cfg.vocab_size, d_model=cfg.emb_dim, d_kv=cfg.head_dim, d_ff=cfg.mlp_dim,
        num_layers=cfg.num_encoder_layers, num_decoder_layers=cfg.num_decoder_layers,
        num_heads=cfg.num_heads, feed_forward_proj=ffn[acts],
        relative_attention_num_buckets=cfg.relative_attention_num_buckets,
        relative_attention_max_distance=cfg.relative_attention_max_distance,
        tie_word_embeddings=cfg.logits_via_embedding, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0)


def worker_torch(name: str, batch: int, steps: int, device: str = "cpu") -> dict[str, Any]:
    """The same step in transformers + PyTorch with T5's Adafactor settings: fp32 on CPU; on a
    GPU fp32 weights with bf16 autocast (PyTorch's mixed precision, as ours: fp32 parameters,
    bf16 activations)."""
    import contextlib

    import numpy as np
    import torch
    import transformers
    from transformers import T5ForConditionalGeneration
    from transformers.optimization import Adafactor

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    cfg = model_config(name, "float32")
    model = T5ForConditionalGeneration(torch_t5_config(cfg)).train().to(device)
    opt = Adafactor(model.parameters(), lr=1e-2, scale_parameter=True, relative_step=False,
                    warmup_init=False, decay_rate=-0.8, clip_threshold=1.0)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda"
                else contextlib.nullcontext())
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    seq = MODELS[name]["lengths"]
    rng = np.random.default_rng(0)
    times = []
    for i in range(steps + 1):
        inputs = torch.from_numpy(rng.integers(3, cfg.vocab_size - 100, (batch, seq["inputs"])))
        labels = torch.from_numpy(rng.integers(3, cfg.vocab_size - 100, (batch, seq["targets"])))
        inputs, labels = inputs.to(device), labels.to(device)
        sync()
        t0 = time.perf_counter()
        with autocast:
            out = model(input_ids=inputs, labels=labels)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if i:
            times.append(time.perf_counter() - t0)
    mixed = ", bf16 autocast" if device == "cuda" else ""
    return {"side": "torch", "model": name,
            "framework": f"transformers {transformers.__version__} + torch {torch.__version__} "
                         f"({device}{mixed})",
            "batch": batch, "step_s": statistics.median(times), "steps_s": times,
            "tokens_per_step": batch * sum(seq.values()), "loss": float(out.loss.detach())}


def worker_peak(reps: int = 10) -> dict[str, Any]:
    """GFLOP/s of an n x n x n matmul, median of reps: fp32 2048^3 in JAX (XLA:CPU) and PyTorch
    on CPU; bf16 8192^3 on random data in JAX on an accelerator."""
    import jax
    import jax.numpy as jnp

    on_cpu = jax.devices()[0].platform == "cpu"
    n, dtype = (2048, jnp.float32) if on_cpu else (8192, jnp.bfloat16)
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f(a, a).block_until_ready()
        times.append(time.perf_counter() - t0)
    out = {"side": "peak", "jax_gflops": 2 * n**3 / statistics.median(times) / 1e9,
           "matmul": f"{jnp.dtype(dtype).name} {n}^3"}
    if on_cpu:
        try:
            import torch
        except ImportError:
            return out
        torch.set_num_threads(os.cpu_count() or 1)
        t = torch.ones(n, n)
        t @ t
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            t @ t
            times.append(time.perf_counter() - t0)
        out["torch_gflops"] = 2 * n**3 / statistics.median(times) / 1e9
    return out


def _region(op_name: str) -> str:
    if "transpose(jvp(" in op_name:
        return "backward"
    return "forward" if "jvp(" in op_name else "optimizer"


def _kind(line: str, name: str) -> str:
    if "__ynn_fusion" in line or " dot(" in line or "custom-call(" in line:
        body = "matmul" if ("dot_general" in line or " dot(" in line) else "other YNNPACK op"
        return body if "reduce_sum" not in line else "reduction"
    if re.search(r"\b(copy|transpose)", name):
        return "copy / transpose"
    if "reduce" in name:
        return "reduction"
    if "scatter" in name or "gather" in name:
        return "gather / scatter"
    if "broadcast" in name and "wrapped" in name:
        return "fill"
    return "elementwise"


def worker_profile(name: str, batch: int, dtype: str, steps: int = 3) -> dict[str, Any]:
    """Where one step's time goes: XLA thunk durations from a trace, by region and kind."""
    import jax
    import numpy as np

    model, cfg, step, state = _our_step(name, batch, dtype)
    seq = MODELS[name]["lengths"]
    rng = np.random.default_rng(0)
    batch *= jax.device_count()
    batches = [random_batch(model, seq, batch, rng, cfg.vocab_size) for _ in range(steps + 2)]
    hlo = step.lower(state, batches[0], jax.random.key(1)).compile().as_text()
    lines = {}
    for ln in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = ", ln)
        if m:
            lines.setdefault(m.group(1), ln)
    for b in batches[:2]:
        state, m = step(state, b, jax.random.key(1))
    jax.block_until_ready(m)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        jax.profiler.start_trace(d, create_perfetto_trace=True)
        for b in batches[2:]:
            state, m = step(state, b, jax.random.key(1))
            jax.block_until_ready((state, m))
        jax.profiler.stop_trace()
        wall = (time.perf_counter() - t0) / steps
        trace = json.load(gzip.open(next(Path(d).rglob("*.trace.json.gz"))))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    busy: dict[str, float] = collections.Counter()
    spans = []
    for e in events:
        if e.get("ph") == "X" and e["name"] in lines:
            ln = lines[e["name"]]
            op = re.search(r'op_name="([^"]*)"', ln)
            key = f"{_region(op.group(1) if op else '')} | {_kind(ln, e['name'])}"
            busy[key] += e["dur"] / 1e6 / steps
            spans.append((e["ts"], e["ts"] + e["dur"]))
    spans.sort()
    union, end = 0.0, -1.0
    for s, e in spans:
        union += max(0.0, e - max(s, end))
        end = max(end, e)
    return {"side": "profile", "model": name, "batch": batch, "step_s": wall,
            "thunk_s": dict(sorted(busy.items(), key=lambda kv: -kv[1])),
            "thunk_sum_s": sum(busy.values()), "busy_s": union / 1e6 / steps}


def run_worker(args: list[str], cache_dir: str | None = None) -> dict[str, Any]:
    """Run this script as a worker in a fresh process; its last stdout line is JSON. Our side
    runs as the trainer does, with huge pages for XLA:CPU's buffers
    (`t5x_like.runtime.hugepages`) and JAX's compilation cache in `cache_dir` if given; PyTorch
    as its users run it (the setting makes no difference to its step)."""
    from t5x_like.sweep.runner import child_env  # the real CPU (no fake devices), huge pages

    env = dict(os.environ) if "torch" in args else child_env(cache_dir)
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                          check=False, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _worker_key(result: dict[str, Any]) -> tuple:
    """(round, side, model, attention) of a worker's result in train_rounds.jsonl."""
    return (result["round"], result["side"], result.get("model"), result.get("attention"))


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of a list of per-round values."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(rounds: list[list[dict]], models: list[str],
              attentions: tuple[str, ...] = ("xla",)) -> dict[str, Any]:
    """Per model (and attention implementation, when several are timed): both sides' step
    times and the per-round ratio torch / ours. Keys: the model's name, or `name · impl`."""
    peaks = [max(r["jax_gflops"], r.get("torch_gflops", 0.0))
             for rnd in rounds for r in rnd if r["side"] == "peak"]
    out: dict[str, Any] = {"peak_gflops": spread(peaks), "models": {}}
    for name, attention in ((n, a) for n in models for a in attentions):
        ours = [r for rnd in rounds for r in rnd if r["side"] == "ours" and r["model"] == name
                and r.get("attention", "xla") == attention]
        theirs = [r for rnd in rounds for r in rnd if r["side"] == "torch" and r["model"] == name]
        row: dict[str, Any] = {
            "model": name, "attention": attention,
            "framework": ours[0]["framework"], "batch": ours[0]["batch"],
            "lengths": MODELS[name]["lengths"],
            "step_s": spread([r["step_s"] for r in ours]),
            "compile_s": statistics.median(r["compile_s"] for r in ours),
            "tokens_per_s": ours[0]["tokens_per_step"] / statistics.median(
                r["step_s"] for r in ours),
            "model_gflops": spread([r["flops_per_step"] / r["step_s"] / 1e9 for r in ours]),
            "mfu": ours[0]["mfu"], "loss": ours[0]["loss"],
        }
        row["fraction_of_peak"] = row["model_gflops"]["median"] / out["peak_gflops"]["median"]
        if theirs:
            row["torch"] = {"framework": theirs[0]["framework"],
                            "step_s": spread([r["step_s"] for r in theirs])}
            row["ratio_torch_over_ours"] = spread(
                [t["step_s"] / o["step_s"] for o, t in zip(ours, theirs, strict=True)])
        out["models"][name if len(attentions) == 1 else f"{name} · {attention}"] = row
    return out


def write_report(summary: dict, profiles: list[dict], header: dict, out_dir: Path) -> None:
    """benchmarks/train.md and benchmarks/train.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "train.json").write_text(
        json.dumps({**header, **summary, "profiles": profiles}, indent=2) + "\n")

    def ms(s: dict) -> str:
        f = lambda x: f"{1e3 * x:.0f}" if x >= 0.1 else f"{1e3 * x:.3g}"
        return f"{f(s['median'])} [{f(s['min'])}-{f(s['max'])}]"

    peak = summary["peak_gflops"]
    lines = [
        "# Train-step benchmark (`scripts/bench_train.py`)", "",
        f"Device: **{header['device']}**; host {header['host']}; {header['versions']}; "
        f"{header['date_utc']} UTC. {header['rounds']} interleaved rounds, each model's side in "
        f"a fresh process timing {header['steps']} steps after a compile/warm-up step; values "
        "are median [min-max] over rounds. Full step = forward + backward + Adafactor, "
        f"{header.get('precision', 'fp32 on CPU')}, packed random batches (ours) / the same "
        "shapes unpacked (PyTorch).", "",
        "| model | batch | lengths | ours step (ms) | PyTorch step (ms) | PyTorch / ours | "
        "ours tokens/s | ours GFLOP/s | of matmul peak | MFU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in summary["models"].items():
        ratio = r.get("ratio_torch_over_ours")
        rat = (f"**{ratio['median']:.2f}** [{ratio['min']:.2f}-{ratio['max']:.2f}]"
               if ratio else "-")
        mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.0f}%"
        lines.append(
            f"| {name} | {r['batch']} | {'/'.join(map(str, r['lengths'].values()))} | "
            f"{ms(r['step_s'])} | {ms(r['torch']['step_s']) if 'torch' in r else '-'} | {rat} "
            f"| {r['tokens_per_s']:.0f} | {r['model_gflops']['median']:.1f} | "
            f"{100 * r['fraction_of_peak']:.0f}% | "
            f"{mfu} |")
    some = next(iter(summary["models"].values()))
    lines += [
        "",
        f"Matmul peak ({header.get('matmul', 'float32 2048^3')}, best of JAX and PyTorch, per "
        f"round): {peak['median']:.0f} "
        f"[{peak['min']:.0f}-{peak['max']:.0f}] GFLOP/s. GFLOP/s are the analytic "
        "`model.flops_per_sequence` per step time (checked against XLA's cost analysis in "
        "tests/train/test_metrics.py)." + (f" MFU (bf16 peak): {100 * some['mfu']:.1f}%."
                                            if some["mfu"] else ""),
        f"PyTorch side: {some['torch']['framework'] if 'torch' in some else 'not run'}; ours: "
        f"{some['framework']}.",
    ]
    for p in profiles:
        lines += ["", f"## Where the step's time goes: {p['model']} (batch {p['batch']})", "",
                  f"One traced run of {p['step_s']:.3f} s/step. XLA:CPU runs independent thunks "
                  f"concurrently: their times add up to {p['thunk_sum_s']:.3f} s, while at "
                  f"least one runs during {p['busy_s']:.3f} s; the rest of the step is dispatch, "
                  "the thunk executor's own work and tracing.", "",
                  "| region | kind | thunk ms/step | share |", "|---|---|---|---|"]
        for key, s in p["thunk_s"].items():
            if s >= 0.005 * p["thunk_sum_s"]:
                region, kind = key.split(" | ")
                lines.append(f"| {region} | {kind} | {1e3 * s:.1f} | "
                             f"{100 * s / p['thunk_sum_s']:.0f}% |")
    if header.get("note"):
        lines += ["", f"Note: {header['note']}"]
    (out_dir / "train.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    """Run the interleaved rounds (or, with --worker, one measurement) and write the report."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="t5_1_1_small,tiny")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=None,
                   help="per-device batch (default: each model's CPU batch; 32 on accelerators)")
    p.add_argument("--dtype", default=None, help="activations (CPU float32, else bfloat16)")
    p.add_argument("--attention", default=None,
                   help="comma list of ATTENTIONS keys, each timed (CPU: xla; accelerators: "
                        "xla,cudnn,pallas)")
    p.add_argument("--no_torch", action="store_true", help="skip the PyTorch side")
    p.add_argument("--profile", action="store_true", help="add a traced profile of each model")
    p.add_argument("--out_dir", default=str(REPO / "benchmarks"))
    p.add_argument("--note", default="", help="a line added to the report (e.g. machine load)")
    p.add_argument("--resume", action="store_true",
                   help="keep the workers already in <out_dir>/train_rounds.jsonl, run the rest")
    p.add_argument("--render", action="store_true",
                   help="rewrite train.md from --out_dir's train.json, measuring nothing")
    p.add_argument("--worker", choices=("ours", "torch", "peak", "profile"), help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--torch_device", default="cpu", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        fn = {"ours": lambda: worker_ours(args.model, args.batch, args.steps, args.dtype,
                                          args.attention or "xla"),
              "torch": lambda: worker_torch(args.model, args.batch, args.steps,
                                            args.torch_device),
              "peak": worker_peak,
              "profile": lambda: worker_profile(args.model, args.batch, args.dtype)}
        print(json.dumps(fn[args.worker]()), flush=True)
        return
    if args.render:
        saved = json.loads((Path(args.out_dir) / "train.json").read_text())
        keys = ("peak_gflops", "models")
        write_report({k: saved[k] for k in keys}, saved["profiles"],
                     {k: v for k, v in saved.items() if k not in (*keys, "profiles")},
                     Path(args.out_dir))
        return
    import jax

    models = args.models.split(",")
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        p.error(f"unknown --models {unknown}; choose from {sorted(MODELS)}")
    dev = jax.devices()[0]
    on_cpu = dev.platform == "cpu"
    dtype = args.dtype or ("float32" if on_cpu else "bfloat16")
    attentions = tuple((args.attention or ("xla" if on_cpu else "xla,cudnn,pallas")).split(","))
    torch_device = "cpu" if on_cpu else "cuda"
    with_torch = not args.no_torch and (on_cpu or dev.platform == "gpu")
    # Accelerators: later rounds load our steps from JAX's compilation cache (compile_s is the
    # first round's; on CPU every round compiles, as the CPU figures have always been taken).
    cache_dir = None if on_cpu else tempfile.mkdtemp(prefix="bench_train_xla_cache_")
    # Every worker's result is appended to train_rounds.jsonl as it arrives: a run cut off by a
    # time limit keeps them, and --resume runs only the workers missing from it.
    log = Path(args.out_dir) / "train_rounds.jsonl"
    kept = ([json.loads(line) for line in log.read_text().splitlines() if line.strip()]
            if args.resume and log.exists() else [])
    log.parent.mkdir(parents=True, exist_ok=True)
    if not args.resume:
        log.write_text("")
    have = {_worker_key(r): r for r in kept}

    def measure(i: int, worker: list[str], key: tuple) -> dict[str, Any]:
        if key in have:
            return have[key]
        result = {**run_worker(worker, cache_dir), "round": i}
        with log.open("a") as f:
            f.write(json.dumps(result) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "steps_s"}), flush=True)
        return result

    rounds = []
    for i in range(args.rounds):
        results = [measure(i, ["--worker", "peak"], (i, "peak", None, None))]
        for name in models:
            batch = args.batch or (MODELS[name]["cpu_batch"] if on_cpu else 32)
            common = ["--model", name, "--batch", str(batch), "--steps", str(args.steps)]
            sides = [["--worker", "ours", "--dtype", dtype, "--attention", a] for a in attentions]
            if with_torch and MODELS[name]["torch"]:
                sides.append(["--worker", "torch", "--torch_device", torch_device])
            shift = i % len(sides)  # rotate who goes first, round by round
            for side in sides[shift:] + sides[:shift]:
                attention = side[side.index("--attention") + 1] if "--attention" in side else None
                results.append(measure(i, [*side, *common], (i, side[1], name, attention)))
        rounds.append(results)
    profiles = []
    if args.profile:
        for name in models:
            batch = args.batch or (MODELS[name]["cpu_batch"] if on_cpu else 32)
            profiles.append(run_worker(["--worker", "profile", "--model", name,
                                        "--batch", str(batch), "--dtype", dtype]))
    ours = next(r for r in rounds[0] if r["side"] == "ours")
    header = {
        "device": f"{ours['num_devices']}x {ours['device_kind']} ({dev.platform})",
        "host": host.describe(),
        "versions": f"jax {jax.__version__}, python {platform.python_version()}",
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "rounds": args.rounds, "steps": args.steps, "note": args.note,
        "precision": ("fp32 on CPU" if on_cpu else
                      f"fp32 parameters with {dtype} activations (PyTorch: bf16 autocast)"),
        "matmul": next(r for r in rounds[0] if r["side"] == "peak").get("matmul"),
        "rounds_raw": rounds,
    }
    summary = summarize(rounds, models, attentions)
    write_report(summary, profiles, header, Path(args.out_dir))
    print(json.dumps({n: r.get("ratio_torch_over_ours") for n, r in summary["models"].items()}))


if __name__ == "__main__":
    main()
