"""Benchmark a full train step (forward + backward + Adafactor update) of the trainer.

Models: T5 v1.1 small and base (512/114, packed) and a decoder-only LM of similar size
(gin/models/decoder_only_small.gin at 626 = 512 + 114 tokens). Reports steps/s, tokens/s, model
FLOP/s (analytic `flops_per_sequence`) and MFU (peak bf16 FLOP/s per device kind; n/a on CPU).
On CPU it also times the same T5-small step in Hugging Face transformers (PyTorch, fp32,
Adafactor) on identical shapes and reports our tokens/s / theirs. Writes benchmarks/train.md and
benchmarks/train.json.

    python scripts/bench_train.py [--batch 8] [--steps 5] [--models t5_1_1_small,...] [--no_hf]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import gin  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from t5x_like.models import TransformerConfig, make_model  # noqa: E402
from t5x_like.train import metrics as M  # noqa: E402
from t5x_like.train import partitioning as P  # noqa: E402
from t5x_like.train import train_state as TS  # noqa: E402
from t5x_like.train import train_step as S  # noqa: E402
from t5x_like.train.optimizers import create_optimizer  # noqa: E402

MODELS = {
    "t5_1_1_small": {"inputs": 512, "targets": 114},
    "t5_1_1_base": {"inputs": 512, "targets": 114},
    "decoder_only_small": {"targets": 626},
}


def model_config(name: str, dtype: str) -> TransformerConfig:
    """The TransformerConfig of gin/models/<name>.gin (dropout off, activations in ``dtype``)."""
    gin.clear_config()
    gin.parse_config_file(str(REPO / "gin" / "models" / f"{name}.gin"))
    cfg = TransformerConfig()
    gin.clear_config()
    return cfg.replace(dropout_rate=0.0, dtype=dtype)


def random_batch(model: Any, seq: dict[str, int], batch: int, rng: np.random.Generator,
                 vocab: int) -> dict[str, np.ndarray]:
    """Fresh random tokens, packed layout with two segments per row (never all zeros)."""
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


def bench_ours(name: str, batch: int, steps: int, dtype: str) -> dict[str, Any]:
    """Median step time of our jitted train step on all local devices (data parallel)."""
    cfg = model_config(name, dtype)
    model = make_model(cfg)
    seq = MODELS[name]
    n_dev = jax.device_count()
    mesh = P.create_mesh((-1, 1, 1))
    rules = P.logical_axis_rules("fsdp")
    opt = create_optimizer("adafactor")
    global_batch = batch * n_dev
    plan = TS.sharded_state(model, opt, model.example_batch(n_dev, seq, packed=True), mesh, rules)
    state = TS.create_state(plan, jax.random.key(0), mesh, rules)
    step = S.jit_train_step(S.make_train_step(model, opt), plan, mesh, rules)
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
    tokens = global_batch * sum(seq.values())
    flops = model.flops_per_sequence(seq) * global_batch
    kind = jax.devices()[0].device_kind
    mfu = M.mfu(flops / dt, n_dev, kind)
    return {
        "model": name, "framework": "t5x_like (jax)", "dtype": dtype, "batch": global_batch,
        "sequence_length": seq, "steps_timed": len(times), "compile_s": round(compile_s, 1),
        "step_s": dt, "steps_per_s": 1 / dt, "tokens_per_s": tokens / dt,
        "model_tflop_per_s": flops / dt / 1e12, "mfu": mfu,
        "loss": float(m["loss"]),
    }


def bench_hf_t5_small(batch: int, steps: int) -> dict[str, Any]:
    """The same T5 v1.1 small train step in transformers + PyTorch (CPU, fp32, Adafactor)."""
    import torch
    import transformers
    from transformers import T5Config, T5ForConditionalGeneration
    from transformers.optimization import Adafactor

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    cfg = T5Config(vocab_size=32128, d_model=512, d_kv=64, d_ff=1024, num_layers=8,
                   num_decoder_layers=8, num_heads=6, feed_forward_proj="gated-gelu",
                   tie_word_embeddings=False, dropout_rate=0.0, decoder_start_token_id=0,
                   pad_token_id=0)
    model = T5ForConditionalGeneration(cfg).train()
    opt = Adafactor(model.parameters(), lr=1e-2, scale_parameter=True, relative_step=False,
                    warmup_init=False, decay_rate=-0.8, clip_threshold=1.0)
    seq = MODELS["t5_1_1_small"]
    rng = np.random.default_rng(0)
    times = []
    for i in range(steps + 1):
        inputs = torch.from_numpy(rng.integers(3, 32000, (batch, seq["inputs"])))
        labels = torch.from_numpy(rng.integers(3, 32000, (batch, seq["targets"])))
        t0 = time.perf_counter()
        out = model(input_ids=inputs, labels=labels)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:
            times.append(time.perf_counter() - t0)
    dt = statistics.median(times)
    tokens = batch * sum(seq.values())
    return {
        "model": "t5_1_1_small",
        "framework": f"transformers {transformers.__version__} + torch {torch.__version__}",
        "dtype": "float32", "batch": batch,
        "sequence_length": seq, "steps_timed": len(times), "step_s": dt, "steps_per_s": 1 / dt,
        "tokens_per_s": tokens / dt, "loss": float(out.loss.detach()),
    }


def write_report(rows: list[dict], hf: dict | None, hf_skip: str | None, out_dir: Path,
                 args: argparse.Namespace) -> None:
    """benchmarks/train.md and benchmarks/train.json."""
    dev = jax.devices()[0]
    header = {
        "device": f"{jax.device_count()}x {dev.device_kind} ({dev.platform})",
        "host": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "versions": {"jax": jax.__version__, "python": platform.python_version()},
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "per_device_batch": args.batch, "steps": args.steps,
    }
    ratio = None
    if hf is not None:
        ours = next((r for r in rows if r["model"] == "t5_1_1_small"), None)
        if ours is not None:
            ratio = ours["tokens_per_s"] / hf["tokens_per_s"]
    payload = {**header, "note": args.note, "results": rows, "hf_transformers": hf,
               "hf_skipped": hf_skip, "t5_small_tokens_per_s_ratio_ours_over_hf": ratio}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "train.json").write_text(json.dumps(payload, indent=2) + "\n")
    lines = [
        "# Train-step benchmark (`scripts/bench_train.py`)", "",
        f"Device: **{header['device']}**; host {header['host']}; jax {jax.__version__}; "
        f"{header['date_utc']} UTC. Full step = forward + backward + Adafactor update, packed "
        f"random batches, median of {args.steps} steps after a compile/warm-up step.", "",
        "| model | framework | dtype | batch | lengths | step (s) | steps/s | tokens/s | "
        "model TFLOP/s | MFU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in [*rows, *([hf] if hf else [])]:
        mfu = r.get("mfu")
        lines.append(
            f"| {r['model']} | {r['framework']} | {r['dtype']} | {r['batch']} | "
            f"{'/'.join(str(v) for v in r['sequence_length'].values())} | {r['step_s']:.3f} | "
            f"{r['steps_per_s']:.3f} | {r['tokens_per_s']:.0f} | "
            f"{r.get('model_tflop_per_s', float('nan')):.4f} | "
            f"{'n/a' if mfu is None else f'{100 * mfu:.1f}%'} |")
    lines.append("")
    if ratio is not None:
        lines.append(f"T5-small tokens/s, ours / Hugging Face transformers (PyTorch CPU, identical "
                     f"shapes): **{ratio:.2f}**")
    elif hf_skip:
        lines.append(f"Hugging Face comparison skipped: {hf_skip}")
    if args.note:
        lines += ["", f"Note: {args.note}"]
    lines += ["", "MFU is n/a where the device's peak bf16 FLOP/s is unknown (CPU). FLOPs are the "
              "analytic `model.flops_per_sequence` (checked against XLA's cost analysis in "
              "tests/train/test_metrics.py).", ""]
    (out_dir / "train.md").write_text("\n".join(lines))


def main() -> None:
    """Parse flags, run the benchmarks, write the report."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=None, help="per-device batch (CPU 2, GPU 32)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--dtype", default=None, help="activation dtype (CPU float32, else bfloat16)")
    p.add_argument("--no_hf", action="store_true")
    p.add_argument("--out_dir", default=str(REPO / "benchmarks"))
    p.add_argument("--note", default="", help="a line added to the report (e.g. machine load)")
    args = p.parse_args()
    on_cpu = jax.devices()[0].platform == "cpu"
    args.batch = args.batch or (2 if on_cpu else 32)
    dtype = args.dtype or ("float32" if on_cpu else "bfloat16")
    rows = []
    for name in args.models.split(","):
        r = bench_ours(name, args.batch, args.steps, dtype)
        print(json.dumps(r), flush=True)
        rows.append(r)
    hf, skip = None, None
    if args.no_hf:
        skip = "--no_hf given"
    elif not on_cpu:
        skip = "the Hugging Face comparison is a CPU measurement"
    else:
        try:
            import transformers  # noqa: F401
        except ImportError as err:
            skip = f"transformers not importable ({err})"
        else:
            hf = bench_hf_t5_small(args.batch * jax.device_count(), args.steps)
            print(json.dumps(hf), flush=True)
    if skip:
        print(f"skipping the Hugging Face row: {skip}", flush=True)
    write_report(rows, hf, skip, Path(args.out_dir), args)


if __name__ == "__main__":
    main()
