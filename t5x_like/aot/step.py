"""Compile the trainer's own train / eval step for a target that is not here, and report on it.

`resolve_target(name)` gives the target's devices: compile-only TPU devices from libtpu
(`tpu.py`) or CUDA devices from the XLA GPU plugin (`gpu.py`), or this host's CPU devices
(`cpu:N`, with `--xla_force_host_platform_device_count=N`). `build_run` reads the parsed gin
config as `t5x_like.train.trainer.train` does, over a mesh of the target's devices;
`compile_step` lowers its jitted step on abstract inputs (nothing is allocated or run), compiles
it and reads XLA's `memory_analysis` / `cost_analysis`. `planner_estimate` puts `t5x_like.plan`'s
prediction beside it; `suggest_fit` names gin bindings that the planner (scaled by the measured
planner/compiler ratio) expects to fit when the config does not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import math
import re
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from t5x_like.aot import roofline

GIB = 2**30


class TargetError(ValueError):
    """An unknown target name, or a target whose compiler is not installed."""


@dataclasses.dataclass(frozen=True)
class Target:
    """Devices to compile for. `platform` is 'cpu', 'tpu' or 'cuda'; `hbm_bytes` per device
    (None: no budget known, e.g. `cpu:N` without `--hbm_gb`)."""

    name: str
    platform: str
    devices: tuple[Any, ...]
    hbm_bytes: int | None
    devices_per_host: int
    description: str
    arch: str | None = None  # e.g. 'sm_90' for CUDA targets, the TPU generation for TPUs

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def device_kind(self) -> str:
        return str(self.devices[0].device_kind)


def _cpu_target(name: str) -> Target:
    import jax

    text = name.strip().lower()
    want = int(text.split(":")[1]) if ":" in text else 1
    devices = jax.devices("cpu")
    if len(devices) != want:
        raise TargetError(f"target {name!r}: this process has {len(devices)} CPU devices; set "
                          f"XLA_FLAGS=--xla_force_host_platform_device_count={want} before "
                          f"jax starts (python -m t5x_like.aot does)")
    return Target(name, "cpu", tuple(devices), None, want, f"{want} x host CPU device (XLA:CPU)")


def _tpu_target(name: str) -> Target:
    from t5x_like.aot import tpu

    try:
        parsed = tpu.parse_target(name)
    except ValueError as err:
        raise TargetError(str(err)) from err
    try:
        devices = tpu.target_devices(parsed)
    except RuntimeError as err:
        raise TargetError(str(err).splitlines()[0]) from err
    per_host = sum(1 for d in devices if d.process_index == devices[0].process_index)
    return Target(name, "tpu", tuple(devices), parsed.hbm_bytes, per_host, parsed.describe(),
                  parsed.generation.name)


def _gpu_target(name: str) -> Target:
    from t5x_like.aot import gpu

    m = re.fullmatch(r"(?:(\d+)\s*x\s*)?([a-z0-9_-]+)", name.strip().lower())  # '8xh100'
    if not m:
        raise TargetError(f"target {name!r}: expected e.g. 'h100', '8xh100', 'v5p-128', 'cpu:8'")
    gpu_name, count = m.group(2), int(m.group(1) or 1)
    try:
        spec = gpu.gpu_target(gpu_name)
    except ValueError as err:
        raise TargetError(f"unknown target {name!r}: not a GPU ({err}), nor a TPU like "
                          f"'v5e-16' / 'v5p-128' / 'v5e:4x4', nor 'cpu:N'") from err
    try:
        devices = gpu.target_devices(gpu_name, num_gpus=count)
    except RuntimeError as err:
        raise TargetError(f"compiling for {gpu_name}: {str(err).splitlines()[0]}") from err
    desc = f"{count} x {spec.device_kind} ({spec.arch}), HBM {spec.hbm_bytes / GIB:.0f} GiB/GPU"
    return Target(name, "cuda", tuple(devices), spec.hbm_bytes, min(count, 8), desc, spec.arch)


def resolve_target(name: str, hbm_gb: float | None = None) -> Target:
    """The devices of `name` (see module docstring; the spelling tells the platform). `hbm_gb`
    overrides the per-device budget (`cpu:N` has none otherwise). Raises TargetError for an
    unknown name or a missing compiler (naming `make install-aot`)."""
    text = name.strip().lower()
    if re.fullmatch(r"cpu(:\d+)?", text):
        target = _cpu_target(name)
    elif re.match(r"v\d", text):
        target = _tpu_target(name)
    else:
        target = _gpu_target(name)
    if hbm_gb is not None:
        target = dataclasses.replace(target, hbm_bytes=int(hbm_gb * GIB))
    return target


# ---- the trainer's configuration, read from gin ------------------------------------------------


@dataclasses.dataclass
class Run:
    """What `train` would build for this config on the target's devices."""

    model: Any
    config: Any  # TransformerConfig
    optimizer: Any
    optimizer_name: str
    batch_size: int
    sequence_length: dict[str, int]
    pack: bool
    num_microbatches: int
    on_nonfinite: str
    mesh: Any
    rules: Any
    preset: str
    state: Any  # train_state.ShardedState


