"""Inference from a trained model dir: load a `Predictor`, decode text, score targets.

Library (DESIGN.md "Inference and evaluation"):

    predictor = load_predictor('runs/quickstart')            # latest step, training mesh
    predict(predictor, ['summarize: ...'], method='beam', num_decodes=2)
        -> [{'input', 'output', 'score', 'outputs', 'scores'}]
    score(predictor, ['question'], ['answer']) -> [log-likelihood]
    rank(predictor, ['an email ...'], ['ham', 'spam']) -> [N, 2] log-likelihoods

Prompts are built exactly as the feature converters build training examples; the model lays
them out (`model.prompt_batch`, `rank_batch`, `score_batch`). Inputs are cut to the training
input length `train.sequence_length['inputs']` and end with EOS (kept when cut) unless the
model is a targets-only LM, whose prompt is a text to continue; `decoder_prompts` are texts
whose tokens are prefilled after the input (the outputs hold the continuation only).
Every batch is padded to one shape (`batch_size` rows, or fewer rounded up to the mesh's batch
shards when there are fewer inputs), so one compilation serves a whole call.

`python -m t5x_like.infer` is the CLI (see `main`: a bad flag, checkpoint, input or config
exits with status 2 and a message naming the problem).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import flax.linen as nn
import gin
import jax
import numpy as np

from t5x_like import flags, gin_utils
from t5x_like.data.vocab import DEFAULT_VOCABULARY, VocabularyError, check_fits
from t5x_like.models.config import EOS_ID, PAD_ID
from t5x_like.models.model import pad_ids
from t5x_like.train import checkpoints, partitioning

log = logging.getLogger("t5x_like.infer")  # not `__main__` under `python -m t5x_like.infer`


class InferenceError(ValueError):
    """A bad checkpoint path, input file or task (the CLIs exit with status 2)."""


@dataclasses.dataclass
class Predictor:
    """A model with restored (sharded) params and what is needed to tokenize for it."""

    model: Any                      # t5x_like.models BaseModel
    params: Any                     # plain param tree, on `mesh` with the training partitioning
    vocabulary: Any                 # seqio.Vocabulary
    vocabulary_name: str
    sequence_length: dict[str, int]  # the training task lengths (train.sequence_length)
    mesh: jax.sharding.Mesh
    rules: partitioning.LogicalRules
    model_dir: str
    step: int | None                # None: converted params (`t5x_like.convert --to ours`)

    @property
    def family(self) -> str:
        """The model family, one of `t5x_like.families.NAMES`."""
        return self.model.family

    @property
    def input_length(self) -> int:
        """Max input tokens (incl. EOS) seen in training; longer inputs are truncated."""
        return int(self.sequence_length.get("inputs", self.sequence_length["targets"]))

    @property
    def target_length(self) -> int:
        """Training target length: the default `max_decode_length`."""
        return int(self.sequence_length["targets"])

    @property
    def has_inputs(self) -> bool:
        """Whether the model was trained on a task with inputs."""
        return "inputs" in self.sequence_length


_MODELS: dict[Any, Any] = {}  # TransformerConfig -> BaseModel
_SCORE_FNS: dict[Any, Any] = {}  # model -> jitted model.score
#: Truncation lengths when a config binds no `train.sequence_length` (converted checkpoints):
#: T5's pre-training lengths (`gin/objectives/span_corruption.gin`).
DEFAULT_SEQUENCE_LENGTH = {"inputs": 512, "targets": 114}


# Loading ---------------------------------------------------------------------------------------
def checkpoint_steps(model_dir: str) -> list[int]:
    """Steps of the complete checkpoints in `model_dir/checkpoints` (sorted)."""
    root = os.path.join(model_dir, checkpoints.CHECKPOINT_SUBDIR)
    if not os.path.isdir(root):
        return []
    return sorted(int(n) for n in os.listdir(root)
                  if n.isdigit() and os.path.isdir(os.path.join(root, n, "state")))


def resolve_checkpoint(checkpoint: str, step: int | None = None) -> tuple[str, int | None]:
    """(model dir, step) for a model dir (latest or `step`) or a `checkpoints/<step>` dir;
    (dir, None) for converted params (`python -m t5x_like.convert --to ours` output)."""
    path = os.path.abspath(os.path.expanduser(checkpoint)).rstrip(os.sep)
    if not os.path.isdir(path):
        raise InferenceError(f"checkpoint directory not found: {checkpoint}")
    name, parent = os.path.basename(path), os.path.dirname(path)
    model_dir = path
    if name.isdigit() and os.path.basename(parent) == checkpoints.CHECKPOINT_SUBDIR:
        model_dir = os.path.dirname(parent)
        if step is not None and step != int(name):
            raise InferenceError(f"{checkpoint} is step {name} but step={step} was requested")
        step = int(name)
    if not os.path.isfile(os.path.join(model_dir, "config.gin")):
        raise InferenceError(f"{model_dir} has no config.gin: not a t5x_like model dir "
                             "(expected the output dir of `python -m t5x_like.train`)")
    steps = checkpoint_steps(model_dir)
    if not steps and os.path.isdir(os.path.join(model_dir, checkpoints.CONVERTED_PARAMS_SUBDIR)):
        if step is not None:
            raise InferenceError(f"{model_dir} holds converted params (no training steps): "
                                 "drop --step")
        return model_dir, None
    if not steps:
        raise InferenceError(f"{model_dir} has no complete checkpoint under "
                             f"{checkpoints.CHECKPOINT_SUBDIR}/")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise InferenceError(f"no checkpoint for step {step} in {model_dir} (have {steps})")
    return model_dir, step


def parse_model_config(model_dir: str, gin_files: Sequence[str] = (),
                       gin_bindings: Sequence[str] = (),
                       gin_search_paths: Sequence[str] = ()) -> dict[str, Any]:
    """Clears gin, parses `model_dir/config.gin` + extra files/bindings (later ones win) and
    returns the resolved `train.*` bindings (`model` is built). Raises gin_utils.ConfigError."""
    gin.clear_config()
    gin_utils.parse_gin([os.path.join(model_dir, "config.gin"), *gin_files], gin_bindings,
                        gin_search_paths)
    try:
        bindings = gin.get_bindings("train")
    except (ValueError, TypeError, RuntimeError) as err:
        raise gin_utils.ConfigError(f"invalid gin config in {model_dir}: {err}") from err
    if "model" not in bindings:
        raise gin_utils.ConfigError(f"{model_dir}/config.gin binds no train.model")
    return bindings


def load_predictor(checkpoint: str, *, gin_files: Sequence[str] = (),
                   gin_bindings: Sequence[str] = (), step: int | None = None,
                   mesh_shape: Sequence[int] | None = None, partitioning: str | None = None,
                   gin_search_paths: Sequence[str] = ()) -> Predictor:
    """Builds the model of `checkpoint`'s `config.gin` and restores its params onto a mesh.

    The mesh and logical-axis rules default to the training ones (the config's
    `create_mesh.mesh_shape` and `logical_axis_rules.preset`); e.g.
    `mesh_shape=(1, -1, 1), partitioning='fsdp'` shards every parameter over all devices.
    Gin is process-global: this clears it and leaves the checkpoint's config parsed.
    """
    model_dir, step = resolve_checkpoint(checkpoint, step)
    bindings = parse_model_config(model_dir, gin_files, gin_bindings, gin_search_paths)
    # One model object per config: jitted decode/score functions are cached per model object.
    model = _MODELS.setdefault(bindings["model"].config, bindings["model"])
    lengths = bindings.get("sequence_length", DEFAULT_SEQUENCE_LENGTH)  # unbound: converted
    sequence_length = {k: int(v) for k, v in dict(lengths).items()}
    vocab_name, vocabulary = model_vocabulary(bindings, model_dir, converted=step is None)
    mesh, rules = _mesh_and_rules(mesh_shape, partitioning)
    abstract = _abstract_params(model, sequence_length, mesh, rules)
    try:
        where = (os.path.join(model_dir, checkpoints.CONVERTED_PARAMS_SUBDIR) if step is None
                 else os.path.join(model_dir, checkpoints.CHECKPOINT_SUBDIR, str(step)))
        params = checkpoints.load_params(where, abstract)
    except checkpoints.CheckpointUnreadableError as err:
        others = [s for s in checkpoint_steps(model_dir) if s != step]
        hint = (f"other checkpoints: steps {others} (pass --step=N)" if others
                else "no other checkpoint in this model dir")
        raise InferenceError(f"{err}; {hint}") from err
    return Predictor(model=model, params=params, vocabulary=vocabulary,
                     vocabulary_name=vocab_name, sequence_length=sequence_length, mesh=mesh,
                     rules=rules, model_dir=model_dir, step=step)


def _mesh_and_rules(mesh_shape: Sequence[int] | None, preset: str | None
                    ) -> tuple[jax.sharding.Mesh, partitioning.LogicalRules]:
    """The mesh and logical-axis rules to restore onto (default: the gin-bound training ones)."""
    mesh = (partitioning.create_mesh(mesh_shape) if mesh_shape is not None
            else partitioning.create_mesh())
    rules = (partitioning.logical_axis_rules(preset) if preset
             else partitioning.logical_axis_rules())
    return mesh, rules


def _abstract_params(model: Any, sequence_length: Mapping[str, int], mesh: jax.sharding.Mesh,
                     rules: partitioning.LogicalRules) -> Any:
    """`jax.ShapeDtypeStruct`s of the model's params, each with its training sharding."""
    shards = partitioning.batch_shard_count(mesh, rules)
    init_batch = model.example_batch(shards, sequence_length)
    with partitioning.partitioning_context(mesh, rules):
        boxed = jax.eval_shape(lambda r: model.init_variables(r, init_batch)["params"],
                               jax.random.key(0))
    _, shardings = partitioning.param_shardings(boxed, mesh, rules)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        nn.unbox(boxed), shardings)


