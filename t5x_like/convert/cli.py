"""`python -m t5x_like.convert` (`__main__.py`): checkpoints between T5X, Hugging Face and t5x_like.

    python -m t5x_like.convert --from hf --to ours --input hf_dir/ --output converted/
    python -m t5x_like.convert --from t5x --to hf --input t5x_params.npz --output hf_dir/ \
        --gin_file gin/models/t5_1_1_base.gin
    python -m t5x_like.convert --from ours --to hf --input runs/my_run --output hf_dir/

Inputs, model config and outputs are documented in docs/models.md (weights from Hugging Face
or T5X) and docs/inference.md (converted checkpoints). Beyond them: `--hf_config` points at an
HF `config.json` not beside `--input`; our own scanned trees stack layers on axis 0, T5X's on
`--scan_axis` (T5X's `param_scan_axis`); for `--from hf` gin bindings override non-structural
fields only (dtype, scan_layers, dropout...). `--to ours` with an `.npz` / `.msgpack` OUT writes
the params to that file and the bindings to OUT minus the suffix + `.gin` (no vocabulary copy);
`--to t5x` writes an orbax PyTree directory, `.npz` or `.msgpack` (`--t5x_scan_layers` stacks
the layers along `--scan_axis`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
from collections.abc import Sequence
from typing import Any

import gin
import numpy as np

from t5x_like import flags
from t5x_like.convert import interop, param_tree
from t5x_like.convert.interop import ConversionError
from t5x_like.gin_utils import REPO_ROOT, quiet_gin_search
from t5x_like.models.config import TransformerConfig
from t5x_like.train.checkpoints import CONVERTED_PARAMS_SUBDIR, find_state_dir

#: The SentencePiece model an HF T5 checkpoint ships; `--to ours` copies it beside the params.
HF_SENTENCEPIECE = "spiece.model"
#: `--vocabulary none`: write converted params without a vocabulary.
NO_VOCABULARY = "none"


def read_tree(path: str) -> Any:
    """Reads a parameter tree (see module docstring) as numpy arrays."""
    if os.path.isfile(path):
        if path.endswith(".npz"):
            with np.load(path) as npz:
                return {k: npz[k] for k in npz.files}
        if path.endswith(".msgpack"):
            from flax import serialization

            with open(path, "rb") as f:
                return serialization.msgpack_restore(f.read())
        if path.endswith(".safetensors"):
            from safetensors.numpy import load_file

            return load_file(path)
        raise ConversionError(f"unsupported parameter file {path!r} "
                              "(.npz, .msgpack, .safetensors or an orbax directory)")
    if not os.path.isdir(path):
        raise ConversionError(f"no such file or directory: {path!r}")
    if (os.path.exists(os.path.join(path, "checkpoint"))
            and not os.path.exists(os.path.join(path, "_METADATA"))):
        raise ConversionError(f"{path!r} looks like a legacy T5X tensorstore checkpoint; "
                              "restore it with T5X and save its 'target' with orbax first")
    return _restore_numpy(find_state_dir(path))


def _restore_numpy(directory: str) -> Any:
    """An orbax PyTree directory as host numpy arrays. Restoring without restore args would
    make orbax rebuild the saved shardings (and warn that this is unsafe on another
    topology); numpy leaves need no devices at all."""
    import jax
    import orbax.checkpoint as ocp
    from etils import epath

    metadata = ocp.PyTreeCheckpointHandler().metadata(epath.Path(directory))
    tree = getattr(metadata, "tree", metadata)
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    return ocp.PyTreeCheckpointer().restore(
        directory, args=ocp.args.PyTreeRestore(restore_args=restore_args))


def _model_dir_gin(path: str) -> str | None:
    for candidate in (path, os.path.dirname(os.path.abspath(path))):
        gin_path = os.path.join(candidate, "config.gin")
        if os.path.isdir(candidate) and os.path.exists(gin_path):
            return gin_path
    return None


def parse_gin(files: Sequence[str], bindings: Sequence[str]) -> dict[str, Any]:
    """Parses gin files/bindings; returns the `TransformerConfig` fields they bind."""
    gin.clear_config()
    gin.add_config_file_search_path(REPO_ROOT)  # for `include 'gin/...'` from any directory
    with quiet_gin_search():
        gin.parse_config_files_and_bindings(list(files), list(bindings), skip_unknown=True)
    bound = {}
    for field in dataclasses.fields(TransformerConfig):
        try:
            bound[field.name] = gin.query_parameter(f"TransformerConfig.{field.name}")
        except ValueError:
            continue
    return bound


def gin_text(config: TransformerConfig, params_path: str | None, source: str,
             vocabulary: str | None = None) -> str:
    """Gin bindings reproducing `config` (every field), pointing the trainer at the params and,
    when known, at the checkpoint's own vocabulary (a `.model` path made absolute)."""
    lines = [f"# Converted by `python -m t5x_like.convert` from {source}.",
             "# Fine-tune: python -m t5x_like.train --gin_file=<run>.gin --gin_file=<this file>",
             "# Decode: python -m t5x_like.infer --checkpoint=<this dir> ...",
             "import t5x_like.models", ""]
    for field in dataclasses.fields(config):
        lines.append(f"TransformerConfig.{field.name} = {getattr(config, field.name)!r}")
    lines += ["make_model.config = @TransformerConfig()", "train.model = @make_model()"]
    if params_path is not None:
        lines.append(f"train.init_params_path = {os.path.abspath(params_path)!r}")
    if vocabulary is not None:
        if _is_vocabulary_file(vocabulary):
            vocabulary = os.path.abspath(os.path.expanduser(vocabulary))
        lines.append(f"train.vocabulary = {vocabulary!r}")
    return "\n".join(lines) + "\n"