def build_run(target: Target) -> Run:
    """The model / optimizer / mesh / sharded state `train` builds from the parsed gin config,
    the mesh shape evaluated for the target's device count (a gin reference such as
    `@fsdp_tp_mesh_shape()` sees the target's devices and devices per host, not this host's)."""
    from t5x_like import plan
    from t5x_like.models import TransformerConfig, make_model
    from t5x_like.train import partitioning, train_state
    from t5x_like.train.optimizers import create_optimizer

    lengths = plan.gin_value("train.sequence_length")
    if lengths is None:
        raise ValueError("no sequence length: bind train.sequence_length (e.g. --gin_file="
                         "gin/runs/pretrain.gin)")
    model = plan.gin_value("train.model") or make_model()
    config = getattr(model, "config", None) or TransformerConfig()
    optimizer = plan.gin_value("train.optimizer") or create_optimizer()
    n = target.num_devices
    shape = plan.gin_value("create_mesh.mesh_shape", (-1, 1, 1), num_devices=n,
                           devices_per_host=min(target.devices_per_host, n))
    mesh = partitioning.create_mesh(tuple(shape), devices=list(target.devices))
    preset = plan.gin_value("logical_axis_rules.preset", "fsdp")
    rules = partitioning.logical_axis_rules(preset)
    batch_size = int(plan.gin_value("train.batch_size", 128))
    shards = partitioning.batch_shard_count(mesh, rules)
    mb = int(plan.gin_value("train.num_microbatches", 1))
    if batch_size % (shards * mb):
        raise ValueError(f"train.batch_size={batch_size} not divisible by the {shards} batch "
                         f"shards x {mb} microbatches of {partitioning.describe(mesh)}")
    pack = bool(plan.gin_value("train.pack", True))
    state = train_state.sharded_state(
        model, optimizer, model.example_batch(shards, lengths, packed=pack), mesh, rules)
    return Run(model=model, config=config, optimizer=optimizer,
               optimizer_name=str(plan.gin_value("create_optimizer.name", "adafactor")),
               batch_size=batch_size, sequence_length=dict(lengths), pack=pack,
               num_microbatches=mb, on_nonfinite=str(plan.gin_value("train.on_nonfinite", "stop")),
               mesh=mesh, rules=rules, preset=preset, state=state)


def abstract_batch(run: Run) -> dict[str, Any]:
    """The global batch as ShapeDtypeStructs `[batch, length]`, sharded like the trainer's."""
    import jax

    from t5x_like.train import partitioning

    sharding = partitioning.batch_sharding(run.mesh, run.rules)
    shapes = jax.eval_shape(lambda: run.model.example_batch(
        run.batch_size, run.sequence_length, packed=run.pack))
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding)
            for k, v in shapes.items()}