def check_vocabulary(name: str, embedding_rows: int, *,
                     fix: str = "bind the checkpoint's own vocabulary: "
                                "--gin.train.vocabulary=NAME_OR_PATH") -> Any:
    """Loads vocabulary `name` and checks, as train's preflight does, that its ids fit an
    embedding of `embedding_rows` rows (`TransformerConfig.vocab_size`): else InferenceError
    naming both sizes and `fix` (ids past the embedding give garbage, or NaN scores)."""
    try:
        return check_fits(name, embedding_rows, fix=f"Wrong vocabulary for this model; {fix}")
    except VocabularyError as err:
        raise InferenceError(str(err) if "ids past" in str(err)
                             else f"vocabulary {name!r}: {err}") from err


def model_vocabulary(bindings: Mapping[str, Any], model_dir: str, *,
                     converted: bool) -> tuple[str, Any]:
    """(name, vocabulary) of a parsed model config (`parse_model_config`), checked against its
    model's embedding by `check_vocabulary`. A trained model dir that binds no
    `train.vocabulary` was trained with train's default, 'c4_32k'; converted params
    (`converted=True`) must name theirs (`python -m t5x_like.convert --vocabulary`)."""
    name = bindings.get("vocabulary")
    if name is None and converted:
        raise InferenceError(
            f"{model_dir}/config.gin binds no train.vocabulary, and converted params carry no "
            "vocabulary of their own: pass --gin.train.vocabulary=NAME_OR_PATH (c4_32k, "
            "c4like_8k or a SentencePiece .model) or convert again with --vocabulary")
    name = str(name or DEFAULT_VOCABULARY)
    return name, check_vocabulary(name, int(bindings["model"].config.vocab_size))


