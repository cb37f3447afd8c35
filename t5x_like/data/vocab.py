"""SentencePiece vocabularies with T5's conventions, as `seqio.Vocabulary` objects.

Known names:
  c4_32k     the C4-trained 32k BPE model shipped in the axlearn wheel (see `assets.py`),
             + 100 sentinels: vocab_size 32,100 (T5 pads the embedding to 32,128; that is the
             model's business).
  c4like_8k  a unigram model trained here on the c4like train split (8,000 pieces including
             the specials), + 100 sentinels: vocab_size 8,100. For tiny CPU experiments.
Any other argument is taken as a path to a SentencePiece `.model` file.

T5 conventions checked on load: pad=0, eos=1, unk=2, no bos; sentinel `<extra_id_i>` is
id vocab_size - 1 - i. CLI: `python -m t5x_like.data.vocab train|encode ...`.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import io
import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from t5x_like import flags
from t5x_like.data import assets, atomic, clean, corpus

if TYPE_CHECKING:
    import seqio

KNOWN_VOCABULARIES = ("c4_32k", "c4like_8k")
#: The vocabulary of every task, trainer and tool unless one is named (T5's).
DEFAULT_VOCABULARY = "c4_32k"
DEFAULT_EXTRA_IDS = 100
C4_32K_PIECES = 32_000
# 60k sampled sentences (~7.5 MB) train in ~20 s on 2 cores; all 160k take ~3x longer.
C4LIKE_8K = {"vocab_size": 8_000, "model_type": "unigram", "max_sentences": 60_000, "seed": 0,
             "byte_fallback": True}
# Always in the vocabulary, however rare in the training sample (Q, Z, #, @ ...).
_ASCII_PRINTABLE = "".join(chr(c) for c in range(33, 127))
# SentencePiece skips sentences longer than this many bytes (its max_sentence_length).
_MAX_SENTENCE_BYTES = 4192


class VocabularyError(ValueError):
    """A vocabulary is unknown, missing, or breaks T5's id conventions."""


# ----------------------------------------------------------------------------- training
def _sentences(texts: Iterable[str]) -> Iterator[str]:
    """Training sentences: every line split at sentence ends. Short pieces keep SentencePiece's
    unigram trainer fast (its cost grows faster than linearly with the length of a line)."""
    for text in texts:
        for line in text.splitlines():
            for s in clean.split_sentences(line):
                if len(s.encode("utf-8")) <= _MAX_SENTENCE_BYTES:
                    yield s


def _sample(sentences: Iterable[str], max_sentences: int, seed: int) -> list[str]:
    """A deterministic sample: the `max_sentences` sentences with the smallest seeded hash,
    kept in their original order (independent of SentencePiece's own sampling)."""
    key = str(seed).encode()
    keyed = [(hashlib.blake2b(s.encode("utf-8"), digest_size=8, key=key).digest(), i, s)
             for i, s in enumerate(sentences)]
    if len(keyed) > max_sentences:
        keyed.sort()
        keyed = sorted(keyed[:max_sentences], key=lambda t: t[1])
    return [s for _, _, s in keyed]


