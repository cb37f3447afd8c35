"""``python -m t5x_like.aot``: will this training config compile and fit on a target, from here?

Takes the gin files / bindings of ``python -m t5x_like.train`` plus ``--target`` and compiles,
deviceless, the trainer's jitted train (and eval) step for that target's mesh with the real
compiler (XLA:TPU + Mosaic from libtpu, XLA:GPU + Triton + ptxas from jax-cuda12-plugin, or
XLA:CPU for ``cpu:N``). Prints per-device memory vs HBM, XLA's FLOPs, the planner's estimate,
and, when it does not fit, gin bindings the planner expects to fit.

    python -m t5x_like.aot --target=v5p-128 --gin_file=gin/models/t5_1_1_xxl.gin \\
        --gin_file=gin/runs/pretrain.gin --gin_file=gin/sharding/fsdp.gin \\
        --gin.train.batch_size=2048 --gin.TransformerConfig.remat_policy="'minimal'"

Targets: GPUs ``h100``, ``a100``, ``l4``, ``a10`` (``8xh100`` for eight), TPU slices ``v4-8``,
``v5e-16``, ``v5p-128``, ``v6e-256`` or topologies ``v5e:4x4``, and ``cpu:N`` (N fake host
devices; needs no compiler package). GPU/TPU targets need ``make install-aot``.
Exit status: 0 compiled (and fits, when a budget is known); 1 does not compile or does not fit;
2 bad arguments, unknown target or missing compiler package.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence

from t5x_like import flags

STEPS = {"train": ("train",), "eval": ("eval",), "both": ("train", "eval")}
#: stderr lines the compiler plugins print while loading on a host without GPUs or TPUs (the
#: CUDA plugin's driver probe; libtpu's search for a TPU VM's accelerator type and workers),
#: reporting nothing wrong for a deviceless compile. Dropped at start-up only.
STARTUP_NOISE = re.compile(
    rb"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|\S+ +\S+ +\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine.*"
    rb"|Failed to find host bounds for accelerator type: WARNING: could not determine TPU "
    rb"accelerator type.*"
    rb"|WARNING: Logging before InitGoogle\(\) is written to STDERR"
    rb"|\S+ +\S+ +\d+ common_lib\.cc:\d+\] INVALID_ARGUMENT: Error: unexpected worker hostname "
    rb"'WARNING: could not determine TPU worker hostnames.*"
    rb"|=== Source Location Trace: === ?"
    rb"|learning/\S+/libtpu_init_utils\.cc:\d+)$")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m t5x_like.aot",
        description="Compile the train/eval step for a GPU/TPU target from this machine "
                    "(deviceless) and report memory per device vs HBM.",
        epilog="Any --gin.KEY=VALUE is a gin binding, as for python -m t5x_like.train.")
    p.add_argument("--target", required=True,
                   help="h100, 8xh100, a100, l4, a10, v4-8, v5e-16, v5p-128, v5e:4x4, cpu:8 ...")
    p.add_argument("--gin_file", action="append", default=[], help="gin config (repeatable)")
    p.add_argument("--gin_bindings", action="append", default=[], help="gin binding (repeatable)")
    p.add_argument("--gin_search_paths", action="append", default=[])
    p.add_argument("--step", choices=tuple(STEPS), default="train")
    p.add_argument("--hbm_gb", type=flags.positive_float, default=None,
                   help="per-device memory budget in GiB (default: the target's HBM)")
    p.add_argument("--json_out", default=None, help="also write the report as JSON here")
    p.add_argument("--no_plan", action="store_true", help="skip the planner comparison")
    p.add_argument("--xla_option", action="append", default=[], metavar="KEY=VALUE",
                   help="XLA debug option for the compile, e.g. "
                        "xla_gpu_enable_triton_gemm=false (repeatable)")
    p.add_argument("--hlo_out", default=None, metavar="PREFIX",
                   help="write each step's optimised HLO to PREFIX.<step>.hlo.txt.gz (read by "
                        "t5x_like.aot.roofline)")
    p.add_argument("--segments_per_row", type=flags.positive_int, default=1,
                   help="packed examples per row the flash kernels' latency model assumes "
                        "(H100 'pallas' steps; 1: no segment skipped, the slowest)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def _prepare_environment(target: str) -> None:
    """Before jax is imported: compile on the CPU host (never touch a local accelerator), with
    N host devices for ``cpu:N``."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    m = re.fullmatch(r"cpu:(\d+)", target.strip().lower())
    if m:
        others = re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                        os.environ.get("XLA_FLAGS", ""))
        os.environ["XLA_FLAGS"] = (f"{others} --xla_force_host_platform_device_count="
                                   f"{m.group(1)}").strip()
    if "jax" in sys.modules:  # imported (not yet initialised) by the gin configurables
        import jax

        jax.config.update("jax_platforms", "cpu")


def _option_value(text: str) -> bool | int | float | str:
    """XLA option values are typed: 'false' -> False, '0' -> 0, '0.5' -> 0.5, else the text."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    from t5x_like.runtime import tf_setup

    with tf_setup.drop_stderr_lines(STARTUP_NOISE):  # importing jax loads the plugins
        from t5x_like import gin_utils

    try:
        rest, gin_flags = gin_utils.split_gin_flags(sys.argv[1:] if argv is None else argv)
    except gin_utils.ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(rest)
    _prepare_environment(args.target)
    log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    with tf_setup.drop_stderr_lines(STARTUP_NOISE):  # backends and libtpu initialise here
        import jax

        from t5x_like.aot import step

        jax.devices()
        try:
            target = step.resolve_target(args.target, args.hbm_gb)
        except step.TargetError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    log(f"[aot] target {target.description}")
    bindings = [*args.gin_bindings, *gin_flags]
    try:
        bad = [o for o in args.xla_option if "=" not in o]
        if bad:
            raise ValueError(f"--xla_option {bad[0]!r}: expected KEY=VALUE")
        options = {k: _option_value(v) for k, v in (o.split("=", 1) for o in args.xla_option)}
        gin_utils.parse_gin(args.gin_file, bindings, args.gin_search_paths)
        report = step.run_report(target, STEPS[args.step], gin_files=args.gin_file,
                                 bindings=bindings, with_plan=not args.no_plan, log=log,
                                 compiler_options=options, hlo_prefix=args.hlo_out,
                                 segments_per_row=args.segments_per_row)
    except (ValueError, gin_utils.ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(step.format_report(report), flush=True)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, default=str)
        log(f"[aot] report -> {args.json_out}")
    return 0 if report["compiled"] and report["fits"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