# Tokenization ----------------------------------------------------------------------------------
_TRUNCATED: dict[str, int] = {}  # what -> how many texts were truncated since the last warning
#: Inside `one_truncation_warning`: what -> (truncated, total), reported when it exits.
_DEFERRED: dict[str, tuple[int, int]] | None = None


def _tokens(predictor: Predictor, text: str, limit: int, eos: bool, what: str) -> list[int]:
    """Token ids of `text` (+ EOS), truncated to `limit` ids with EOS kept (counted in
    `_TRUNCATED`; `_warn_truncated` reports them once per call)."""
    ids = [int(i) for i in predictor.vocabulary.encode(text)]
    if len(ids) + eos > limit:
        _TRUNCATED[what] = _TRUNCATED.get(what, 0) + 1
        ids = ids[: limit - eos]
    return ids + [EOS_ID] * eos


def _log_truncated(predictor: Predictor, counts: Mapping[str, tuple[int, int]]) -> None:
    for what, (n, total) in sorted(counts.items()):
        limit = predictor.input_length if what == "input" else predictor.target_length
        log.warning("%d of %d %ss truncated to the model's %s length %d tokens", n, total,
                    what, what, limit)


def _warn_truncated(predictor: Predictor, total: int) -> None:
    """Reports (or, inside `one_truncation_warning`, keeps) the truncations of one call."""
    counts = {} if _DEFERRED is None else _DEFERRED
    for what, n in _TRUNCATED.items():
        counts[what] = max(counts.get(what, (0, 0)), (n, total))
    _TRUNCATED.clear()
    if _DEFERRED is None:
        _log_truncated(predictor, counts)


