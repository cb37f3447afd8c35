"""Attention benchmark: our Pallas flash kernel vs cuDNN (`jax.nn.dot_product_attention`) vs XLA.

`pallas` is our kernel as models use it (Triton); on an sm_90 GPU `pallas_hopper` is added: the
same attention in its Hopper kernels (`backend='mosaic_gpu'`: warp-specialised, TMA + wgmma).

On a GPU (the real benchmark): bf16, head_dim 64 and 128 (heads = 2048 / head_dim), lengths
1k ... 16k at batch x length = 16k tokens, causal and not, with and without the T5 relative bias
(cuDNN and XLA get the materialised [1, H, L, L] bias). Per shape, every implementation is
compiled once (ahead of time; compilation never timed), checked against a float32 reference
(relative L2 error of the output and of dq, dk, dv on the first heads of the first example), then
timed in `--rounds` interleaved rounds (the order rotates each round), each round the median of
`--repeats` runs alternating two random input sets. Reported per implementation: fwd and fwd+bwd
milliseconds and TFLOP/s (FLOPs 4·B·H·L²·D forward, halved when causal; backward 2.5x forward),
the compiled fwd+bwd temp + output bytes; and per shape the speed ratio of the other
implementations' fwd+bwd time to ours (the first of `--impls`: `pallas` by default), median
[min-max] over rounds (above 1: ours is faster).
OOMs and unsupported shapes are recorded, not fatal. Rows are appended to `attention.jsonl` as
they finish, so a run cut off by a time limit keeps them and `--resume` skips them.

    python scripts/bench_attention.py                 # GPU: full table into benchmarks/
    python scripts/bench_attention.py --head-dims 64 --lengths 1024 4096 --resume
    python scripts/bench_attention.py --smoke         # any machine: tiny shapes, interpret mode,
                                                      # output to /tmp (never a benchmark result)
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from t5x_like.kernels import flash_attention  # noqa: E402
from t5x_like.kernels._flash_reference import reference_attention, reference_rel_bias  # noqa: E402

NUM_BUCKETS, MAX_DISTANCE = 32, 128
SHAPE_KEYS = ("length", "batch", "heads", "head_dim", "causal", "t5_bias")
#: ours (Triton), ours with the Hopper kernels (Mosaic GPU, sm_90 only), cuDNN, XLA.
IMPLS = ("pallas", "pallas_hopper", "cudnn", "xla")


def attention_flops(b: int, h: int, lq: int, lk: int, d: int, causal: bool) -> float:
    """Forward FLOPs 4·B·H·Lq·Lk·D, halved for causal (backward = 2.5x this)."""
    return 4.0 * b * h * lq * lk * d / (2.0 if causal else 1.0)


def dense_t5_bias(table: jax.Array, length: int, causal: bool, dtype) -> jax.Array:
    """The [1, H, L, L] T5 bias the dense implementations add to the logits."""
    return reference_rel_bias(table.astype(jnp.float32), length, length,
                              bidirectional=not causal, max_distance=MAX_DISTANCE).astype(dtype)


def make_impl(name: str, causal: bool, length: int, sm_scale: float, interpret: bool | None,
              blocks: tuple[int | None, int | None]):
    """(q, k, v, table | None) -> out for one implementation. The T5 bucket table is an input,
    differentiated like a model parameter: our kernel reduces its gradient in-kernel, the dense
    implementations materialise the [1, H, L, L] bias from it (as a T5 model does once per
    stack) and get its gradient through that."""
    if name == "pallas":
        return lambda q, k, v, table: flash_attention(
            q, k, v, causal=causal, rel_bias=table, rel_bidirectional=not causal,
            rel_max_distance=MAX_DISTANCE, sm_scale=sm_scale, block_q=blocks[0],
            block_k=blocks[1], interpret=interpret)
    if name == "pallas_hopper":  # the Mosaic GPU kernels (128-row q blocks; block_k: forward's)
        return lambda q, k, v, table: flash_attention(
            q, k, v, causal=causal, rel_bias=table, rel_bidirectional=not causal,
            rel_max_distance=MAX_DISTANCE, sm_scale=sm_scale, block_k=blocks[1],
            bwd_block_q=blocks[0], bwd_block_k=blocks[1], backend="mosaic_gpu",
            interpret=interpret)
    bias = lambda table: (None if table is None
                          else dense_t5_bias(table, length, causal, jnp.bfloat16))
    if name == "cudnn":
        return lambda q, k, v, table: jax.nn.dot_product_attention(
            q, k, v, bias=bias(table), is_causal=causal, scale=sm_scale,
            implementation="cudnn")
    if name == "xla":
        return lambda q, k, v, table: reference_attention(q, k, v, causal=causal,
                                                          bias=bias(table), sm_scale=sm_scale)
    raise ValueError(f"unknown implementation {name!r}; choose from {', '.join(IMPLS)}")


def _fwd_bwd(attn):
    """(q, k, v, table, do) -> (out, (dq, dk, dv, dtable)): the forward and the vjp of
    `sum(out * do)`."""
    def run(q, k, v, table, do):
        out, pull = jax.vjp(attn, q, k, v, table)
        return out, pull(do)
    return run


def reference_errors(out, grads, inputs, table, *, causal: bool, sm_scale: float,
                     max_elems: int = 2**28) -> dict[str, float]:
    """Relative L2 errors ‖got − ref‖/‖ref‖ of out, dq, dk, dv against XLA attention in float32
    (highest matmul precision) on the first example and the first heads (as many as keep the
    [h, L, L] logits under `max_elems`; heads are independent, so a slice is an exact check)."""
    q, k, v, do = inputs
    length, heads = q.shape[1], q.shape[2]
    h = max(1, min(heads, 4, max_elems // (length * length)))
    cut = lambda x: x[:1, :, :h].astype(jnp.float32)
    bias = None if table is None else dense_t5_bias(table[:, :h], length, causal, jnp.float32)

    def ref(q, k, v, _):
        return reference_attention(q, k, v, causal=causal, bias=bias, sm_scale=sm_scale)

    with jax.default_matmul_precision("highest"):
        want_out, want_grads = jax.jit(_fwd_bwd(ref))(cut(q), cut(k), cut(v), None, cut(do))
    want_grads = want_grads[:3]  # the table's gradient sums over the batch: not sliceable
    errors = {}
    for name, got, want in zip(("o", "dq", "dk", "dv"), (out, *grads), (want_out, *want_grads),
                               strict=True):
        got = np.asarray(cut(got), np.float64)
        want = np.asarray(want, np.float64)
        errors[f"err_{name}"] = (float(np.linalg.norm(got - want) / np.linalg.norm(want))
                                 if np.all(np.isfinite(got)) else float("nan"))
    return errors


def _median_time(fn, input_sets, repeats: int) -> float:
    times = []
    for i in range(repeats):
        args = input_sets[i % len(input_sets)]
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _error_text(err: Exception) -> str:
    text = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
    return "OOM" if "RESOURCE_EXHAUSTED" in str(err) or "out of memory" in str(err) else text


def run_shape(impls: list[str], *, batch: int, length: int, heads: int, d: int, causal: bool,
              t5: bool, rounds: int, repeats: int, warmup: int, interpret: bool | None,
              blocks: tuple[int | None, int | None], seed: int) -> list[dict]:
    """Compile, check and time every implementation on one shape; one row per implementation."""
    rng = np.random.default_rng(seed)
    shape = (batch, length, heads, d)
    table = jnp.asarray(rng.standard_normal((NUM_BUCKETS, heads), np.float32)) if t5 else None
    draw = lambda: jnp.asarray(rng.standard_normal(shape, np.float32), jnp.bfloat16)
    input_sets = [(draw(), draw(), draw(), table, draw()) for _ in range(2)]  # q k v table do
    sm_scale = d ** -0.5
    base = {"batch": batch, "length": length, "heads": heads, "head_dim": d, "causal": causal,
            "t5_bias": t5, "seed": seed}
    rows, compiled = {}, {}
    for impl in impls:
        rows[impl] = row = {"impl": impl, **base}
        attn = make_impl(impl, causal, length, sm_scale, interpret, blocks)
        try:
            fwd = jax.jit(attn).lower(*input_sets[0][:4]).compile()
            both = jax.jit(_fwd_bwd(attn)).lower(*input_sets[0]).compile()
            out, grads = both(*input_sets[0])
            q, k, v, _, do = input_sets[0]
            row.update(reference_errors(out, grads[:3], (q, k, v, do), table, causal=causal,
                                        sm_scale=sm_scale))
            del out, grads
            mem = both.memory_analysis()
            if mem is not None:
                row["fwd_bwd_bytes"] = int(mem.temp_size_in_bytes + mem.output_size_in_bytes)
            for _ in range(warmup):
                jax.block_until_ready(fwd(*input_sets[0][:4]))
                jax.block_until_ready(both(*input_sets[0]))
            compiled[impl] = (fwd, both)
        except Exception as err:  # OOM or an unsupported configuration: record, keep going
            row["error"] = _error_text(err)
    fwd_sets = [s[:4] for s in input_sets]
    times = {impl: {"fwd": [], "fwd_bwd": []} for impl in compiled}
    order = list(compiled)
    for r in range(rounds if order else 0):
        for impl in order[r % len(order):] + order[: r % len(order)]:
            fwd, both = compiled[impl]
            try:
                times[impl]["fwd"].append(_median_time(fwd, fwd_sets, repeats))
                times[impl]["fwd_bwd"].append(_median_time(both, input_sets, repeats))
            except Exception as err:
                rows[impl]["error"] = _error_text(err)
    flops = attention_flops(batch, heads, length, length, d, causal)
    ours = impls[0]
    for impl, t in times.items():
        if "error" in rows[impl] or not t["fwd_bwd"]:
            continue
        t_fwd, t_all = statistics.median(t["fwd"]), statistics.median(t["fwd_bwd"])
        rows[impl].update(
            fwd_ms=1e3 * t_fwd, fwd_bwd_ms=1e3 * t_all, bwd_ms=1e3 * (t_all - t_fwd),
            fwd_bwd_ms_rounds=[1e3 * x for x in t["fwd_bwd"]],
            fwd_ms_rounds=[1e3 * x for x in t["fwd"]],
            fwd_tflops=flops / t_fwd / 1e12, fwd_bwd_tflops=3.5 * flops / t_all / 1e12)
        if impl != ours and ours in times and "error" not in rows[ours]:
            ratios = [a / b for a, b in zip(t["fwd_bwd"], times[ours]["fwd_bwd"], strict=True)]
            fwd_ratios = [a / b for a, b in zip(t["fwd"], times[ours]["fwd"], strict=True)]
            rows[impl].update(ratio_to=ours,
                speedup_fwd_bwd=statistics.median(ratios), speedup_fwd_bwd_range=[
                    min(ratios), max(ratios)], speedup_fwd=statistics.median(fwd_ratios))
    return list(rows.values())


def _fmt(val, spec: str = ".4g") -> str:
    return "—" if val is None else format(val, spec)


def write_report(rows: list[dict], meta: dict, out_dir: Path) -> None:
    """attention.json (meta + rows) and attention.md (one table row per implementation)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "attention.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# Attention benchmark ({meta['mode']})", "",
             f"Device: {meta['device']} · jax {meta['jax']} / jaxlib {meta['jaxlib']} · "
             f"{meta['date']} · {meta['rounds']} interleaved rounds, each the median of "
             f"{meta['repeats']} runs (two input sets, after {meta['warmup']} warm-up runs); "
             "the table gives the median over rounds.", "",
             "TFLOP/s with FLOPs = 4·B·H·L²·D (÷2 causal), fwd+bwd = 3.5x fwd. bwd ms = fwd+bwd "
             "− fwd. `ours ×` = that implementation's fwd+bwd time / ours (the first impl of "
             "each shape) in the same round, "
             "median [min-max] (above 1: ours is faster). err = relative L2 error against "
             "float32 attention (output; worst of dq, dk, dv). Memory = compiled fwd+bwd temp + "
             "output bytes.", "",
             "| impl | L | B | H | D | causal | T5 bias | fwd ms | bwd ms | fwd+bwd ms "
             "| fwd TF/s | fwd+bwd TF/s | ours × | err o | err grad | mem MiB | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mem = r.get("fwd_bwd_bytes")
        speed = ("—" if "speedup_fwd_bwd" not in r else
                 f"{r['speedup_fwd_bwd']:.2f} [{r['speedup_fwd_bwd_range'][0]:.2f}-"
                 f"{r['speedup_fwd_bwd_range'][1]:.2f}]")
        grad_errs = [r[k] for k in ("err_dq", "err_dk", "err_dv") if k in r]
        lines.append(
            f"| {r['impl']} | {r['length']} | {r['batch']} | {r['heads']} | {r['head_dim']} | "
            f"{r['causal']} | {r['t5_bias']} | {_fmt(r.get('fwd_ms'))} | {_fmt(r.get('bwd_ms'))}"
            f" | {_fmt(r.get('fwd_bwd_ms'))} | {_fmt(r.get('fwd_tflops'), '.1f')} | "
            f"{_fmt(r.get('fwd_bwd_tflops'), '.1f')} | {speed} | {_fmt(r.get('err_o'), '.1e')} | "
            f"{_fmt(max(grad_errs) if grad_errs else None, '.1e')} | "
            f"{'—' if mem is None else f'{mem / 2**20:.4g}'} | "
            f"{'; '.join(filter(None, (r.get('label'), r.get('error'))))} |")
    (out_dir / "attention.md").write_text("\n".join(lines) + "\n")


