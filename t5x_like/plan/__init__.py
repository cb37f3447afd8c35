"""Per-device memory and FLOP planner: will a config fit a mesh, and with which remat policy?

``plan(config, batch_size=..., sequence_length=..., mesh_shape=..., preset=..., optimizer=...,
remat=...)`` computes, per device and without allocating anything:

- parameters and optimizer state: ``jax.eval_shape`` of the model and optimizer init, sharded
  with ``train.partitioning``'s rules on an ``AbstractMesh`` (exact shard shapes, no devices;
  an indivisible dimension stays replicated, as in training);
- gradients: fp32, sharded like the parameters (twice with microbatching: the accumulator).
  On an accelerator the peak is where the backward pass starts (every residual and the f32
  logits gradient live, almost no parameter gradient yet), so ``temp = max(activations +
  logits gradient, gradients)`` plus the accumulator and the gathered weights; XLA:CPU
  (``compiler='cpu'``) holds both;
- all-gathered weights: with sharded parameters, two layers' full weights in the activation
  dtype (the layer being computed and the next one being gathered);
- activations: the residuals ``jax.vjp`` of the loss saves per ``remat_policy``
  (``activations``): those XLA:TPU / XLA:GPU keep after fusion, or with ``compiler='cpu'``
  every one (2.5x XLA:TPU's total for T5-base on v5e-16); on TPUs (``platform='tpu'``) the
  Pallas flash kernels' `[batch, length, heads, head_dim]` residuals at their padded size
  (a custom call's operands keep XLA:TPU's default layout, head_dim minor, padded to 128
  lanes: 2x at head_dim 64);
- FLOPs per step: ``model.flops_per_sequence`` x batch, plus what each remat policy recomputes.

On an accelerator the temporaries are scaled by ``HEAP_OVERHEAD`` (allocator fragmentation);
XLA's own temporaries (collective buffers, fusion workspaces) are left out. ``tests/test_plan.py``
compares against ``jax.jit(train_step).lower(...).compile().memory_analysis()`` on CPU fake
devices; ``scripts/bench_aot.py`` against XLA:TPU and XLA:GPU (``benchmarks/aot.md``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh

from t5x_like import flags, gin_utils
from t5x_like.models import TransformerConfig, make_model
from t5x_like.models.config import REMAT_POLICIES
from t5x_like.plan.activations import activation_bytes, boxed_params
from t5x_like.train import partitioning
from t5x_like.train.optimizers import Optimizer, create_optimizer

GIB = 1024**3
#: ``plan``'s ``compiler``: XLA:TPU / XLA:GPU after fusion, or XLA:CPU (every residual kept).
COMPILERS = ("accelerator", "cpu")
#: ``plan``'s ``platform``: where layouts pad a Pallas kernel's operands ('tpu') or not.
PLATFORMS = ("tpu", "gpu")
#: XLA:TPU's heap over its buffers' live peak (buffer-assignment dumps, T5-small on v5e-16:
#: 1.06 data parallel, 1.09 FSDP): the planner's accelerator temp is scaled by it.
HEAP_OVERHEAD = 1.08
#: Presets whose activation rules put heads / MLP / vocabulary on the ``model`` axis.
_TP_PRESETS = ("tensor_parallel", "tensor_parallel_2d")


def _mesh(mesh_shape: Sequence[int], num_devices: int | None) -> tuple[int, int, int]:
    shape = [int(s) for s in mesh_shape]
    if any(s < 1 and s != -1 for s in shape):
        raise ValueError(f"mesh_shape {tuple(shape)}: entries must be >= 1 (or one -1)")
    if num_devices is not None and num_devices < 1:
        raise ValueError(f"num_devices={num_devices} must be >= 1")
    if -1 in shape and num_devices is None:
        raise ValueError(f"mesh_shape {tuple(shape)} has a -1 entry: give num_devices")
    n = num_devices if num_devices is not None else math.prod(shape)
    return partitioning.resolve_mesh_shape(shape, n)


def _tree_bytes(abstract: Any, shardings: Any = None) -> int:
    """Bytes of an abstract tree: whole, or per device (each leaf's shard) with ``shardings``."""
    leaves = jax.tree.leaves(abstract)
    if shardings is not None:
        shards = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
        leaves = [jax.ShapeDtypeStruct(s.shard_shape(a.shape), a.dtype)
                  for a, s in zip(leaves, shards, strict=True)]
    return sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize for a in leaves)