def lower_step(run: Run, which: str) -> Any:
    """`jax.stages.Lowered` of the train (`state, batch, rng`) or eval (`params, batch`) step."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from t5x_like.train import train_step

    batch = abstract_batch(run)
    if which == "train":
        fn = train_step.jit_train_step(
            train_step.make_train_step(run.model, run.optimizer,
                                       num_microbatches=run.num_microbatches,
                                       on_nonfinite=run.on_nonfinite),
            run.state, run.mesh, run.rules)
        key = jax.eval_shape(jax.random.key, 0)
        rng = jax.ShapeDtypeStruct(key.shape, key.dtype,
                                   sharding=NamedSharding(run.mesh, PartitionSpec()))
        return fn.lower(run.state.abstract, batch, rng)
    if which == "eval":
        fn = train_step.jit_eval_step(train_step.make_eval_step(run.model), run.state, run.mesh,
                                      run.rules)
        return fn.lower(run.state.abstract.params, batch)
    raise ValueError(f"step {which!r}: choose 'train' or 'eval'")


def kernel_target(target: Target) -> contextlib.AbstractContextManager[Any]:
    """Select the Pallas flash-attention kernel's target while lowering (its backend and block
    sizes otherwise follow this host's backend)."""
    from t5x_like.kernels import flash

    if target.platform == "cpu":
        return contextlib.nullcontext()
    return flash.compile_target("gpu" if target.platform == "cuda" else "tpu", target.arch)


@contextlib.contextmanager
def heartbeat(label: str, write: Callable[[str], None], every_s: float = 30.0) -> Iterator[None]:
    """`write` `label ... N s` every `every_s` seconds until the block ends (compiles take
    minutes; this shows the process is alive)."""
    stop = threading.Event()
    t0 = time.monotonic()

    def beat() -> None:
        while not stop.wait(every_s):
            write(f"  ... {label}: {time.monotonic() - t0:.0f} s")

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


_OOM_TEMP = re.compile(r"HLO temporaries \(([\d.]+)([KMGT])\)")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_OOM = re.compile(r"(ran out of memory|exceeds available|resource.?exhausted|out of memory)",
                  re.IGNORECASE)