def _shape_key(row: dict) -> tuple:
    return tuple(row[k] for k in SHAPE_KEYS)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes in interpret mode (CPU check); writes to /tmp")
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=16384, help="batch x length")
    parser.add_argument("--lengths", type=int, nargs="*", default=None)
    parser.add_argument("--head-dims", type=int, nargs="*", default=None)
    parser.add_argument("--impls", nargs="*", default=None, choices=IMPLS,
                        help="default: all that run on the device")
    parser.add_argument("--block-q", type=int, default=None)
    parser.add_argument("--block-k", type=int, default=None)
    parser.add_argument("--t5", choices=("both", "yes", "no"), default="both",
                        help="shapes with the T5 relative bias, without, or both")
    parser.add_argument("--label", default="",
                        help="stored in every row (e.g. which kernel version ran)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows of <out-dir>/attention.jsonl and skip their shapes")
    args = parser.parse_args(argv)

    on_gpu = jax.default_backend() == "gpu"
    if args.smoke:
        lengths = args.lengths or [48, 64]
        head_dims, tokens = args.head_dims or [32], 128
        rounds, repeats, warmup, model_dim = args.rounds or 2, args.repeats or 2, 1, 64
        out_dir = args.out_dir or Path("/tmp/t5x_like_bench_attention_smoke")
        mode, interpret = "smoke test, interpret mode, NOT a benchmark", None
        blocks = (args.block_q or 16, args.block_k or 16)
    else:
        if not on_gpu:
            parser.error("the benchmark needs a GPU; use --smoke to check the script on CPU")
        lengths = args.lengths or [1024, 4096, 16384]
        head_dims, tokens = args.head_dims or [64, 128], args.tokens
        rounds, repeats, warmup, model_dim = args.rounds or 5, args.repeats or 10, args.warmup, 2048
        out_dir = args.out_dir or Path("benchmarks")
        mode, interpret, blocks = "GPU benchmark", False, (args.block_q, args.block_k)
    hopper = on_gpu and getattr(jax.devices()[0], "compute_capability", "").startswith("9")
    impls = args.impls or (["pallas", *(["pallas_hopper"] if hopper else []), "cudnn", "xla"]
                           if on_gpu else ["pallas", "xla"])

    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "attention.jsonl"
    rows = ([json.loads(line) for line in log.read_text().splitlines() if line.strip()]
            if args.resume and log.exists() else [])
    if not args.resume:
        log.write_text("")
    done = {_shape_key(r) for r in rows}
    seed = int(np.random.SeedSequence().entropy % 2**32)
    print(f"seed {seed}", flush=True)
    for d in head_dims:
        for length in lengths:
            for causal in (False, True):
                for t5 in {"both": (False, True), "yes": (True,), "no": (False,)}[args.t5]:
                    kw = dict(batch=max(1, tokens // length), length=length,
                              heads=max(1, model_dim // d), d=d, causal=causal, t5=t5)
                    seed += 1
                    if _shape_key({**kw, "head_dim": d, "t5_bias": t5}) in done:
                        continue
                    new = run_shape(impls, **kw, rounds=rounds, repeats=repeats,
                                    warmup=warmup, interpret=interpret, blocks=blocks, seed=seed)
                    with log.open("a") as f:
                        for row in new:
                            if args.label:
                                row["label"] = args.label
                            f.write(json.dumps(row) + "\n")
                            print(json.dumps({k: v for k, v in row.items()
                                              if not k.endswith("_rounds")}), flush=True)
                    rows += new
    device = jax.devices()[0]
    meta = {"mode": mode, "device": f"{device.platform}: {device.device_kind}",
            "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "rounds": rounds, "repeats": repeats, "warmup": warmup, "blocks": list(blocks)}
    write_report(rows, meta, out_dir)
    print(f"wrote {out_dir / 'attention.md'} and {out_dir / 'attention.json'}")
    return rows


if __name__ == "__main__":
    main()
