"""See what an objective does to real text: decoded inputs vs targets, sentinels shown.

CLI:
    python -m t5x_like.data.preview --task c4like_span_corruption [--vocabulary c4like_8k]
        [--num_examples 3] [--inputs_length 64] [--split validation] [--document 0] [--seed 0]
    python -m t5x_like.data.preview --all      # every objective on the same document

Library (for notebooks): `preview_task(...)` / `preview_all(...)` return `Record`s with the
token ids, the per-token noise mask and decoded text, e.g. to plot noise masks.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import shutil
import sys
import textwrap

import numpy as np
import seqio
import tensorflow as tf

from t5x_like import flags
from t5x_like.data import objectives, tasks, tokenize
from t5x_like.data.vocab import get_vocabulary


@dataclasses.dataclass
class Record:
    """One objective example: the raw chunk, its noise mask and what the model sees."""

    task: str
    document: int  # index of the source document in the split
    example: int  # index of the example (chunk) within that document
    sequence_length: dict[str, int]
    chunk: list[int]  # raw token ids [t]
    noise_mask: list[bool]  # [t], True = noise
    inputs: list[int] | None  # ids incl. paradigm tokens and EOS (None: targets-only task)
    targets: list[int]  # ids incl. EOS
    chunk_text: str  # the chunk decoded, noise spans marked [[like this]]
    inputs_text: str | None
    targets_text: str
    chunk_pieces: list[str]  # one SentencePiece piece per chunk token

    @property
    def noise_density(self) -> float:
        return float(np.mean(self.noise_mask)) if self.noise_mask else 0.0


def _decode(vocabulary: seqio.Vocabulary, ids: list[int]) -> str:
    body = ids[:-1] if ids and ids[-1] == vocabulary.eos_id else ids
    text = vocabulary.decode(body)
    return text + (" </s>" if len(body) < len(ids) else "")


def _marked(vocabulary: seqio.Vocabulary, chunk: list[int], mask: list[bool]) -> str:
    """Decoded chunk with each run of noise tokens wrapped in [[ ]]."""
    parts = []
    for is_noise, group in itertools.groupby(zip(chunk, mask, strict=True), key=lambda p: p[1]):
        text = vocabulary.decode([t for t, _ in group])
        parts.append(f"[[{text}]]" if is_noise else text)
    return " ".join(p for p in parts if p)


def preview_task(task: str, *, vocabulary: str = tasks.DEFAULT_VOCABULARY, num_examples: int = 3,
                 inputs_length: int = 64, sequence_length: dict[str, int] | None = None,
                 split: str = "validation", document: int = 0, seed: int = 0) -> list[Record]:
    """The first `num_examples` examples the task makes from documents `document`, ... of
    `split` (a mixture: each of its tasks in turn). Lengths: `sequence_length`, else
    `objectives.default_sequence_length(objective, inputs_length)`."""
    provider = tasks.get_task(task)
    if isinstance(provider, seqio.Mixture):
        records = [r for t in provider.tasks for r in preview_task(
            t.name, vocabulary=vocabulary, num_examples=1, inputs_length=inputs_length,
            sequence_length=sequence_length, split=split, document=document, seed=seed)]
        return records[:num_examples]
    objective = tasks.task_objective(task)
    if objective is None:
        raise ValueError(f"{task!r} is a supervised downstream task (no objective to show); "
                         "see t5x_like.data.downstream.load_examples(name, split).")
    vocab = tasks.get_task(task, vocabulary).output_features["targets"].vocabulary
    lengths = dict(sequence_length or objectives.default_sequence_length(objective, inputs_length))
    if not objective.has_inputs and "inputs" in lengths:
        lengths = {"targets": sum(lengths.values())}
    features = {k: seqio.Feature(vocab) for k in ("inputs", "targets")}
    docs = provider.source.get_dataset(split=split, shuffle=False).skip(document)
    docs = docs.map(lambda x: vocab.encode_tf(x["text"]))
    records: list[Record] = []
    for doc_offset, tokens in enumerate(docs.take(64).as_numpy_iterator()):
        one = tf.data.Dataset.from_tensors({"targets": tf.constant(tokens, tf.int32)})
        with seqio.utils.map_seed_manager(seed + doc_offset):
            examples = objectives.denoise(one, lengths, features, objective, keep_noise_mask=True)
        for k, ex in enumerate(examples.as_numpy_iterator()):
            chunk, mask = ex["chunk"].tolist(), ex["noise_mask"].tolist()
            inputs = ex["inputs"].tolist() if "inputs" in ex else None
            targets = ex["targets"].tolist()
            records.append(Record(
                task=task, document=document + doc_offset, example=k, sequence_length=lengths,
                chunk=chunk, noise_mask=mask, inputs=inputs, targets=targets,
                chunk_text=_marked(vocab, chunk, mask),
                inputs_text=None if inputs is None else _decode(vocab, inputs),
                targets_text=_decode(vocab, targets),
                chunk_pieces=tokenize.sentencepiece_processor(vocab).id_to_piece(chunk),
            ))
            if len(records) == num_examples:
                return records
    return records


def preview_all(corpus: str = "c4like", **kwargs) -> list[Record]:
    """The first example of every objective (and UL2 denoiser) on the same document."""
    names = [f"{corpus}_{o}" for o in [*tasks.OBJECTIVES, *tasks.UL2_DENOISERS]]
    return [r for name in names for r in preview_task(name, num_examples=1, **kwargs)]


def format_record(record: Record, width: int = 120) -> str:
    """Human-readable block: header, the chunk with noise marked, inputs | targets."""
    n_noise = sum(record.noise_mask)
    head = (f"== {record.task}  document {record.document}, example {record.example}: "
            f"{len(record.chunk)} raw tokens, {n_noise} noise "
            f"({record.noise_density:.0%}); lengths {record.sequence_length}")
    lines = [head, "-- original, noise in [[ ]]:"]
    lines += textwrap.wrap(record.chunk_text, width) or [""]
    if record.inputs_text is None:
        lines += [f"-- targets ({len(record.targets)} tokens):"]
        lines += textwrap.wrap(record.targets_text, width)
        return "\n".join(lines)
    col = (width - 3) // 2
    left = textwrap.wrap(record.inputs_text, col) or [""]
    right = textwrap.wrap(record.targets_text, col) or [""]
    lines.append(f"{f'-- inputs ({len(record.inputs)} tokens)':<{col}} | "
                 f"-- targets ({len(record.targets)} tokens)")
    for a, b in itertools.zip_longest(left, right, fillvalue=""):
        lines.append(f"{a:<{col}} | {b}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m t5x_like.data.preview",
                                     description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--task", help="a registered task or mixture, e.g. c4like_span_corruption")
    which.add_argument("--all", action="store_true", help="every objective, same document")
    parser.add_argument("--corpus", default="c4like", help="with --all")
    parser.add_argument("--vocabulary", default=tasks.DEFAULT_VOCABULARY)
    parser.add_argument("--num_examples", type=flags.positive_int, default=3)
    parser.add_argument("--inputs_length", type=flags.positive_int, default=64)
    parser.add_argument("--split", default="validation")
    parser.add_argument("--document", type=flags.non_negative_int, default=0,
                        help="first document index")
    parser.add_argument("--seed", type=flags.non_negative_int, default=0)
    args = parser.parse_args(argv)
    common = dict(vocabulary=args.vocabulary, inputs_length=args.inputs_length,
                  split=args.split, document=args.document, seed=args.seed)
    try:
        # Resolved first: an unknown name raised inside tf.data comes wrapped in a staging trace.
        get_vocabulary(args.vocabulary)
        if args.all:
            records = preview_all(args.corpus, **common)
        else:
            records = preview_task(args.task, num_examples=args.num_examples, **common)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    width = max(80, min(160, shutil.get_terminal_size((120, 24)).columns))
    print("\n\n".join(format_record(r, width) for r in records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