def compile_step(run: Run, target: Target, which: str, out: Callable[[str], None],
                 compiler_options: Mapping[str, Any] | None = None,
                 hlo_out: str | None = None, segments_per_row: int = 1) -> dict[str, Any]:
    """Lower + compile one step; returns its report (see `compiled_report`), or the compiler's
    error with `compiled: False` (and `fits: False` when the error is an out-of-memory).
    `compiler_options`: XLA debug options for this compile (`{'xla_gpu_...': 'false'}`);
    `hlo_out`: write the optimised HLO text there (gzipped), e.g. for `t5x_like.aot.roofline`;
    `segments_per_row`: the packed layout the flash kernels' latency model assumes
    (`aot.flash_time`; 1: no segment skips, the slowest)."""
    t0 = time.monotonic()
    try:
        with kernel_target(target):
            lowered = lower_step(run, which)
    except Exception as err:  # noqa: BLE001 - tracing failed: report where, keep going
        where = traceback.extract_tb(err.__traceback__)[-1]
        msg = " ".join(str(err).split())
        out(f"[aot] {which} step FAILED to trace/lower: {type(err).__name__}: {msg[:300]}")
        return {"step": which, "compiled": False, "fits": None,
                "lower_s": round(time.monotonic() - t0, 1),
                "error": f"tracing/lowering: {type(err).__name__}: {msg[:4000]} "
                         f"(at {where.filename}:{where.lineno})"}
    t1 = time.monotonic()
    out(f"[aot] {which} step traced + lowered in {t1 - t0:.1f} s; compiling for "
        f"{target.num_devices} x {target.device_kind} ...")
    report: dict[str, Any] = {"step": which, "lower_s": round(t1 - t0, 1)}
    pallas_gpu = target.platform == "cuda" and run.config.attention_impl == "pallas"
    with (tempfile.TemporaryDirectory(prefix="t5x_like_aot_dump_", ignore_cleanup_errors=True)
          if pallas_gpu else contextlib.nullcontext()) as dump:  # the kernels' PTX
        options = {**(compiler_options or {}), **({"xla_dump_to": dump} if dump else {})}
        try:
            with heartbeat(f"compiling {which} step", out):
                compiled = lowered.compile(compiler_options=options or None)
        except Exception as err:  # noqa: BLE001 - the compiler's verdict is the report
            msg = " ".join(str(err).split())
            report.update(compiled=False, compile_s=round(time.monotonic() - t1, 1),
                          error=f"{type(err).__name__}: {msg[:4000]}",
                          fits=False if _OOM.search(msg) else None)
            if "Couldn't find output tile sizes" in msg:
                report["hint"] = ("XLA:GPU's Triton GEMM tiling failed on this dot (seen "
                                  "deviceless with jax 0.10.2 on T5 train steps); retry with "
                                  "--xla_option xla_gpu_enable_triton_gemm=false (cuBLAS GEMMs)")
                out(f"[aot] hint: {report['hint']}")
            needed = _OOM_TEMP.search(msg)
            if needed:  # XLA:TPU names what the temporaries would need: calibrates suggestions
                report["oom_temp_bytes"] = int(float(needed.group(1)) * _UNITS[needed.group(2)])
            out(f"[aot] {which} step FAILED to compile after {report['compile_s']} s")
            return report
        report.update(compiled=True, compile_s=round(time.monotonic() - t1, 1))
        report.update(compiled_report(compiled, target.hbm_bytes))
        # the train step's roofline model, on the GPUs `roofline.DEVICES` is calibrated for
        kind = target.device_kind.lower() if target.platform == "cuda" and which == "train" else ""
        device = next((name for name in roofline.DEVICES if name in kind), None)
        text = compiled.as_text() if hlo_out or device else ""
        if hlo_out:
            with gzip.open(hlo_out, "wt") as f:
                f.write(text)
        if device:
            flops = (run.model.flops_per_sequence(run.sequence_length) * run.batch_size
                     / target.num_devices)
            report["step_model"] = roofline.step_model(text, device=device, model_flops=flops,
                                                       top=8)
        out(f"[aot] {which} step compiled in {report['compile_s']} s")
        if dump:  # the Pallas (Triton) kernels' ptxas report, as `gpu.kernel_report` gives it
            from t5x_like.aot import gpu

            report["kernels"] = gpu.report_from_dump(dump, target.arch,
                                                     kernel_filter=lambda name: "flash" in name)
            if report.get("step_model"):  # our kernels' time from their code, not their FLOPs
                from t5x_like.aot import flash_time

                kernels = flash_time.step_kernels(text, dump, report["kernels"], target.arch,
                                                  segments_per_row)
                if kernels:
                    report["flash_model"] = flash_time.step_summary(
                        kernels, report["step_model"], segments_per_row)
    return report


#: Deviceless GPU compiles default to cuBLAS GEMMs: XLA cannot autotune Triton GEMM tiles
#: without the GPU ("Couldn't find output tile sizes"), and on the H100 itself the autotuner
#: chose cuBLAS/cuBLASLt for 103 of the 114 GEMMs of T5.1.1-base's step
#: (benchmarks/h100/autotune_h100_jax0.11.2.textproto). `--xla_option` overrides it.
DEVICELESS_GPU_OPTIONS = {"xla_gpu_enable_triton_gemm": False}


def compiled_report(compiled: Any, hbm_bytes: int | None) -> dict[str, Any]:
    """What XLA says of a compiled step, per device: bytes from `memory_analysis()` (`peak` =
    arguments + outputs - aliased (donated) + temporaries; `fits` = peak <= hbm_bytes, None
    without a budget), FLOPs and bytes accessed from `cost_analysis()` (Pallas kernels without
    a `cost_estimate` count as zero)."""
    m = compiled.memory_analysis()
    b = {k: int(getattr(m, f"{k}_size_in_bytes")) for k in ("argument", "output", "alias", "temp")}
    b["code"] = int(m.generated_code_size_in_bytes)
    b["peak"] = b["argument"] + b["output"] - b["alias"] + b["temp"]
    ca = compiled.cost_analysis()
    ca = (ca[0] if ca else {}) if isinstance(ca, list) else (ca or {})
    return {"bytes_per_device": b, "hbm_bytes": hbm_bytes,
            "fits": None if hbm_bytes is None else b["peak"] <= hbm_bytes,
            **{"xla_" + k.replace(" ", "_"): float(ca[k])
               for k in ("flops", "bytes accessed", "optimal_seconds") if k in ca}}