@contextlib.contextmanager
def one_truncation_warning(predictor: Predictor) -> Iterator[None]:
    """Calls inside (e.g. `predict` then `score` of the same inputs, as the CLI does) report
    truncated inputs / targets once, when the block ends, instead of once per call."""
    global _DEFERRED
    _DEFERRED = {}
    try:
        yield
    finally:
        deferred, _DEFERRED = _DEFERRED, None
        _log_truncated(predictor, deferred)


def _input_ids(predictor: Predictor, texts: Sequence[str]) -> list[list[int]]:
    """Each text's input ids as the model's prompts take them: cut to the training input length,
    with EOS when `model.input_eos`."""
    eos = predictor.model.input_eos(predictor.has_inputs)
    return [_tokens(predictor, t, predictor.input_length, eos, "input") for t in texts]


def _prompt_batch(predictor: Predictor, inputs: Sequence[str],
                  prompts: Sequence[str] | None) -> dict[str, np.ndarray]:
    """The `model.decode` batch for a list of texts (see the module docstring)."""
    encode = predictor.vocabulary.encode
    forced = [[int(i) for i in encode(p)] for p in prompts] if prompts is not None else None
    return predictor.model.prompt_batch(_input_ids(predictor, inputs), forced,
                                        input_length=predictor.input_length)


def _detokenize(predictor: Predictor, ids: np.ndarray) -> str:
    """The text of `ids` `[length]` up to the first EOS, padding dropped."""
    ids = [int(i) for i in ids] + [EOS_ID]
    return str(predictor.vocabulary.decode([i for i in ids[: ids.index(EOS_ID)] if i != PAD_ID]))