def gathered_weight_bytes(params: Any, dtype: Any, model_axis: int = 1) -> float:
    """FSDP all-gather buffers: twice (this layer + the prefetched next) the largest layer's
    (or non-layer parameter's) weights in the activation ``dtype``, divided by the
    tensor-parallel ``model_axis`` (those shards are never gathered)."""
    groups: dict[tuple[str, ...], int] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = tuple(str(getattr(k, "key", k)) for k in path)
        cut = next((i for i, n in enumerate(names) if n.startswith("layers_")), None)
        key = names if cut is None else names[: cut + 1]
        groups[key] = groups.get(key, 0) + math.prod(leaf.shape)
    return 2.0 * max(groups.values()) * jnp.dtype(dtype).itemsize / model_axis


def plan(config: TransformerConfig, *, batch_size: int, sequence_length: Mapping[str, int],
         mesh_shape: Sequence[int], preset: str = "fsdp", optimizer: str | Optimizer = "adafactor",
         remat: str | None = None, num_microbatches: int = 1, num_devices: int | None = None,
         device_memory_gb: float | None = None, packed: bool = True,
         compiler: str = "accelerator", platform: str = "tpu") -> dict[str, Any]:
    """Per-device memory (bytes) and FLOPs of one training step; see the module docstring.

    ``mesh_shape``: ``(data, fsdp, model)``, one -1 allowed with ``num_devices``. ``remat``: the
    policy of ``total_bytes`` (default ``config.remat_policy``; every policy is reported).
    ``optimizer``: 'adafactor' / 'adamw' (``create_optimizer``, so gin bindings such as
    ``adafactor.factored`` apply) or an Optimizer. ``compiler``: one of ``COMPILERS``;
    ``platform``: one of ``PLATFORMS`` (TPU layouts pad the flash kernels' residuals).
    """
    if compiler not in COMPILERS:
        raise ValueError(f"compiler={compiler!r}; choose one of {COMPILERS}")
    if platform not in PLATFORMS:
        raise ValueError(f"platform={platform!r}; choose one of {PLATFORMS}")
    _check_counts(batch_size=batch_size, num_microbatches=num_microbatches,
                  sequence_length=sequence_length, device_memory_gb=device_memory_gb)
    shape = _mesh(mesh_shape, num_devices)
    remat = config.remat_policy if remat is None else remat
    if remat not in REMAT_POLICIES:
        raise ValueError(f"remat={remat!r}; choose one of {REMAT_POLICIES}")
    rules = partitioning.logical_axis_rules(preset)
    amesh = AbstractMesh(shape, partitioning.MESH_AXES)
    per_device_batch = _per_device_batch(batch_size, num_microbatches, amesh, rules, preset)
    params, fsdp_split, state, whole = _state_bytes(config, sequence_length, optimizer,
                                                    num_microbatches, amesh, rules)
    tp_axis = shape[2] if preset in _TP_PRESETS else 1
    acts = activation_bytes(
        config, per_device_batch=per_device_batch, sequence_length=sequence_length,
        model_axis=tp_axis, param_ratio=state["params"] / max(whole["params"], 1),
        packed=packed, fused=compiler != "cpu",
        lanes=128 if platform == "tpu" and compiler != "cpu" else 0,
        gathered=shape[1] > 1 and tp_axis == 1 and fsdp_split)  # pure FSDP
    gathered = (gathered_weight_bytes(params, config.activation_dtype, tp_axis)
                if state["params"] < whole["params"] else 0.0)  # none when unsharded
    model = make_model(config)
    parts = model.flops_breakdown(dict(sequence_length))
    # The f32 gradient of the logits, [batch, positions, vocab] per device (vocab split by TP).
    positions = parts["output"] / (6 * config.emb_dim * config.vocab_size)
    logits_grad = per_device_batch * positions * config.vocab_size * 4 / tp_axis
    temp = _temp_bytes(compiler, acts, state, gathered, logits_grad)
    totals = {k: state["params"] + state["optimizer_state"] + v for k, v in temp.items()}
    flops = float(model.flops_per_sequence(dict(sequence_length))) * batch_size
    memory = None if device_memory_gb is None else float(device_memory_gb) * GIB
    return {
        "family": config.family,
        "num_params": sum(math.prod(a.shape) for a in jax.tree.leaves(params)),
        "mesh": dict(zip(partitioning.MESH_AXES, shape, strict=True)),
        "num_devices": math.prod(shape), "preset": preset,
        "optimizer": optimizer if isinstance(optimizer, str) else "custom",
        "batch_size": batch_size, "num_microbatches": num_microbatches,
        "per_device_batch": per_device_batch, "sequence_length": dict(sequence_length),
        "remat": remat,
        "bytes_per_device": {**state, "gathered_weights": gathered, "activations": acts,
                             "logits_gradient": logits_grad, "temp": temp, "total": totals},
        "global_bytes": whole, "total_bytes": totals[remat], "device_memory_bytes": memory,
        "fits": None if memory is None else totals[remat] <= memory,
        "flops_per_step": flops, "flops_per_device_per_step": flops / math.prod(shape),
        "recompute_flops_per_step": _recompute_flops(parts, flops, batch_size),
    }


