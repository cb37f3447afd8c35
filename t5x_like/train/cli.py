"""Command-line parsing and gin set-up for ``python -m t5x_like.train``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import gin

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ConfigError(ValueError):
    """A gin file or binding is invalid (unknown / misspelled / missing required binding)."""


def build_parser() -> argparse.ArgumentParser:
    """The flags (``--gin.KEY=VALUE`` is handled separately: argparse cannot declare it)."""
    p = argparse.ArgumentParser(
        prog="python -m t5x_like.train",
        description="Train a t5x_like model from gin configs.",
        epilog="Any --gin.KEY=VALUE is a gin binding KEY=VALUE, e.g. --gin.train.batch_size=64",
    )
    p.add_argument("--gin_file", action="append", default=[], help="gin config (repeatable)")
    p.add_argument("--gin_bindings", action="append", default=[], help="gin binding (repeatable)")
    p.add_argument("--gin_search_paths", action="append", default=[],
                   help="comma-separated directories searched for gin files and includes")
    p.add_argument("--model_dir", default=None, help="model directory (= train.model_dir)")
    p.add_argument("--tfds_data_dir", default=None,
                   help="TFDS dir holding c4/en:3.1.0 (for c4_* tasks; never downloads)")
    p.add_argument("--coordinator_address", default=None, help="host:port of process 0")
    p.add_argument("--num_processes", type=int, default=None)
    p.add_argument("--process_id", type=int, default=None)
    return p


def split_gin_flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate ``--gin.KEY=VALUE`` / ``--gin.KEY VALUE`` bindings from the other flags."""
    rest, bindings = [], []
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--gin."):
            body = a[len("--gin."):]
            if "=" in body:
                key, value = body.split("=", 1)
            elif i + 1 < len(args):
                key, value = body, args[i + 1]
                i += 1
            else:
                raise ConfigError(f"flag {a} has no value (use --gin.KEY=VALUE)")
            bindings.append(f"{key}={value}")
        else:
            rest.append(a)
        i += 1
    return rest, bindings


def register_configurables() -> None:
    """Import every module that registers gin configurables, so bindings can be checked."""
    import t5x_like.models  # noqa: F401
    import t5x_like.train.optimizers  # noqa: F401
    import t5x_like.train.partitioning  # noqa: F401
    import t5x_like.train.trainer  # noqa: F401


def parse_gin(files: Sequence[str], bindings: Sequence[str],
              search_paths: Sequence[str] = ()) -> None:
    """Parse gin files + bindings; any problem raises ConfigError naming the binding."""
    register_configurables()
    paths = [p for entry in search_paths for p in entry.split(",") if p]
    for path in [*paths, os.getcwd(), REPO_ROOT]:
        gin.add_config_file_search_path(path)
    resolved = []
    for f in files:
        if not os.path.exists(f):
            found = [os.path.join(p, f) for p in [*paths, REPO_ROOT] if
                     os.path.exists(os.path.join(p, f))]
            if not found:
                raise ConfigError(f"gin file not found: {f}")
            f = found[0]
        resolved.append(f)
    try:
        gin.parse_config_files_and_bindings(resolved, list(bindings), finalize_config=False)
    except (ValueError, KeyError, SyntaxError, TypeError, ImportError, OSError) as err:
        raise ConfigError(f"invalid gin config: {err}") from err


def main(argv: Sequence[str]) -> int:
    """Entry point; returns the process exit status."""
    try:
        rest, gin_flags = split_gin_flags(argv)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(rest)
    if args.tfds_data_dir:
        # Read by t5x_like.data.corpus.get_source when a c4_* task is first read.
        os.environ["TFDS_DATA_DIR"] = os.path.abspath(os.path.expanduser(args.tfds_data_dir))
    from t5x_like.train import distributed

    distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
    bindings = [*args.gin_bindings, *gin_flags]
    try:
        parse_gin(args.gin_file, bindings, args.gin_search_paths)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from t5x_like.train import trainer

    kwargs = {} if args.model_dir is None else {"model_dir": args.model_dir}
    from t5x_like.train.checkpoints import CheckpointMismatchError

    try:
        last = trainer.train(**kwargs)
    except CheckpointMismatchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 4
    except trainer.Preempted:
        return 0
    except trainer.NonFiniteLossError as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    except trainer.MissingBindingError as err:
        print(f"error: missing required gin binding: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        if "Required bindings" in str(err):
            print(f"error: missing required gin binding: {err}", file=sys.stderr)
            return 2
        raise
    import jax

    if "loss" in last:
        print(f"[t5x_like.train] process {jax.process_index()}/{jax.process_count()} done: "
              f"final loss {last['loss']:.6f}", flush=True)
    return 0