def train_vocabulary(text_files_or_iterator: Iterable[str] | Iterable[os.PathLike],
                     output_prefix: str | os.PathLike, vocab_size: int,
                     model_type: str = "unigram", *, max_sentences: int = 1_000_000,
                     seed: int = 0, character_coverage: float = 0.9995,
                     byte_fallback: bool = True, num_threads: int = 2) -> Path:
    """Train a SentencePiece model with T5's ids (pad=0, eos=1, unk=2, no bos).

    `text_files_or_iterator`: paths of text/JSONL files (read like the cleaner's CLI) or an
    iterable of document strings. Lines are split into sentences; at most `max_sentences`
    of them are used, picked by a seeded hash so that training is deterministic. Writes
    `<output_prefix>.model` and `.vocab` (atomically) and returns the `.model` path.
    All printable ASCII characters are always pieces; with `byte_fallback` (256 byte pieces)
    any other character outside `character_coverage` is spelled as UTF-8 bytes, never unk.
    """
    import sentencepiece as spm

    if model_type not in ("unigram", "bpe", "word", "char"):
        raise ValueError(f"model_type must be unigram, bpe, word or char; got {model_type!r}")
    items = list(text_files_or_iterator) if not isinstance(text_files_or_iterator, str) else [
        text_files_or_iterator]
    if items and all(isinstance(x, os.PathLike) or (isinstance(x, str) and "\n" not in x
                     and os.path.isfile(x)) for x in items):
        texts: Iterable[str] = (text for _, text in clean.read_documents(items))
    else:
        texts = items
    sentences = _sample(_sentences(texts), max_sentences, seed)
    if not sentences:
        raise ValueError("no training text: the input has no non-empty lines")
    out = Path(output_prefix)
    out.parent.mkdir(parents=True, exist_ok=True)
    spm.set_random_generator_seed(seed)
    # The model is returned through `model_writer` (not written under a model_prefix) so that
    # no temporary path ends up inside the proto: same inputs, byte-identical model.
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=buf, vocab_size=vocab_size,
        model_type=model_type, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        character_coverage=character_coverage, byte_fallback=byte_fallback,
        required_chars=_ASCII_PRINTABLE, num_threads=num_threads,
        input_sentence_size=0, shuffle_input_sentence=False, minloglevel=2)
    model = buf.getvalue()
    sp = spm.SentencePieceProcessor(model_proto=model)
    table = "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n"
                    for i in range(sp.get_piece_size()))
    for ext, data in ((".vocab", table.encode("utf-8")), (".model", model)):
        with atomic.write_file(f"{out}{ext}") as tmp:
            tmp.write_bytes(data)
    return Path(str(out) + ".model")


def c4like_8k_dir(data_dir: str | os.PathLike | None = None) -> Path:
    return assets.data_dir(data_dir) / "vocab" / "c4like_8k"


def _c4like_8k_meta() -> dict:
    return {"corpus_fingerprint": corpus.fingerprint(), **C4LIKE_8K}