def _per_device_batch(batch_size: int, num_microbatches: int, amesh: AbstractMesh,
                      rules: partitioning.LogicalRules, preset: str) -> int:
    """Examples per device per microbatch; ValueError when the batch does not divide."""
    shards = partitioning.batch_shard_count(amesh, rules)
    if batch_size % (shards * num_microbatches):
        raise ValueError(f"batch_size={batch_size} not divisible by {shards} batch shards x "
                         f"{num_microbatches} microbatches (mesh {tuple(amesh.axis_sizes)}, "
                         f"preset {preset!r})")
    return batch_size // shards // num_microbatches


def _state_bytes(config: TransformerConfig, sequence_length: Mapping[str, int],
                 optimizer: str | Optimizer, num_microbatches: int, amesh: AbstractMesh,
                 rules: partitioning.LogicalRules
                 ) -> tuple[Any, bool, dict[str, int], dict[str, int]]:
    """(abstract parameters, whether any is split over `fsdp`, bytes per device, whole bytes):
    parameters, optimizer state and gradients (fp32, twice with microbatches: the accumulator)
    sharded with the training rules on `amesh`; the unsharded parameters and optimizer state."""
    boxed = boxed_params(config, tuple(sorted(sequence_length)))
    logical, param_sh = partitioning.param_shardings(boxed, amesh, rules)
    params = nn.unbox(boxed)
    opt = create_optimizer(optimizer) if isinstance(optimizer, str) else optimizer
    opt_abstract = jax.eval_shape(opt.tx.init, params)
    opt_sh = partitioning.derived_state_shardings(opt_abstract, params, logical, amesh, rules)
    fsdp_split = any("fsdp" in jax.tree.leaves(tuple(s.spec)) for s in jax.tree.leaves(param_sh))
    param_b = _tree_bytes(params, param_sh)
    per_device = {"params": param_b, "optimizer_state": _tree_bytes(opt_abstract, opt_sh),
                  "gradients": param_b * (2 if num_microbatches > 1 else 1)}
    whole = {"params": _tree_bytes(params), "optimizer_state": _tree_bytes(opt_abstract)}
    return params, fsdp_split, per_device, whole


def _temp_bytes(compiler: str, acts: Mapping[str, float], state: Mapping[str, int],
                gathered: float, logits_grad: float) -> dict[str, float]:
    """{policy: temporaries} per device: the one place the parts are combined (DESIGN.md)."""
    if compiler == "cpu":  # XLA:CPU: every residual and the whole gradient at once
        return {k: state["gradients"] + gathered + v for k, v in acts.items()}
    # The peak is where the backward pass starts (see the module docstring).
    accum = state["gradients"] - state["params"]
    return {k: HEAP_OVERHEAD * (accum + gathered + max(v + logits_grad, state["params"]))
            for k, v in acts.items()}


def _recompute_flops(parts: Mapping[str, float], flops: float, batch_size: int) -> dict[str, float]:
    """{policy: FLOPs per step recomputed under remat}: 'minimal' redoes the attention's
    forward, 'full' every layer's forward (a third of their training FLOPs)."""
    attn = float(parts["attention"]) * batch_size
    layers = flops - float(parts["output"]) * batch_size
    return {"none": 0.0, "dots": 0.0, "minimal": attn / 3.0, "full": layers / 3.0}


