"""Command-line flags of ``python -m t5x_like.train`` and its entry point (gin: ``gin_utils``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from t5x_like import flags
from t5x_like.gin_utils import ConfigError, error_message, parse_gin, split_gin_flags


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
    p.add_argument("--num_processes", type=flags.positive_int, default=None)
    p.add_argument("--process_id", type=flags.non_negative_int, default=None)
    return p


def main(argv: Sequence[str]) -> int:
    """Entry point; returns the process exit status."""
    try:
        rest, gin_flags = split_gin_flags(argv)
        args = build_parser().parse_args(rest)
        if args.tfds_data_dir:
            # Read by t5x_like.data.corpus.get_source when a c4_* task is first read.
            os.environ["TFDS_DATA_DIR"] = os.path.abspath(os.path.expanduser(args.tfds_data_dir))
        from t5x_like.train import distributed

        distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
        parse_gin(args.gin_file, [*args.gin_bindings, *gin_flags], args.gin_search_paths)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from t5x_like.train import trainer

    kwargs = {} if args.model_dir is None else {"model_dir": args.model_dir}
    from t5x_like.data.vocab import VocabularyError
    from t5x_like.models.config import InvalidConfigError
    from t5x_like.train import checkpoints
    from t5x_like.train.model_dir_lock import ModelDirBusyError

    missing = trainer.missing_bindings(kwargs)
    if missing:
        print(f"error: missing required gin binding: {trainer.MissingBindingError(missing)}",
              file=sys.stderr)
        return 2
    try:
        last = trainer.train(**kwargs)
    except checkpoints.CheckpointMismatchError as err:
        print(f"error: {error_message(err)}", file=sys.stderr)
        return 4
    except (checkpoints.CheckpointUnreadableError, FileNotFoundError, trainer.InvalidRunError,
            VocabularyError, ModelDirBusyError, ConfigError, InvalidConfigError) as err:
        print(f"error: {error_message(err)}", file=sys.stderr)
        return 2
    except checkpoints.CheckpointSaveError as err:
        print(f"error: {error_message(err)}; the run stopped. Free space (or fix the permissions) "
              "and run the same command again: it resumes from the last saved checkpoint",
              file=sys.stderr)
        return 5
    except OSError as err:  # a write failed (gin re-raises it as a proxy: use its text)
        print(f"error: {error_message(err)}; the run stopped. Run the same command again to "
              "resume from the last saved checkpoint", file=sys.stderr)
        return 5
    except trainer.Preempted:
        return 0
    except trainer.NonFiniteLossError as err:
        print(f"error: {error_message(err)}", file=sys.stderr)
        return 3
    import jax

    if "loss" in last:
        print(f"[t5x_like.train] process {jax.process_index()}/{jax.process_count()} done: "
              f"final loss {last['loss']:.6f}", flush=True)
    return 0
