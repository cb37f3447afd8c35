"""Compile the Pallas TPU flash-attention kernel with libtpu for each TPU generation, offline.

Deviceless: needs libtpu (`make install-aot`), no TPU. For every variant x generation x head_dim
it compiles the forward and the forward+backward of `flash_attention(backend='mosaic_tpu')` on
one chip at the default blocks (`_flash_tpu.default_blocks`) and records: compiled or the
compiler's error, the per-kernel VMEM limit the kernels asked for, XLA's memory analysis
(argument / output / temporary bytes) and cost analysis (FLOPs, bytes; the kernels' own
`cost_estimate` is what XLA counts inside them). `--multichip v5e:2x2` also compiles a small
encoder-decoder's loss + gradient with `attention_impl='pallas'` on that slice under a
tensor-parallel mesh (the kernel inside `jax.shard_map`, heads over 'model').

    JAX_PLATFORMS=cpu .venv-aot/bin/python scripts/compile_tpu_kernels.py \
        [--generations v4,v5e,v5p,v6e] [--head-dims 64,128] [--variants ...] \
        [--extra-blocks v5e:128:1024,1024,1024,1024] [--multichip v5e:2x2] \
        [--json benchmarks/flash_tpu_compile.json --md benchmarks/flash_tpu_compile.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from t5x_like.aot.tpu import GENERATIONS, target_devices  # noqa: E402
from t5x_like.kernels import _flash_tpu  # noqa: E402
from t5x_like.kernels.flash import flash_attention  # noqa: E402

MIB = 2**20
#: name -> (flash_attention keyword arguments, side inputs used)
VARIANTS = {
    "causal": (dict(causal=True), ()),
    "causal_rel": (dict(causal=True, rel_bidirectional=False), ("rel",)),
    "bidir_rel": (dict(causal=False, rel_bidirectional=True), ("rel",)),
    "segments": (dict(causal=True), ("seg",)),
    "prefix_rel": (dict(causal=True, rel_bidirectional=False), ("rel", "prefix")),
    "dense_bias": (dict(causal=False), ("bias",)),
}
SINGLE_CHIP = {"v4": "v4:2x2x1", "v5e": "v5e:1x1", "v5p": "v5p:2x2x1", "v6e": "v6e:1x1"}


def _inputs(mesh, batch: int, length: int, heads: int, head_dim: int, buckets: int):
    sharding = NamedSharding(mesh, PartitionSpec())
    sds = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
    qkv = sds((batch, length, heads, head_dim), jnp.bfloat16)
    return (qkv, qkv, qkv, sds((buckets, heads), jnp.float32), sds((batch, length), jnp.int32),
            sds((batch, length), jnp.bool_), sds((1, heads, length, length), jnp.bfloat16))


def _functions(variant: str, blocks: tuple[int, int, int, int]):
    kwargs, sides = VARIANTS[variant]

    def attn(q, k, v, table, seg, prefix, bias):
        return flash_attention(
            q, k, v, rel_bias=table if "rel" in sides else None,
            q_segment_ids=seg if "seg" in sides else None,
            kv_segment_ids=seg if "seg" in sides else None,
            prefix_mask=prefix if "prefix" in sides else None,
            bias=bias if "bias" in sides else None, block_q=blocks[0], block_k=blocks[1],
            bwd_block_q=blocks[2], bwd_block_k=blocks[3], backend="mosaic_tpu",
            interpret=False, **kwargs)

    def loss(*args):
        return jnp.sum(attn(*args).astype(jnp.float32))

    return {"fwd": jax.jit(attn), "fwd+bwd": jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 6)))}


def _vmem_limits(stablehlo: str) -> list[int]:
    """Scoped-VMEM sizes the Mosaic custom calls request, in call order."""
    return [int(x) for x in re.findall(r"scoped_memory_configs\\22: \[\{[^]]*?size\\22: (\d+)",
                                       stablehlo)]


def _compile(fn, args, mesh) -> dict:
    row: dict = {}
    start = time.time()
    try:
        with jax.set_mesh(mesh):
            lowered = fn.lower(*args)
        text = lowered.as_text()
        row["kernels"] = text.count("stablehlo.custom_call @tpu_custom_call")
        row["vmem_limits_mib"] = [round(x / MIB, 1) for x in _vmem_limits(text)]
        compiled = lowered.compile()
    except Exception as err:  # noqa: BLE001 - the compiler's error is the result
        message = str(err).strip().splitlines()
        row.update(status="error", error=f"{type(err).__name__}: {message[0] if message else ''}",
                   seconds=round(time.time() - start, 1))
        return row
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost
    row.update(
        status="compiled", seconds=round(time.time() - start, 1),
        argument_mib=round(mem.argument_size_in_bytes / MIB, 1),
        output_mib=round(mem.output_size_in_bytes / MIB, 1),
        temp_mib=round(mem.temp_size_in_bytes / MIB, 1),
        flops=float(cost.get("flops", 0.0)), bytes_accessed=float(cost.get("bytes accessed", 0.0)),
    )
    return row


def kernel_grid(args) -> list[dict]:
    rows = []
    plan = [(g, d, None) for g in args.generations for d in args.head_dims]
    for spec in args.extra_blocks:
        gen, dim, blocks = spec.split(":")
        plan.append((gen, int(dim), tuple(int(x) for x in blocks.split(","))))
    for gen, dim, override in plan:
        devices = target_devices(SINGLE_CHIP[gen])
        mesh = jax.sharding.Mesh(devices[:1], ("x",))
        fwd, bwd = _flash_tpu.default_blocks(gen, dim)
        blocks = override or (*fwd, *bwd)
        inputs = _inputs(mesh, args.batch, args.length, args.heads, dim, args.buckets)
        for variant in args.variants:
            for kind, fn in _functions(variant, blocks).items():
                row = dict(generation=gen, device_kind=devices[0].device_kind, head_dim=dim,
                           variant=variant, kind=kind, blocks=list(blocks),
                           default_blocks=override is None)
                row.update(_compile(fn, inputs, mesh))
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def _slice_devices(spec: str) -> tuple[list, str, str, str]:
    """(devices, platform, arch, kernel custom-call name) of `v5e:2x2` (TPU) or `h100x8` (GPU)."""
    gpu = re.fullmatch(r"([a-z0-9_]+)x(\d+)", spec)
    if gpu and not spec.startswith("v"):
        from t5x_like.aot import gpu as aot_gpu

        name, count = gpu.group(1), int(gpu.group(2))
        return (aot_gpu.target_devices(name, count), "gpu", aot_gpu.gpu_target(name).arch,
                "__gpu$xla.gpu.triton")
    devices = target_devices(spec)
    return devices, "tpu", _generation(devices[0].device_kind), "tpu_custom_call"


def multichip(topology: str, batch: int) -> dict:
    """Loss + gradient of a small encoder-decoder (pallas attention) on a multi-device target
    (TPU slice `v5e:2x2` or GPU host `h100x8`), heads over 'model' (tensor_parallel rules, model
    axis 2), data over the rest: the kernel runs inside `jax.shard_map`."""
    import flax.linen as nn

    from t5x_like.kernels.flash import compile_target
    from t5x_like.models import TransformerConfig, make_model
    from t5x_like.train import partitioning

    cfg = TransformerConfig(
        vocab_size=32128, emb_dim=512, num_heads=8, head_dim=64, mlp_dim=1024,
        num_encoder_layers=2, num_decoder_layers=2, dropout_rate=0.0, dtype="bfloat16",
        attention_impl="pallas")
    model = make_model(cfg)
    lengths = {"inputs": 512, "targets": 128}
    dummy = model.example_batch(batch, lengths, packed=True)
    devices, plat, arch, custom_call = _slice_devices(topology)
    model_axis = 2 if len(devices) % 2 == 0 else 1
    mesh = partitioning.create_mesh((len(devices) // model_axis, 1, model_axis), devices=devices)
    rules = partitioning.logical_axis_rules("tensor_parallel")
    abstract = jax.eval_shape(lambda: nn.unbox(model.init_variables(jax.random.key(0), dummy)))
    batch_sharding = partitioning.batch_sharding(mesh, rules)
    with partitioning.partitioning_context(mesh, rules):
        params = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                           sharding=NamedSharding(mesh, PartitionSpec())),
            abstract["params"])
    feats = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding)
             for k, v in dummy.items()}
    step = jax.jit(jax.value_and_grad(lambda p, b: model.loss_fn(p, b, None)[0]))
    row = dict(topology=topology, devices=len(devices), device_kind=devices[0].device_kind,
               mesh=dict(mesh.shape), batch=batch, lengths=lengths, model="enc-dec 2+2 layers, "
               "d_model 512, 8 heads x 64, bf16", rules="tensor_parallel")
    start = time.time()
    try:
        with compile_target(plat, arch), \
                partitioning.partitioning_context(mesh, rules):
            lowered = step.lower(params, feats)
        text = lowered.as_text()
        row["kernel_calls"] = text.count(f"stablehlo.custom_call @{custom_call}")
        row["shard_maps"] = text.count("sdy.manual_computation") or text.count("shard_map")
        compiled = lowered.compile()
        mem = compiled.memory_analysis()
        cost = compiled.cost_analysis() or {}  # None on the CUDA backend
        cost = cost[0] if isinstance(cost, list) else cost
        row.update(status="compiled", seconds=round(time.time() - start, 1),
                   temp_mib=round(mem.temp_size_in_bytes / MIB, 1),
                   argument_mib=round(mem.argument_size_in_bytes / MIB, 1),
                   flops=float(cost.get("flops", 0.0)))
    except Exception as err:  # noqa: BLE001
        message = str(err).strip().splitlines()
        row.update(status="error", error=f"{type(err).__name__}: {message[0] if message else ''}",
                   seconds=round(time.time() - start, 1))
    print(json.dumps(row), flush=True)
    return row


def _generation(device_kind: str) -> str:
    for name, gen in GENERATIONS.items():
        if gen.device_kind == device_kind:
            return name
    raise ValueError(f"unknown TPU device kind {device_kind!r}")


def markdown(rows: list[dict], multi: list[dict], args) -> str:
    lines = [
        "# Pallas TPU flash attention, compiled offline by libtpu",
        "",
        f"`scripts/compile_tpu_kernels.py`, jax {jax.__version__}, libtpu "
        f"{_libtpu_version()}, on a CPU-only host ({platform.machine()}); no TPU involved. "
        f"B={args.batch} L={args.length} H={args.heads} bf16, {args.buckets} rel buckets, one "
        "chip. `vmem MiB`: the scoped-VMEM limit each Mosaic kernel requests (fwd; dK/dV, dQ). "
        "`temp`: XLA's temporary bytes; `GFLOP`: XLA cost analysis (the kernels' "
        "`cost_estimate`s plus the XLA ops around them).",
        "",
        "| gen | head_dim | variant | blocks fq,fk/bq,bk | fwd | fwd+bwd | vmem MiB | temp MiB "
        "fwd / bwd | GFLOP fwd / fwd+bwd |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    keyed = {}
    for r in rows:
        keyed.setdefault((r["generation"], r["head_dim"], r["variant"], tuple(r["blocks"])),
                         {})[r["kind"]] = r
    for (gen, dim, variant, blocks), pair in keyed.items():
        f, b = pair.get("fwd", {}), pair.get("fwd+bwd", {})
        status = lambda r: "ok" if r.get("status") == "compiled" else (
            f"**{r.get('error', '?')[:120]}**")
        vm = b.get("vmem_limits_mib") or f.get("vmem_limits_mib") or []
        temp = f"{f.get('temp_mib', '-')} / {b.get('temp_mib', '-')}"
        flops = (f"{f.get('flops', 0) / 1e9:.1f} / {b.get('flops', 0) / 1e9:.1f}"
                 if b.get("status") == "compiled" else "-")
        blk = f"{blocks[0]},{blocks[1]}/{blocks[2]},{blocks[3]}"
        lines.append(f"| {gen} | {dim} | {variant} | {blk} | {status(f)} | {status(b)} | "
                     f"{', '.join(str(x) for x in vm)} | {temp} | {flops} |")
    if multi:
        lines += ["", "## Multi-chip: the kernel inside shard_map", "",
                  "| target | mesh | model | status | kernel calls | temp MiB | GFLOP | s |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in multi:
            status = "compiled" if r["status"] == "compiled" else f"**{r['error'][:160]}**"
            lines.append(f"| {r['topology']} ({r['devices']} x {r['device_kind']}) | {r['mesh']} "
                         f"| {r['model']}, batch {r['batch']} | {status} | "
                         f"{r.get('kernel_calls', '-')} | {r.get('temp_mib', '-')} | "
                         f"{r.get('flops', 0) / 1e9:.1f} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


def _libtpu_version() -> str:
    try:
        from importlib.metadata import version

        return version("libtpu")
    except Exception:  # noqa: BLE001
        return "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generations", default="v4,v5e,v5p,v6e")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--extra-blocks", default="",
                    help="extra rows GEN:HEAD_DIM:FQ,FK,BQ,BK separated by ';'")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--buckets", type=int, default=32)
    ap.add_argument("--multichip", default="",
                    help="TPU topologies / GPU hosts, e.g. v5e:2x2,v4:2x2x1,h100x8")
    ap.add_argument("--multichip-batch", type=int, default=8)
    ap.add_argument("--json", default="")
    ap.add_argument("--md", default="")
    args = ap.parse_args(argv)
    args.generations = [g for g in args.generations.split(",") if g]
    args.head_dims = [int(d) for d in args.head_dims.split(",") if d]
    args.variants = [v for v in args.variants.split(",") if v]
    args.extra_blocks = [s for s in args.extra_blocks.split(";") if s]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    rows = kernel_grid(args)
    multi = [multichip(t, args.multichip_batch) for t in args.multichip.split(",") if t]
    if args.json:
        Path(args.json).write_text(json.dumps({"kernels": rows, "multichip": multi}, indent=1))
    if args.md:
        Path(args.md).write_text(markdown(rows, multi, args))
    failed = [r for r in rows + multi if r["status"] != "compiled"]
    print(f"{len(rows) + len(multi) - len(failed)} compiled, {len(failed)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