def _check_counts(*, batch_size: int, sequence_length: Mapping[str, int],
                  num_microbatches: int = 1, device_memory_gb: float | None = None) -> None:
    """ValueError naming the first count < 1 (or memory <= 0): nothing to plan with it."""
    counts = {"batch_size": batch_size, "num_microbatches": num_microbatches,
              **{f"sequence_length[{k!r}]": v for k, v in sequence_length.items()}}
    for name, value in counts.items():
        if int(value) < 1:
            raise ValueError(f"{name}={value} must be >= 1")
    if device_memory_gb is not None and not float(device_memory_gb) > 0:
        raise ValueError(f"device_memory_gb={device_memory_gb} must be > 0")


def preset_mesh(preset: str, num_devices: int, devices_per_host: int = 8,
                model_parallelism: int = 8) -> tuple[tuple[int, int, int], str]:
    """Mesh shape and rules preset of a ``gin/sharding/<preset>.gin`` file for a device count."""
    if preset == "data_parallel":
        return (num_devices, 1, 1), "data_parallel"
    if preset == "fsdp":
        return (1, num_devices, 1), "fsdp"
    if preset == "fsdp_tp":
        shape = partitioning.fsdp_tp_mesh_shape(model_parallelism, num_devices,
                                     min(devices_per_host, num_devices))
        return shape, "tensor_parallel_2d"
    raise ValueError(f"preset={preset!r}; choose one of data_parallel, fsdp, fsdp_tp")


def recommend(config: TransformerConfig, *, num_devices: int, batch_size: int,
              sequence_length: Mapping[str, int], device_memory_gb: float,
              optimizer: str = "adafactor", devices_per_host: int = 8,
              headroom: float = 0.9, platform: str = "tpu") -> dict[str, Any] | None:
    """The first plan that fits ``headroom`` x memory, trying the cheapest communication first:
    data_parallel, fsdp, fsdp_tp; per preset no remat, 'minimal', 'full', then doubling the
    microbatches. Its ``sharding`` key names the ``gin/sharding`` file. None if nothing fits.
    ``platform``: as for ``plan``."""
    _check_counts(batch_size=batch_size, sequence_length=sequence_length,
                  device_memory_gb=device_memory_gb)
    if num_devices < 1 or devices_per_host < 1:
        raise ValueError(f"num_devices={num_devices} and devices_per_host={devices_per_host} "
                         "must be >= 1")
    for name in ("data_parallel", "fsdp", "fsdp_tp"):
        shape, preset = preset_mesh(name, num_devices, devices_per_host)
        mb = 1
        while batch_size % (shape[0] * shape[1] * mb) == 0:  # batch shards x microbatches
            result = plan(config, batch_size=batch_size, sequence_length=sequence_length,
                          mesh_shape=shape, preset=preset, optimizer=optimizer,
                          num_microbatches=mb, device_memory_gb=device_memory_gb,
                          platform=platform)
            for policy in ("none", "minimal", "full"):
                if result["bytes_per_device"]["total"][policy] <= headroom * device_memory_gb * GIB:
                    result.update(remat=policy, sharding=name, fits=True,
                                  total_bytes=result["bytes_per_device"]["total"][policy])
                    return result
            mb *= 2
    return None


def recommend_flags(found: Mapping[str, Any]) -> list[str]:
    """Command-line flags (for ``python -m t5x_like.train``, ``plan``, ``aot``) that reproduce a
    ``recommend`` result after the model and run gin files."""
    flags = [f"--gin_file=gin/sharding/{found['sharding']}.gin",
             f"--gin.TransformerConfig.remat_policy=\"'{found['remat']}'\""]
    if found["num_microbatches"] > 1:
        flags.append(f"--gin.train.num_microbatches={found['num_microbatches']}")
    return flags