def _batches(predictor: Predictor, n: int, batch_size: int) -> tuple[int, list[range]]:
    """Rows per padded batch (a multiple of the mesh's batch shards) and the index ranges of
    each batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    shards = partitioning.batch_shard_count(predictor.mesh, predictor.rules)
    rows = math.ceil(min(batch_size, max(n, 1)) / shards) * shards
    return rows, [range(s, min(s + rows, n)) for s in range(0, n, rows)]


def _pad_rows(batch: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """Pads every array to `rows` rows by repeating the first row (keeps prompts valid)."""
    return {k: np.concatenate([v, np.repeat(v[:1], rows - len(v), axis=0)]) if len(v) < rows
            else v for k, v in batch.items()}


# Predict and score -----------------------------------------------------------------------------
def predict(predictor: Predictor, inputs: Sequence[str], *,
            decoder_prompts: Sequence[str] | None = None, method: str = "greedy",
            max_decode_length: int | None = None, batch_size: int = 32, num_decodes: int = 1,
            seed: int = 0, **decode_options: Any) -> list[dict[str, Any]]:
    """Decodes every input; returns `[{'input', 'output', 'score'}]` in input order.

    `output` is the best decode (text up to EOS), `score` its `model.decode` score (log-prob;
    beam: length-normalised); with `num_decodes > 1` also `outputs` / `scores` (best first).
    `decoder_prompts[i]` (text) forces the first decoder tokens of example i; `output` is then
    what follows them. `decode_options`: `temperature`, `top_k`, `top_p` (sample), `alpha`,
    `num_beams` (beam). `max_decode_length` defaults to the training target length.
    """
    inputs = list(inputs)
    if decoder_prompts is not None and len(decoder_prompts) != len(inputs):
        raise ValueError(f"{len(decoder_prompts)} decoder_prompts for {len(inputs)} inputs")
    if num_decodes < 1 or (method == "greedy" and num_decodes != 1):
        raise ValueError(f"num_decodes={num_decodes} (greedy decodes once)")
    if max_decode_length is not None and max_decode_length < 1:
        raise ValueError(f"max_decode_length={max_decode_length} must be >= 1")
    options = dict(decode_options)
    if method == "beam":
        options["num_beams"] = max(options.get("num_beams", 4), num_decodes)
    if method in ("sample", "beam"):
        options["num_decodes"] = num_decodes
    length = predictor.target_length if max_decode_length is None else max_decode_length
    rows, chunks = _batches(predictor, len(inputs), batch_size)
    rng = jax.random.key(seed)
    results: list[dict[str, Any]] = []
    for b, chunk in enumerate(chunks):
        prompts = [decoder_prompts[i] for i in chunk] if decoder_prompts is not None else None
        batch = _pad_rows(_prompt_batch(predictor, [inputs[i] for i in chunk], prompts), rows)
        with partitioning.partitioning_context(predictor.mesh, predictor.rules):
            out = predictor.model.decode(predictor.params, batch, method=method,
                                         max_decode_length=length,
                                         rng=jax.random.fold_in(rng, b), **options)
        tokens, scores = np.asarray(out["tokens"]), np.asarray(out["scores"])
        for j, i in enumerate(chunk):
            texts = [_detokenize(predictor, t) for t in tokens[j]]
            row = {"input": inputs[i], "output": texts[0], "score": float(scores[j, 0])}
            if num_decodes > 1:
                row.update(outputs=texts, scores=[float(s) for s in scores[j]])
            results.append(row)
    _warn_truncated(predictor, len(inputs))
    return results


def score(predictor: Predictor, inputs: Sequence[str], targets: Sequence[str], *,
          batch_size: int = 32) -> list[float]:
    """Log-likelihood (nats) of each target (+ EOS) given its input, via `model.score`."""
    if len(inputs) != len(targets):
        raise ValueError(f"{len(inputs)} inputs but {len(targets)} targets")
    fn = _SCORE_FNS.setdefault(predictor.model, jax.jit(predictor.model.score))
    rows, chunks = _batches(predictor, len(inputs), batch_size)
    out: list[float] = []
    lt = predictor.target_length
    for chunk in chunks:
        tgt = [_tokens(predictor, targets[i], lt, True, "target") for i in chunk]
        batch = predictor.model.score_batch(_input_ids(predictor, [inputs[i] for i in chunk]), tgt,
                                            input_length=predictor.input_length, target_length=lt)
        with partitioning.partitioning_context(predictor.mesh, predictor.rules):
            values = np.asarray(fn(predictor.params, _pad_rows(batch, rows)))
        out.extend(float(v) for v in values[: len(chunk)])
    _warn_truncated(predictor, len(inputs))
    return out


def rank(predictor: Predictor, inputs: Sequence[str], candidates: Sequence[str], *,
         batch_size: int = 32) -> np.ndarray:
    """Log-likelihood (nats) `[len(inputs), len(candidates)]` of every candidate target (+ EOS)
    given every input: `score` of all pairs, computed with one prefill per input
    (`model.score_candidates`). The argmax per row is rank classification."""
    if not candidates:
        raise ValueError("rank needs at least one candidate")
    tokens = pad_ids([_tokens(predictor, c, predictor.target_length, True, "target")
                      for c in candidates])
    rows, chunks = _batches(predictor, len(inputs), batch_size)
    out = np.zeros((len(inputs), len(candidates)), np.float32)
    for chunk in chunks:
        ids = _input_ids(predictor, [inputs[i] for i in chunk])
        batch = _pad_rows(predictor.model.rank_batch(ids, input_length=predictor.input_length),
                          rows)
        with partitioning.partitioning_context(predictor.mesh, predictor.rules):
            values = predictor.model.score_candidates(predictor.params, batch, tokens)
        out[chunk.start: chunk.stop] = np.asarray(values)[: len(chunk)]
    _warn_truncated(predictor, len(inputs))
    return out


# CLI -------------------------------------------------------------------------------------------
def read_inputs(path: str) -> list[dict[str, str]]:
    """`{'inputs'[, 'targets']}` rows of a text file (one input per non-empty line) or a .jsonl /
    .json file (JSON lines with field 'inputs', optional 'targets'; a .json file may also hold one
    array of such objects). Empty / non-UTF-8 / malformed files, and JSON in a file named like
    text: InferenceError."""
    if not os.path.isfile(path):
        raise InferenceError(f"input file not found: {path}")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InferenceError(f"{path} is not UTF-8: invalid byte 0x{raw[err.start]:02x} at byte "
                             f"offset {err.start}") from err
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise InferenceError(f"input file {path} is empty (no non-blank lines)")
    if not path.endswith((".jsonl", ".json")):
        if _looks_like_json_object(lines[0][1]):
            raise InferenceError(
                f"{path}:{lines[0][0]} holds a JSON object but the file is read as plain text "
                "(one input per line): name it .jsonl to read the 'inputs'/'targets' fields")
        return [{"inputs": line} for _, line in lines]
    if path.endswith(".json") and lines[0][1].lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as err:
            raise InferenceError(f"{path}: invalid JSON ({err.msg} at line {err.lineno})") from err
        entries = [(f"{path} item {n}", item) for n, item in enumerate(items, 1)]
    else:
        entries = []
        for n, line in lines:
            try:
                entries.append((f"{path}:{n}", json.loads(line)))
            except json.JSONDecodeError as err:
                raise InferenceError(f"{path}:{n}: invalid JSON ({err.msg})") from err
    rows = []
    for path_n, row in entries:
        if not isinstance(row, dict) or not isinstance(row.get("inputs"), str):
            raise InferenceError(f"{path_n}: expected an object with a string field 'inputs'")
        if "targets" in row and not isinstance(row["targets"], str):
            raise InferenceError(f"{path_n}: field 'targets' must be a string")
        rows.append({k: row[k] for k in ("inputs", "targets") if k in row})
    return rows


def _looks_like_json_object(line: str) -> bool:
    try:
        return line.lstrip().startswith("{") and isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False


def check_output_file(path: str) -> None:
    """Fail before any decoding when `path` cannot be written (predictions would be lost)."""
    if os.path.isdir(path):
        raise InferenceError(f"--output_file {path} is a directory")
    existing = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise InferenceError(f"--output_file {path}: cannot write to {existing}")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise InferenceError(f"--output_file {path} is not writable")


def task_examples(name: str, split: str, predictor: Predictor,
                  num_examples: int | None = None) -> list[dict[str, str]]:
    """Text examples of a task split: downstream tasks via `downstream.load_examples`, other
    seqio tasks by detokenizing their (unshuffled) `inputs`/`targets` features."""
    from t5x_like import data
    from t5x_like.data import downstream

    if name in downstream.SUITE:
        try:
            rows = downstream.load_examples(name, split)
        except (KeyError, ValueError) as err:
            raise InferenceError(f"task {name}: {err}") from err
        return rows[:num_examples] if num_examples else rows
    try:
        task = data.get_task(name, predictor.vocabulary_name)
        ds = task.get_dataset(sequence_length=predictor.sequence_length, split=split,
                              shuffle=False, num_epochs=1)
    except (KeyError, ValueError) as err:
        raise InferenceError(f"task {name!r} split {split!r}: {err}") from err
    if num_examples:
        ds = ds.take(num_examples)
    rows = [{"targets": _detokenize(predictor, ex["targets"]),
             "inputs": _detokenize(predictor, ex["inputs"]) if "inputs" in ex else ""}
            for ex in ds.as_numpy_iterator()]
    if not rows:
        raise InferenceError(f"task {name!r} split {split!r} has no examples")
    return rows


#: The decoding flags each `--method` uses (others are refused, not silently ignored).
METHOD_FLAGS = {"greedy": (), "sample": ("temperature", "top_k", "top_p"),
                "beam": ("alpha", "num_beams")}
_DECODE_FLAGS = sum(METHOD_FLAGS.values(), ())


def build_parser() -> argparse.ArgumentParser:
    """Flags of `python -m t5x_like.infer` (`--gin.K=V` is handled by gin_utils.split_gin_flags)."""
    p = argparse.ArgumentParser(prog="python -m t5x_like.infer",
                                description="Decode (and score) text with a trained model.")
    p.add_argument("--checkpoint", required=True, help="model dir or model_dir/checkpoints/STEP")
    p.add_argument("--step", type=flags.non_negative_int, help="checkpoint step (default: latest)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--input_file", help="text (one input per line) or .jsonl/.json ('inputs', "
                     "optional 'targets': also scored)")
    src.add_argument("--task", help="a registered task (downstream_* or a seqio task)")
    p.add_argument("--split", default="test", help="task split (default: test)")
    p.add_argument("--num_examples", type=flags.positive_int, default=None,
                   help="first N task examples (default: all)")
    p.add_argument("--output_file", required=True, help="JSONL written here")
    p.add_argument("--method", choices=("greedy", "sample", "beam"), default="greedy")
    p.add_argument("--num_decodes", type=flags.positive_int, default=1,
                   help="decodes per input, best first (sample, beam)")
    p.add_argument("--temperature", type=flags.non_negative_float, default=None,
                   help="sample: softmax temperature (default 1; 0 = greedy)")
    p.add_argument("--top_k", type=flags.non_negative_int, default=None,
                   help="sample: keep the k most likely tokens (default 0 = off)")
    p.add_argument("--top_p", type=flags.unit_interval, default=None,
                   help="sample: nucleus probability in (0, 1] (default 1 = off)")
    p.add_argument("--alpha", type=flags.non_negative_float, default=None,
                   help="beam: length penalty ((5 + len) / 6) ** alpha (default 0.6)")
    p.add_argument("--num_beams", type=flags.positive_int, default=None,
                   help="beam: beam width (default 4, at least --num_decodes)")
    p.add_argument("--max_decode_length", type=flags.positive_int, default=None,
                   help="tokens to decode (default: the training target length)")
    p.add_argument("--batch_size", type=flags.positive_int, default=32)
    p.add_argument("--seed", type=flags.non_negative_int, default=0)
    p.add_argument("--mesh_shape", type=flags.mesh_shape, help="e.g. 1,-1,1 (data,fsdp,model)")
    p.add_argument("--partitioning", help="logical_axis_rules preset")
    p.add_argument("--gin_file", action="append", default=[])
    p.add_argument("--gin_bindings", action="append", default=[])
    p.add_argument("--gin_search_paths", action="append", default=[])
    return p


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """(flags, `--gin.K=V` bindings); a bad flag value, or a decoding flag that `--method` does
    not use, exits with status 2 before anything is loaded."""
    parser = build_parser()
    args, gin_flags = gin_utils.parse_flags(parser, argv)
    used = METHOD_FLAGS[args.method]
    unused = [f"--{k}" for k in _DECODE_FLAGS if getattr(args, k) is not None and k not in used]
    if unused:
        parser.error(f"{', '.join(unused)} {'does' if len(unused) == 1 else 'do'} not apply to "
                     f"--method={args.method}"
                     + (f" (it uses --{', --'.join(used)})" if used else ""))
    if args.method == "greedy" and args.num_decodes > 1:
        parser.error(f"--num_decodes={args.num_decodes} needs --method=sample or beam "
                     "(greedy decodes once)")
    return args, gin_flags


def main(argv: Sequence[str]) -> int:
    """CLI entry point; returns the exit status (2: bad flag, checkpoint, vocabulary, input,
    task or config)."""
    args, gin_flags = parse_args(argv)
    try:
        start = time.perf_counter()
        check_output_file(args.output_file)
        rows = read_inputs(args.input_file) if args.input_file else None
        predictor = load_predictor(
            args.checkpoint, gin_files=args.gin_file, step=args.step, mesh_shape=args.mesh_shape,
            gin_bindings=[*args.gin_bindings, *gin_flags], partitioning=args.partitioning,
            gin_search_paths=args.gin_search_paths)
        if rows is None:
            rows = task_examples(args.task, args.split, predictor, args.num_examples)
        options = {k: getattr(args, k) for k in _DECODE_FLAGS if getattr(args, k) is not None}
        scored = [i for i, r in enumerate(rows) if "targets" in r]
        with one_truncation_warning(predictor):
            preds = predict(predictor, [r["inputs"] for r in rows], method=args.method,
                            max_decode_length=args.max_decode_length,
                            batch_size=args.batch_size, num_decodes=args.num_decodes,
                            seed=args.seed, **options)
            target_scores = score(predictor, [rows[i]["inputs"] for i in scored],
                                  [rows[i]["targets"] for i in scored], batch_size=args.batch_size)
    except ValueError as err:  # InferenceError, ConfigError, CheckpointMismatchError, ...
        print(f"error: {err}", file=sys.stderr)
        return 2
    for i, value in zip(scored, target_scores, strict=True):
        preds[i]["targets"] = rows[i]["targets"]
        preds[i]["target_score"] = value
    os.makedirs(os.path.dirname(os.path.abspath(args.output_file)), exist_ok=True)
    with open(args.output_file, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"inputs": p.pop("input"), **p}, ensure_ascii=False) + "\n"
                     for p in preds)
    what = "converted params" if predictor.step is None else f"step {predictor.step}"
    print(f"[t5x_like.infer] {len(preds)} predictions ({what}) -> "
          f"{args.output_file} in {time.perf_counter() - start:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