# ---- the planner beside the compiler -----------------------------------------------------------


def planner_estimate(run: Run, hbm_bytes: int | None, tpu: bool = True) -> dict[str, Any]:
    """`t5x_like.plan.plan` for the same config, mesh, preset, optimizer and microbatches
    (`tpu`: the target's layouts pad Pallas kernel operands to 128 lanes)."""
    from t5x_like import plan

    result = plan.plan(run.config, batch_size=run.batch_size, sequence_length=run.sequence_length,
                       mesh_shape=tuple(run.mesh.shape.values()), preset=run.preset,
                       optimizer=run.optimizer, num_microbatches=run.num_microbatches,
                       packed=run.pack, platform="tpu" if tpu else "gpu",
                       device_memory_gb=None if hbm_bytes is None else hbm_bytes / GIB)
    remat = result["remat"]
    return {
        "remat": remat,
        "num_params": result["num_params"],
        "per_device_batch": result["per_device_batch"],
        # the parts that depend on the remat policy ({policy: bytes}), at the planned one
        "bytes_per_device": {k: v[remat] if isinstance(v, dict) else v
                             for k, v in result["bytes_per_device"].items()},
        "flops_per_device": result["flops_per_device_per_step"]
        + result["recompute_flops_per_step"][remat] / result["num_devices"],
    }


def compare(run: Run, plan_est: Mapping[str, Any], train: Mapping[str, Any]) -> dict[str, float]:
    """Planner / compiler ratios: state (params + optimizer vs arguments - the device's batch
    shard), temp (the planner's temporaries vs XLA's), total (vs peak), flops."""
    pb, xb = plan_est["bytes_per_device"], train["bytes_per_device"]
    batch_bytes = sum(math.prod(v.sharding.shard_shape(v.shape)) * v.dtype.itemsize
                      for v in abstract_batch(run).values())
    out = {
        "state": (pb["params"] + pb["optimizer_state"]) / max(xb["argument"] - batch_bytes, 1),
        "temp": pb["temp"] / max(xb["temp"], 1),
        "total": pb["total"] / max(xb["peak"], 1),
    }
    if train.get("xla_flops"):
        out["flops"] = plan_est["flops_per_device"] / train["xla_flops"]
    return {k: round(v, 4) for k, v in out.items()}


def suggest_fit(run: Run, target: Target, planner_over_compiler: float | None = None,
                headroom: float = 0.9) -> dict[str, Any] | None:
    """The cheapest change the planner expects to fit `headroom` x the target's HBM, as gin
    bindings: `plan.recommend`'s order (data_parallel, fsdp, fsdp_tp; no remat, minimal, full;
    then doubling microbatches, i.e. a smaller per-device batch). The budget is scaled by this
    config's measured planner/compiler ratio, so the planner's known bias does not decide."""
    from t5x_like import plan

    if not target.hbm_bytes:
        return None
    scale = planner_over_compiler if planner_over_compiler and planner_over_compiler > 0 else 1.0
    found = plan.recommend(run.config, num_devices=target.num_devices, batch_size=run.batch_size,
                           sequence_length=run.sequence_length,
                           device_memory_gb=target.hbm_bytes / GIB * scale,
                           optimizer=run.optimizer, devices_per_host=target.devices_per_host,
                           headroom=headroom, platform="tpu" if target.platform == "tpu" else "gpu")
    if found is None:
        return None
    return {**{k: found[k] for k in ("sharding", "remat", "num_microbatches", "per_device_batch")},
            "planned_bytes": found["total_bytes"],
            "expected_compiler_bytes": found["total_bytes"] / scale,
            "bindings": plan.recommend_flags(found)}


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / GIB:.3g}"