def format_plan(result: Mapping[str, Any]) -> str:
    """A human-readable table of ``plan``'s result."""
    b = result["bytes_per_device"]
    gib = lambda x: f"{x / GIB:9.2f} GiB"
    mesh = ", ".join(f"{k}={v}" for k, v in result["mesh"].items())
    lines = [
        f"{result['family']} with {result['num_params'] / 1e9:.3g}B parameters on "
        f"{result['num_devices']} devices, mesh({mesh}), preset {result['preset']}, "
        f"{result['optimizer']}",
        f"batch {result['batch_size']} ({result['per_device_batch']} per device x "
        f"{result['num_microbatches']} microbatch(es)), lengths {result['sequence_length']}",
        "",
        "per device                     bytes",
        f"  parameters (fp32)        {gib(b['params'])}",
        f"  optimizer state          {gib(b['optimizer_state'])}",
        f"  gradients                {gib(b['gradients'])}",
        f"  all-gathered weights     {gib(b['gathered_weights'])}",
        f"  logits gradient (f32)    {gib(b['logits_gradient'])}",
    ]
    for policy, act in b["activations"].items():
        mark = " <-" if policy == result["remat"] else ""
        lines.append(f"  activations remat={policy:<8}{gib(act)}   total {gib(b['total'][policy])}"
                     f"{mark}")
    mem = result.get("device_memory_bytes")
    if mem:
        verdict = "fits" if result["fits"] else "does NOT fit"
        lines.append(f"  total (remat={result['remat']}) {gib(result['total_bytes'])} of "
                     f"{mem / GIB:.0f} GiB: {verdict}")
    lines += ["", f"FLOPs/step {result['flops_per_step']:.4g} (per device "
              f"{result['flops_per_device_per_step']:.4g}); remat={result['remat']} recomputes "
              f"{result['recompute_flops_per_step'][result['remat']]:.3g} more per step"]
    return "\n".join(lines)


def gin_value(key: str, default: Any = None, **kwargs: Any) -> Any:
    """A gin-bound value; macros and ``@fn()`` references are evaluated (with ``kwargs``)."""
    try:
        value = gin.query_parameter(key)
    except ValueError:
        return default
    if isinstance(value, gin.config.ConfigurableReference) and value.evaluate:
        return value.scoped_configurable_fn(**kwargs)
    return value


def _parse_lengths(text: str) -> dict[str, int]:
    """`--sequence_length` (argparse type): `inputs=512,targets=114`, lengths >= 1."""
    try:
        lengths = {k.strip(): int(v) for k, v in (item.split("=") for item in text.split(","))}
    except ValueError:
        lengths = {}
    if not lengths or min(lengths.values()) < 1:
        raise argparse.ArgumentTypeError("expected FEATURE=LENGTH pairs with lengths >= 1, e.g. "
                                         f"inputs=512,targets=114; got {text!r}")
    return lengths


def _fit_advice(fix: Mapping[str, Any] | None, where: str = "on these devices") -> str:
    """The change that would fit (``fits_with``), or that nothing does ``where``."""
    if fix is None:
        return (f"nothing fits {where}, even with fsdp_tp, full remat and microbatches: add "
                "devices or lower train.batch_size")
    return (f"fits with {fix['sharding']}, remat={fix['remat']}, {fix['num_microbatches']} "
            f"microbatch(es) ({fix['total_bytes'] / GIB:.2f} GiB): " + " ".join(fix["gin_flags"]))


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``python -m t5x_like.plan`` (``--gin.KEY=VALUE`` is split off before)."""
    p = argparse.ArgumentParser(prog="python -m t5x_like.plan", description=__doc__.split("\n")[0])
    p.add_argument("--gin_file", action="append", default=[])
    p.add_argument("--gin_bindings", action="append", default=[])
    p.add_argument("--mesh", type=flags.mesh_shape,
                   help="data,fsdp,model (one may be -1); default: gin's")
    p.add_argument("--num_devices", type=flags.positive_int)
    p.add_argument("--devices_per_host", type=flags.positive_int, default=8)
    p.add_argument("--preset", help="rules preset; default: gin's")
    p.add_argument("--optimizer", choices=("adafactor", "adamw"))
    p.add_argument("--remat", choices=REMAT_POLICIES)
    p.add_argument("--batch_size", type=flags.positive_int)
    p.add_argument("--sequence_length", type=_parse_lengths, help="e.g. inputs=512,targets=114")
    p.add_argument("--num_microbatches", type=flags.positive_int)
    p.add_argument("--device_memory_gb", type=flags.positive_float)
    p.add_argument("--recommend", action="store_true",
                   help="search data_parallel/fsdp/fsdp_tp x remat x microbatches (needs "
                        "--num_devices and --device_memory_gb)")
    p.add_argument("--compiler", default="accelerator", choices=COMPILERS,
                   help="activation model: XLA:TPU/GPU fusion (default) or XLA:CPU")
    p.add_argument("--platform", default="tpu", choices=PLATFORMS,
                   help="tpu: Pallas kernels' head_dim operands padded to 128 lanes")
    p.add_argument("--json", action="store_true")
    return p


def _recommend_from_flags(args: argparse.Namespace, config: TransformerConfig,
                          num_devices: int | None) -> dict[str, Any] | None:
    """`recommend`'s result on ``num_devices`` with its ``gin_flags``; None if nothing fits."""
    if num_devices is None or args.device_memory_gb is None:
        raise ValueError("--recommend needs --num_devices and --device_memory_gb")
    result = recommend(config, num_devices=num_devices, batch_size=args.batch_size,
                       sequence_length=args.sequence_length,
                       device_memory_gb=args.device_memory_gb, optimizer=args.optimizer,
                       devices_per_host=args.devices_per_host)
    if result is not None:
        result["gin_flags"] = recommend_flags(result)
    return result