def c4like_8k_ready(data_dir: str | os.PathLike | None = None) -> bool:
    """True if the c4like_8k model exists and was trained on the current corpus build."""
    d = c4like_8k_dir(data_dir)
    try:
        meta = json.loads((d / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return (meta == _c4like_8k_meta() and (d / "spm.model").is_file())


def build_c4like_8k(data_dir: str | os.PathLike | None = None) -> Path:
    """Train c4like_8k on the c4like train split (corpus must be built), atomically."""
    d = c4like_8k_dir(data_dir)
    with atomic.build_dir(d) as tmp:
        train_vocabulary(corpus.iter_split_texts("train", data_dir), tmp / "spm", **C4LIKE_8K)
        (tmp / "meta.json").write_text(json.dumps(_c4like_8k_meta(), indent=2) + "\n")
    return d / "spm.model"


# ----------------------------------------------------------------------------- loading
def check_spm_model(path: str | os.PathLike) -> int:
    """Raise VocabularyError unless the model has pad=0, eos=1, unk=2; returns its size."""
    import sentencepiece as spm

    try:
        sp = spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as e:
        raise VocabularyError(f"{path} is not a readable SentencePiece model: {e}") from e
    got = {"pad": sp.pad_id(), "eos": sp.eos_id(), "unk": sp.unk_id()}
    if got != {"pad": 0, "eos": 1, "unk": 2}:
        raise VocabularyError(
            f"{path} lacks T5's special ids: expected pad=0 eos=1 unk=2, got "
            f"{' '.join(f'{k}={v}' for k, v in got.items())} (-1 = absent). With these ids "
            "padding would be read as real tokens. Retrain it with `python -m "
            "t5x_like.data.vocab train ...` (which sets pad=0 eos=1 unk=2 bos=-1).")
    return sp.get_piece_size()


def vocabulary_path(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    """The `.model` file behind vocabulary `name` (a known name or a path)."""
    if name == "c4_32k":
        p = assets.asset_path("c4_32k_spm", data_dir)
        if not p.is_file():
            raise VocabularyError(f"vocabulary 'c4_32k' is not fetched yet ({p} missing). Run "
                                  "`python -m t5x_like.data.prepare`.")
        return p
    if name == "c4like_8k":
        if not c4like_8k_ready(data_dir):
            raise VocabularyError(f"vocabulary 'c4like_8k' is not built (or is stale) under "
                                  f"{c4like_8k_dir(data_dir)}. Run "
                                  "`python -m t5x_like.data.prepare`.")
        return c4like_8k_dir(data_dir) / "spm.model"
    if name.endswith(".model") or os.sep in name:
        p = Path(name).expanduser()
        if not p.is_file():
            raise VocabularyError(f"SentencePiece model {p} does not exist")
        return p
    raise VocabularyError(f"unknown vocabulary {name!r}; known: {', '.join(KNOWN_VOCABULARIES)}"
                          " or a path to a SentencePiece .model file")


@functools.lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int, extra_ids: int) -> seqio.SentencePieceVocabulary:
    import seqio

    pieces = check_spm_model(path)
    vocab = seqio.SentencePieceVocabulary(path, extra_ids=extra_ids)
    assert vocab.vocab_size == pieces + extra_ids, (vocab.vocab_size, pieces, extra_ids)
    return vocab


def get_vocabulary(name: str = DEFAULT_VOCABULARY, *, extra_ids: int = DEFAULT_EXTRA_IDS,
                   data_dir: str | os.PathLike | None = None) -> seqio.Vocabulary:
    """`seqio.SentencePieceVocabulary` for a known name or a `.model` path, with `extra_ids`
    sentinels on top. Cached per (file, extra_ids). Raises VocabularyError with the fix."""
    path = vocabulary_path(name, data_dir)
    vocab = _load(str(path.resolve()), path.stat().st_mtime_ns, extra_ids)
    if name == "c4_32k" and vocab.vocab_size != C4_32K_PIECES + extra_ids:
        raise VocabularyError(f"c4_32k has {vocab.vocab_size - extra_ids} pieces, expected "
                              f"{C4_32K_PIECES}; the cached file {path} is not the pinned one")
    return vocab


def check_fits(name: str, embedding_rows: int, *, what: str = "vocabulary",
               fix: str = "") -> seqio.Vocabulary:
    """The vocabulary ``name``, checked (by every entry point, before it trains, scores or
    decodes) to fit an embedding of ``embedding_rows`` rows: a larger one would read ids past
    it (garbage, NaN scores). Raises VocabularyError naming both sizes, then ``fix``."""
    vocab = get_vocabulary(name)
    size = int(vocab.vocab_size)
    if size > embedding_rows:
        raise VocabularyError(
            f"{what}={name!r} has {size} ids (with sentinels) but the model's embedding has "
            f"TransformerConfig.vocab_size={embedding_rows} rows: token ids past "
            f"{embedding_rows - 1} would read garbage. {fix}".rstrip())
    return vocab


# ----------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m t5x_like.data.vocab",
                                description="Train or try SentencePiece vocabularies.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a T5-style SentencePiece model (pad=0 eos=1 unk=2)")
    t.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="text files (one document each), .jsonl files (field text) or dirs")
    t.add_argument("--output_prefix", required=True, help="writes PREFIX.model, PREFIX.vocab")
    t.add_argument("--vocab_size", type=flags.positive_int, required=True,
                   help="pieces incl. specials")
    t.add_argument("--model_type", default="unigram", choices=("unigram", "bpe", "word", "char"))
    t.add_argument("--max_sentences", type=flags.positive_int, default=1_000_000)
    t.add_argument("--seed", type=flags.non_negative_int, default=0)
    e = sub.add_parser("encode", help="show how a vocabulary splits some text")
    e.add_argument("text")
    e.add_argument("--vocabulary", default=DEFAULT_VOCABULARY,
                   help="known name or path to a .model")
    e.add_argument("--data_dir", default=None)
    args = p.parse_args(argv)
    try:
        if args.command == "train":
            path = train_vocabulary([Path(x) for x in args.inputs], args.output_prefix,
                                    args.vocab_size, args.model_type,
                                    max_sentences=args.max_sentences, seed=args.seed)
            print(f"wrote {path} ({check_spm_model(path)} pieces)")
        else:
            vocab = get_vocabulary(args.vocabulary, data_dir=args.data_dir)
            ids = vocab.encode(args.text)
            print(f"vocab_size={vocab.vocab_size} tokens={len(ids)}")
            print(" ".join(f"{vocab.decode([i])!r}:{i}" for i in ids))
            print(vocab.decode(ids))
    except (VocabularyError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