def _backend_note(config: Mapping[str, Any]) -> str:
    """' (mosaic_gpu)' when a Pallas step names a build of the kernel other than 'auto'."""
    backend = config.get("flash_backend", "auto")
    return f" ({backend})" if config["attention_impl"] == "pallas" and backend != "auto" else ""


def format_report(report: Mapping[str, Any]) -> str:
    """The human table of `python -m t5x_like.aot`'s report."""
    t, c = report["target"], report["config"]
    lines = [f"target   {t['description']}",
             f"model    {c['family']}, {c['num_params'] / 1e6:.1f}M params, attention "
             f"{c['attention_impl']}{_backend_note(c)}, remat {c['remat']}, {c['optimizer']}",
             f"run      batch {c['batch_size']} ({c['num_microbatches']} microbatch(es)), "
             f"lengths {c['sequence_length']}, mesh {c['mesh']}, rules {c['preset']}", ""]
    hbm = t.get("hbm_bytes")
    lines.append(f"{'per device, GiB':<22}" + "".join(f"{s:>10}" for s in report["steps"])
                 + f"{'planner':>10}")
    plan = report.get("plan") or {}
    pb = plan.get("bytes_per_device")
    plan_rows = {"argument": pb["params"] + pb["optimizer_state"], "temp": pb["temp"],
                 "peak": pb["total"]} if pb else {}
    for row in ("argument", "output", "alias", "temp", "peak"):
        cells = "".join(f"{_gib(s.get('bytes_per_device', {}).get(row)):>10}"
                        for s in report["steps"].values())
        lines.append(f"  {row:<20}{cells}{_gib(plan_rows.get(row)):>10}")
    lines.append(f"  {'HBM':<20}" + f"{_gib(hbm):>10}" * len(report["steps"]))
    flops = "".join(f"{s['xla_flops']:>10.3g}" if "xla_flops" in s else f"{'-':>10}"
                    for s in report["steps"].values())
    pf = plan.get("flops_per_device")
    lines += [f"  {'FLOPs/step':<20}{flops}" + (f"{pf:>10.3g}" if pf else ""), ""]
    verdict = {True: "fits", False: "does NOT fit", None: "no HBM budget given"}
    for name, s in report["steps"].items():
        if not s.get("compiled"):
            took = f" ({s['compile_s']} s)" if "compile_s" in s else ""
            lines.append(f"{name}: DOES NOT COMPILE{took}: {s['error'][:600]}")
            if s.get("hint"):
                lines.append(f"  hint: {s['hint']}")
        else:
            lines.append(f"{name}: compiled in {s['compile_s']} s; peak "
                         f"{_gib(s['bytes_per_device']['peak'])} GiB of {_gib(hbm)}: "
                         f"{verdict[s['fits']]}")
    ratio = report.get("plan_over_compiler")
    if ratio:
        lines.append("planner / compiler: " + ", ".join(f"{k} {v:.2f}" for k, v in ratio.items()))
    if report.get("attention_compiled_as", c["attention_impl"]) != c["attention_impl"]:
        lines.append(f"note: attention {c['attention_impl']} compiled as "
                     f"{report['attention_compiled_as']} here (cuDNN builds its graphs on "
                     "the GPU)")
    for name, s in report["steps"].items():  # the step model is the train step's only
        if s.get("step_model"):
            lines.append(f"{name} {roofline.format_model(s['step_model'])} (predicted, per "
                         "device)")
        if s.get("flash_model"):
            from t5x_like.aot import flash_time

            lines.append(f"{name} {flash_time.format_summary(s['flash_model'])}")
        for kname, k in (s.get("kernels") or {}).items():
            smem = k.get("dyn_smem_bytes", 0) + k.get("static_smem_bytes", 0)
            lines.append(f"{name} kernel {kname}: {k.get('registers', '?')} registers, spills "
                         f"{k.get('spill_store_bytes', '?')}/{k.get('spill_load_bytes', '?')} "
                         f"B (store/load), smem {smem} B, {k.get('blocks_per_sm', '?')} "
                         f"blocks/SM, cp.async {k.get('cp_async', 0)}, TMA {k.get('tma', 0)}, "
                         f"loop {k.get('loop_instructions', '?')} PTX instructions")
    sug = report.get("suggestion")
    if sug:
        lines.append(f"would fit (planner, x{report.get('calibration', 1.0):.2f} calibrated): "
                     + " ".join(sug["bindings"]))
    elif report.get("fits") is False:
        lines.append("nothing the planner tried fits (presets x remat x microbatches)")
    return "\n".join(lines)