def _plan_from_flags(args: argparse.Namespace, config: TransformerConfig) -> dict[str, Any]:
    """`plan` of the flags (mesh, preset and microbatches from gin where not given); when it
    does not fit, ``fits_with`` names the cheapest change that would (`recommend`)."""
    n = args.num_devices
    mesh = args.mesh or gin_value("create_mesh.mesh_shape", (-1, 1, 1), num_devices=n,
                                  devices_per_host=min(args.devices_per_host, n) if n else None)
    preset = args.preset or gin_value("logical_axis_rules.preset", "fsdp")
    result = plan(config, batch_size=args.batch_size, sequence_length=args.sequence_length,
                  mesh_shape=mesh, preset=preset, optimizer=args.optimizer, remat=args.remat,
                  num_microbatches=args.num_microbatches or gin_value("train.num_microbatches", 1),
                  num_devices=n, device_memory_gb=args.device_memory_gb, compiler=args.compiler,
                  platform=args.platform)
    if result["fits"] is False:  # name the cheapest change that would fit
        found = _recommend_from_flags(args, config, result["num_devices"])
        keys = ("sharding", "remat", "num_microbatches", "total_bytes", "gin_flags")
        result["fits_with"] = None if found is None else {k: found[k] for k in keys}
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m t5x_like.plan``; returns the exit status (1: does not fit, 2: bad config)."""
    if not os.environ.get("JAX_PLATFORMS"):  # shapes and arithmetic only: never initialise a
        jax.config.update("jax_platforms", "cpu")  # GPU/TPU plugin (a venv may hold them)
    args, gin_flags = gin_utils.parse_flags(build_parser(),
                                            sys.argv[1:] if argv is None else argv)
    try:
        gin_utils.parse_gin(args.gin_file, [*args.gin_bindings, *gin_flags])
        config = TransformerConfig()
        # Gin fills what the flags leave out.
        args.sequence_length = args.sequence_length or gin_value("train.sequence_length")
        if args.sequence_length is None:
            raise ValueError("no sequence length: bind train.sequence_length or pass "
                             "--sequence_length=inputs=512,targets=114")
        args.batch_size = args.batch_size or gin_value("train.batch_size", 128)
        args.optimizer = args.optimizer or gin_value("create_optimizer.name", "adafactor")
        if args.recommend:
            result = _recommend_from_flags(args, config, args.num_devices)
            if result is None:
                print(_fit_advice(None, f"{args.device_memory_gb:g} GiB on {args.num_devices} "
                                  f"devices at batch {args.batch_size}"), file=sys.stderr)
                return 1
        else:
            result = _plan_from_flags(args, config)
    except ValueError as err:  # gin_utils.ConfigError too
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=1))
    else:  # the table, the flags that reproduce it and the fit advice
        print(format_plan(result))
        if "gin_flags" in result:
            print("\nreproduce with: " + " ".join(result["gin_flags"]))
        if result.get("fits") is False:
            print("\n" + _fit_advice(result.get("fits_with")))
    return 0 if result.get("fits") is not False else 1