def _is_vocabulary_file(name: str) -> bool:
    from t5x_like.data.vocab import KNOWN_VOCABULARIES

    return name not in KNOWN_VOCABULARIES


def bound_vocabulary() -> str | None:
    """`train.vocabulary` as bound by the gin config parsed last (None when unbound)."""
    try:
        value = gin.query_parameter("train.vocabulary")
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def output_vocabulary(args: argparse.Namespace, bound: str | None) -> str | None:
    """The vocabulary `--to ours` writes (see the module docstring), or None for
    `--vocabulary none`; ConversionError when nothing names one."""
    name = args.vocabulary
    if name is None and args.source == "hf":  # the SentencePiece model T5 checkpoints ship
        folder = (args.input if os.path.isdir(args.input)
                  else os.path.dirname(os.path.abspath(args.input)))
        spiece = os.path.join(folder, HF_SENTENCEPIECE)
        name = spiece if os.path.isfile(spiece) else None
    name = name or bound
    if name is None:
        where = ("it has no spiece.model beside it and " if args.source == "hf" else "")
        raise ConversionError(
            f"no vocabulary for {args.input}: {where}the gin config binds no train.vocabulary. "
            "Pass --vocabulary=NAME_OR_PATH, the vocabulary it was trained with (c4_32k, "
            f"c4like_8k or a SentencePiece .model with T5's ids), or --vocabulary="
            f"{NO_VOCABULARY} to write the params without one (infer and evaluate then need "
            "--gin.train.vocabulary=...)")
    return None if name == NO_VOCABULARY else name


def write_tree(tree: dict[str, Any], path: str) -> None:
    """Writes a nested tree as `.npz` ('/' paths), `.msgpack` or an orbax PyTree dir."""
    if path.endswith(".npz"):
        np.savez(path, **param_tree.flatten(tree))
    elif path.endswith(".msgpack"):
        from flax import serialization

        with open(path, "wb") as f:
            f.write(serialization.msgpack_serialize(tree))
    else:
        import orbax.checkpoint as ocp

        if os.path.exists(path):
            raise ConversionError(f"{path!r} exists; choose a new output path")
        ocp.PyTreeCheckpointer().save(os.path.abspath(path), tree)