def run_report(target: Target, steps: Sequence[str] = ("train",), *, gin_files: Sequence[str] = (),
               bindings: Sequence[str] = (), with_plan: bool = True,
               log: Callable[[str], None] | None = None,
               compiler_options: Mapping[str, str] | None = None,
               hlo_prefix: str | None = None, segments_per_row: int = 1) -> dict[str, Any]:
    """Everything `python -m t5x_like.aot` reports for an already-parsed gin config
    (`hlo_prefix`: also write each step's optimised HLO to `<prefix>.<step>.hlo.txt.gz`;
    `segments_per_row`: see `compile_step`)."""
    import jax

    from t5x_like.train import partitioning

    out = log or (lambda s: print(s, file=sys.stderr, flush=True))
    if target.platform == "cuda":
        compiler_options = {**DEVICELESS_GPU_OPTIONS, **(compiler_options or {})}
    run = build_run(target)
    out(f"[aot] {target.description}; {partitioning.describe(run.mesh)}; rules {run.preset}")
    cfg = run.config
    report: dict[str, Any] = {
        "target": {k: getattr(target, k) for k in ("name", "platform", "device_kind",
                                                   "num_devices", "devices_per_host", "arch",
                                                   "hbm_bytes", "description")},
        "config": {"gin_files": list(gin_files), "bindings": list(bindings),
                   "family": run.model.family,
                   "num_params": sum(math.prod(a.shape) for a in
                                     jax.tree.leaves(run.state.abstract.params)),
                   "attention_impl": cfg.attention_impl, "flash_backend": cfg.flash_backend,
                   "remat": cfg.remat_policy,
                   "optimizer": run.optimizer_name, "batch_size": run.batch_size,
                   "num_microbatches": run.num_microbatches, "sequence_length": run.sequence_length,
                   "mesh": dict(run.mesh.shape), "preset": run.preset},
        # cuDNN builds its attention graphs on the GPU: deviceless, jax's cuDNN path is
        # unavailable and 'cudnn' compiles as XLA's attention (format_report says so).
        "attention_compiled_as": ("xla" if target.platform != "cpu"
                                  and cfg.attention_impl == "cudnn" else cfg.attention_impl),
        "steps": {},
        "compiler_options": dict(compiler_options or {}),
    }
    for which in steps:
        hlo_out = f"{hlo_prefix}.{which}.hlo.txt.gz" if hlo_prefix else None
        report["steps"][which] = compile_step(run, target, which, out, compiler_options, hlo_out,
                                              segments_per_row)
    train = report["steps"].get("train")
    if with_plan:
        t0 = time.monotonic()
        report["plan"] = planner_estimate(run, target.hbm_bytes, target.platform == "tpu")
        out(f"[aot] planner estimate in {time.monotonic() - t0:.1f} s")
        if train and train.get("compiled"):
            report["plan_over_compiler"] = compare(run, report["plan"], train)
    verdicts = [s.get("fits") for s in report["steps"].values()]
    report["compiled"] = all(s.get("compiled") for s in report["steps"].values())
    report["fits"] = (False if False in verdicts else None if None in verdicts else True)
    if report["fits"] is False and with_plan:
        ratio = (report.get("plan_over_compiler") or {}).get("total")
        if ratio is None and train and train.get("oom_temp_bytes"):
            ratio = report["plan"]["bytes_per_device"]["temp"] / train["oom_temp_bytes"]
            report["plan_over_compiler"] = {"temp_from_oom_message": round(ratio, 4)}
        report["calibration"] = ratio or 1.0
        report["suggestion"] = suggest_fit(run, target, ratio)
    return report
