"""Attention benchmark: our Pallas flash kernel vs cuDNN (`jax.nn.dot_product_attention`) vs XLA.

On a GPU (the real benchmark): bf16, head_dim 64 and 128 (heads = 2048 / head_dim), lengths
512 ... 16k at batch x length = 16k tokens, causal and not, with and without the T5 relative bias
(cuDNN and XLA get the materialised [1, H, L, L] bias). Reports fwd, bwd (the vjp from saved
residuals) and fwd+bwd TFLOP/s (FLOPs: 4·B·H·Lq·Lk·D forward, halved when causal, backward 2.5x
forward) and the compiled fwd+bwd executable's temp + output bytes; OOMs are recorded, not
fatal. Timing: warm-up (compilation excluded), then the median of `--repeats`
`block_until_ready` runs on fresh random inputs. Writes `benchmarks/attention.md` and `.json`
naming the device and versions.

    python scripts/bench_attention.py                 # GPU: full table into benchmarks/
    python scripts/bench_attention.py --smoke         # any machine: tiny shapes, interpret mode,
                                                      # output to /tmp (never a benchmark result)
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from t5x_like.kernels import flash_attention  # noqa: E402
from t5x_like.kernels._flash_reference import reference_attention, reference_rel_bias  # noqa: E402

NUM_BUCKETS, MAX_DISTANCE = 32, 128


def attention_flops(b: int, h: int, lq: int, lk: int, d: int, causal: bool) -> float:
    """Forward FLOPs 4·B·H·Lq·Lk·D, halved for causal (backward = 2.5x this)."""
    return 4.0 * b * h * lq * lk * d / (2.0 if causal else 1.0)


def make_impl(name: str, causal: bool, table: jax.Array | None, length: int, heads: int,
              interpret: bool | None, blocks: tuple[int | None, int | None]):
    """(q, k, v) -> out for one implementation; dense impls get the materialised T5 bias."""
    dense_bias = None
    if table is not None and name != "pallas":
        dense_bias = reference_rel_bias(table.astype(jnp.float32), length, length,
                                        bidirectional=not causal, max_distance=MAX_DISTANCE)
        dense_bias = dense_bias.astype(jnp.bfloat16)
    if name == "pallas":
        return lambda q, k, v: flash_attention(
            q, k, v, causal=causal, rel_bias=table, rel_bidirectional=not causal,
            rel_max_distance=MAX_DISTANCE, block_q=blocks[0], block_k=blocks[1],
            interpret=interpret)
    if name == "cudnn":
        return lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, bias=dense_bias, is_causal=causal, scale=1.0, implementation="cudnn")
    return lambda q, k, v: reference_attention(q, k, v, causal=causal, bias=dense_bias)


def _time(fn, args, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _bytes(fn, args) -> int | None:
    try:
        mem = fn.lower(*args).compile().memory_analysis()
        return int(mem.temp_size_in_bytes + mem.output_size_in_bytes)
    except Exception:  # memory_analysis is backend-dependent
        return None


def run_one(impl: str, *, batch: int, length: int, heads: int, d: int, causal: bool, t5: bool,
            repeats: int, warmup: int, interpret: bool | None, blocks, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    shape = (batch, length, heads, d)
    q, k, v, do = (jnp.asarray(rng.standard_normal(shape, np.float32), jnp.bfloat16)
                   for _ in range(4))
    table = jnp.asarray(rng.standard_normal((NUM_BUCKETS, heads), np.float32)) if t5 else None
    attn = make_impl(impl, causal, table, length, heads, interpret, blocks)
    fwd = jax.jit(attn)

    def loss(q, k, v, do):
        return jnp.sum(attn(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))

    fwd_bwd = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    bwd = jax.jit(lambda pull, do: pull(do))  # the backward alone, from saved residuals
    row = {"impl": impl, "batch": batch, "length": length, "heads": heads, "head_dim": d,
           "causal": causal, "t5_bias": t5}
    try:
        t_fwd = _time(fwd, (q, k, v), repeats, warmup)
        t_all = _time(fwd_bwd, (q, k, v, do), repeats, warmup)
        _, pull = jax.vjp(fwd, q, k, v)
        t_bwd = _time(bwd, (pull, do), repeats, warmup)
        del pull
    except Exception as err:  # OOM or an unsupported configuration: record, keep going
        text = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        row["error"] = "OOM" if "RESOURCE_EXHAUSTED" in text or "memory" in text else text
        return row
    flops = attention_flops(batch, heads, length, length, d, causal)
    row.update(fwd_ms=1e3 * t_fwd, bwd_ms=1e3 * t_bwd, fwd_bwd_ms=1e3 * t_all,
               fwd_tflops=flops / t_fwd / 1e12, bwd_tflops=2.5 * flops / t_bwd / 1e12,
               fwd_bwd_tflops=3.5 * flops / t_all / 1e12,
               fwd_bwd_bytes=_bytes(fwd_bwd, (q, k, v, do)))
    return row


def _fmt(row: dict, key: str) -> str:
    val = row.get(key)
    return "—" if val is None else f"{val:.4g}"


def write_report(rows: list[dict], meta: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "attention.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# Attention benchmark ({meta['mode']})", "",
             f"Device: {meta['device']} · jax {meta['jax']} / jaxlib {meta['jaxlib']} · "
             f"{meta['date']} · median of {meta['repeats']} runs after {meta['warmup']} warm-up.",
             "TFLOP/s with FLOPs = 4·B·H·L²·D (÷2 causal), bwd ×2.5; memory = compiled fwd+bwd "
             "temp + output bytes.", "",
             "| impl | L | B | H | D | causal | T5 bias | fwd TF/s | bwd TF/s | fwd+bwd TF/s "
             "| fwd+bwd ms | mem MiB | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mem = r.get("fwd_bwd_bytes")
        lines.append(
            f"| {r['impl']} | {r['length']} | {r['batch']} | {r['heads']} | {r['head_dim']} | "
            f"{r['causal']} | {r['t5_bias']} | {_fmt(r, 'fwd_tflops')} | {_fmt(r, 'bwd_tflops')}"
            f" | {_fmt(r, 'fwd_bwd_tflops')} | {_fmt(r, 'fwd_bwd_ms')} | "
            f"{'—' if mem is None else f'{mem / 2**20:.4g}'} | {r.get('error', '')} |")
    (out_dir / "attention.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes in interpret mode (CPU check); writes to /tmp")
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=16384, help="batch x length")
    parser.add_argument("--lengths", type=int, nargs="*", default=None)
    parser.add_argument("--head-dims", type=int, nargs="*", default=None)
    parser.add_argument("--impls", nargs="*", default=None, help="pallas cudnn xla")
    parser.add_argument("--block-q", type=int, default=None)
    parser.add_argument("--block-k", type=int, default=None)
    args = parser.parse_args(argv)

    on_gpu = jax.default_backend() == "gpu"
    if args.smoke:
        lengths = args.lengths or [48, 64]
        head_dims, tokens = args.head_dims or [32], 128
        repeats, warmup, model_dim = args.repeats or 2, 1, 64
        out_dir = args.out_dir or Path("/tmp/t5x_like_bench_attention_smoke")
        mode, interpret = "smoke test, interpret mode, NOT a benchmark", None
        blocks = (args.block_q or 16, args.block_k or 16)
    else:
        if not on_gpu:
            parser.error("the benchmark needs a GPU; use --smoke to check the script on CPU")
        lengths = args.lengths or [512, 1024, 2048, 4096, 8192, 16384]
        head_dims, tokens = args.head_dims or [64, 128], args.tokens
        repeats, warmup, model_dim = args.repeats or 20, args.warmup, 2048
        out_dir = args.out_dir or Path("benchmarks")
        mode, interpret, blocks = "GPU benchmark", False, (args.block_q, args.block_k)
    impls = args.impls or (["pallas", "cudnn", "xla"] if on_gpu else ["pallas", "xla"])

    rows = []
    seed = int(np.random.SeedSequence().entropy % 2**32)
    for d in head_dims:
        for length in lengths:
            for causal in (False, True):
                for t5 in (False, True):
                    for impl in impls:
                        row = run_one(impl, batch=max(1, tokens // length), length=length,
                                      heads=max(1, model_dim // d), d=d, causal=causal, t5=t5,
                                      repeats=repeats, warmup=warmup, interpret=interpret,
                                      blocks=blocks, seed=seed)
                        seed += 1
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    device = jax.devices()[0]
    meta = {"mode": mode, "device": f"{device.platform}: {device.device_kind}",
            "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "repeats": repeats, "warmup": warmup, "blocks": list(blocks)}
    write_report(rows, meta, out_dir)
    print(f"wrote {out_dir / 'attention.md'} and {out_dir / 'attention.json'}")
    return rows


if __name__ == "__main__":
    main()