def convert(args: argparse.Namespace, gin_bindings: Sequence[str]) -> str:
    """Runs one conversion; returns a one-line summary."""
    bound = parse_gin(args.gin_file, gin_bindings)
    vocabulary = bound_vocabulary()
    model_gin = None if bound or args.source == "hf" else _model_dir_gin(args.input)
    if model_gin:  # a t5x_like model dir: its config.gin
        bound = parse_gin([model_gin], [])
        vocabulary = vocabulary or bound_vocabulary()
    # --to ours only, and before the weights are read: a missing vocabulary fails fast.
    vocabulary = output_vocabulary(args, vocabulary) if args.target == "ours" else None
    if args.source == "hf":
        config, params = interop.from_hf(args.input, args.hf_config, **bound)
    else:
        tree = read_tree(args.input)
        # Our own scanned trees stack layers on axis 0; T5X's on `--scan_axis`.
        axis = 0 if args.source == "ours" else args.scan_axis
        if args.source == "ours" and "emb_dim" in bound:  # a full config (e.g. config.gin)
            config = TransformerConfig(**bound)
        else:
            config = interop.config_from_t5x(tree, scan_axis=axis, **bound)
        params = interop.from_t5x(tree, config, scan_axis=axis)
    if vocabulary is not None:  # --to ours: it loads and fits, before anything is written
        from t5x_like import infer

        try:
            infer.check_vocabulary(vocabulary, config.vocab_size, fix="pass --vocabulary="
                                   "NAME_OR_PATH, the one it was trained with")
        except infer.InferenceError as err:
            raise ConversionError(str(err)) from err
    out = args.output
    if args.target == "hf":
        interop.save_hf(config, params, out)
    elif args.target == "t5x":
        write_tree(interop.to_t5x(params, config, scan_layers=args.t5x_scan_layers,
                                  scan_axis=args.scan_axis), out)
    else:
        to_file = out.endswith((".npz", ".msgpack"))
        if to_file:
            params_path, gin_path = out, os.path.splitext(out)[0] + ".gin"
        else:
            os.makedirs(out, exist_ok=True)
            params_path = os.path.join(out, CONVERTED_PARAMS_SUBDIR)
            gin_path = os.path.join(out, "config.gin")
        write_tree(params, params_path)
        if vocabulary is not None and _is_vocabulary_file(vocabulary) and not to_file:
            vocabulary = shutil.copy(vocabulary, os.path.join(out, HF_SENTENCEPIECE))
        with open(gin_path, "w", encoding="utf-8") as f:
            f.write(gin_text(config, params_path, f"{args.source}:{args.input}", vocabulary))
        out = f"{params_path} + {gin_path}"
    n = sum(int(np.prod(v.shape)) for v in param_tree.flatten(params).values())
    return (f"converted {args.source}:{args.input} -> {args.target}:{out} "
            f"({config.family}, {n:,} parameters)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m t5x_like.convert", description=(
        "Convert checkpoints between T5X, Hugging Face and t5x_like."))
    p.add_argument("--from", dest="source", required=True, choices=("t5x", "hf", "ours"))
    p.add_argument("--to", dest="target", required=True, choices=("ours", "t5x", "hf"))
    p.add_argument("--input", required=True, help="checkpoint to read")
    p.add_argument("--output", required=True, help="where to write")
    p.add_argument("--gin_file", action="append", default=[], help="model config (repeatable)")
    p.add_argument("--gin_binding", action="append", default=[], help="e.g. 'TransformerConfig"
                   ".dtype = \"float32\"' (also accepted as --gin.KEY=VALUE)")
    p.add_argument("--hf_config", default=None, help="HF config.json if not beside --input")
    p.add_argument("--scan_axis", type=flags.non_negative_int, default=1,
                   help="layer axis of scanned T5X trees")
    p.add_argument("--t5x_scan_layers", action="store_true", help="write T5X layers stacked")
    p.add_argument("--vocabulary", default=None,
                   help="--to ours: the checkpoint's vocabulary (c4_32k, c4like_8k or a "
                   "SentencePiece .model; default: the HF input's spiece.model, else the gin "
                   f"config's train.vocabulary; '{NO_VOCABULARY}': write none)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (2 on a conversion error)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    bindings = list(args.gin_binding)
    for item in extra:
        if not item.startswith("--gin.") or "=" not in item:
            parser.error(f"unrecognized argument {item!r}")
        bindings.append(item[len("--gin."):])
    if args.vocabulary is not None and args.target != "ours":
        parser.error(f"--vocabulary applies to --to ours, not --to {args.target}")
    try:
        print(convert(args, bindings))
    except (ConversionError, FileNotFoundError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0

