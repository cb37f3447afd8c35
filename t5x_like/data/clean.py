"""A C4-style text cleaner (Raffel et al. 2020, section 2.2, adapted) as pure functions and a CLI.

Rules, in order, for each page (document):
  1. empty or whitespace-only pages are dropped (reason `empty`);
  2. pages containing "lorem ipsum" are dropped (`lorem_ipsum`);
  3. pages containing a curly brace are dropped (`curly_brace`: code, templates, CSS);
  4. each line is kept only if it does not mention "javascript" (`javascript`), has no cookie /
     privacy-policy boilerplate (`policy`), no word longer than `max_word_length` (`long_word`),
     ends in terminal punctuation (. ! ? ellipsis or a closing double quote, optionally followed
     by a closing bracket or single quote: `no_terminal_punctuation`) and has at least
     `min_words_per_line` words (`too_few_words`; C4 used 5, we default to 3);
  5. pages left with fewer than `min_sentences` sentences are dropped (`too_few_sentences`);
  6. across the whole corpus, every span of `dedupe_span` consecutive sentences is kept only at
     its first occurrence; later copies are cut out, and a page that falls below
     `min_sentences` because of that is dropped (`duplicate`).

CLI: `python -m t5x_like.data.clean INPUT... --output out.jsonl`. A `.jsonl` input holds one
document per line (field `text`, optional `id`); any other file is ONE document (its whole
contents); a directory means every file under it, sorted. Output is JSONL with `id` and `text`.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from t5x_like import flags
from t5x_like.data import atomic

Document = tuple[str, str]  # (id, text)

PAGE_REASONS = ("empty", "lorem_ipsum", "curly_brace", "too_few_sentences", "duplicate")
LINE_REASONS = ("javascript", "policy", "long_word", "no_terminal_punctuation", "too_few_words")
POLICY_PHRASES = ("terms of use", "privacy policy", "cookie policy", "uses cookies",
                  "use of cookies", "use cookies")

# A sentence ends at . ! ? or an ellipsis, optionally followed by closing quotes or brackets.
_SENTENCE_BREAK = re.compile(r"(?<=[.!?\u2026][\"\u201d\u2019')\]])\s+|(?<=[.!?\u2026])\s+")
_WS = re.compile(r"\s+")
_CLOSERS = ")]\u2019'"  # may follow the terminal mark: `(Applause.)`, `'Stop.'`


@dataclasses.dataclass(frozen=True)
class CleanConfig:
    """Thresholds of the cleaner; the defaults are the project's (C4: 5 words per line)."""

    min_words_per_line: int = 3
    min_sentences: int = 3
    max_word_length: int = 1000
    terminal_punctuation: tuple[str, ...] = (".", "!", "?", '"', "\u201d", "\u2026")
    drop_policy_lines: bool = True
    dedupe_span: int = 3  # 0 turns cross-corpus deduplication off


@dataclasses.dataclass
class CleanStats:
    """Counts of what the cleaner kept and dropped, per reason."""

    input_docs: int = 0
    kept_docs: int = 0
    input_chars: int = 0
    kept_chars: int = 0
    dropped_docs: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    dropped_lines: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    removed_duplicate_sentences: int = 0

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "dropped_docs": dict(sorted(self.dropped_docs.items())),
                "dropped_lines": dict(sorted(self.dropped_lines.items()))}

    def summary(self) -> str:
        lines = [f"documents: {self.input_docs} in, {self.kept_docs} kept, "
                 f"{self.input_docs - self.kept_docs} dropped; characters: {self.input_chars} in, "
                 f"{self.kept_chars} kept"]
        lines += [f"  dropped documents, {r}: {self.dropped_docs.get(r, 0)}" for r in PAGE_REASONS]
        lines += [f"  dropped lines, {r}: {self.dropped_lines.get(r, 0)}" for r in LINE_REASONS]
        lines.append(f"  duplicate sentences cut: {self.removed_duplicate_sentences}")
        return "\n".join(lines)


def split_sentences(text: str) -> list[str]:
    """Split text into sentences at terminal punctuation followed by whitespace (heuristic)."""
    return [s for s in (p.strip() for p in _SENTENCE_BREAK.split(text.strip())) if s]


def line_drop_reason(line: str, config: CleanConfig = CleanConfig()) -> str | None:
    """Why C4-style cleaning drops this (stripped, non-empty) line, or None to keep it."""
    lower = line.lower()
    if "javascript" in lower:
        return "javascript"
    if config.drop_policy_lines and any(p in lower for p in POLICY_PHRASES):
        return "policy"
    words = line.split()
    if any(len(w) > config.max_word_length for w in words):
        return "long_word"
    if not line.rstrip(_CLOSERS).endswith(config.terminal_punctuation):
        return "no_terminal_punctuation"
    if len(words) < config.min_words_per_line:
        return "too_few_words"
    return None


def page_drop_reason(text: str) -> str | None:
    """Page-level rules that look at the raw page: empty, lorem ipsum, curly braces."""
    if not text.strip():
        return "empty"
    if "lorem ipsum" in text.lower():
        return "lorem_ipsum"
    if "{" in text or "}" in text:
        return "curly_brace"
    return None


def clean_page(text: str, config: CleanConfig = CleanConfig(),
               stats: CleanStats | None = None) -> str | None:
    """Apply rules 1-5 to one page; returns the kept lines joined by newlines, or None."""
    reason = page_drop_reason(text)
    kept: list[str] = []
    if reason is None:
        for raw in text.splitlines():
            line = _WS.sub(" ", raw).strip()
            if not line:
                continue
            why = line_drop_reason(line, config)
            if why is None:
                kept.append(line)
            elif stats is not None:
                stats.dropped_lines[why] += 1
        if sum(len(split_sentences(line)) for line in kept) < config.min_sentences:
            reason = "too_few_sentences"
    if reason is not None:
        if stats is not None:
            stats.dropped_docs[reason] += 1
        return None
    return "\n".join(kept)


class SpanDeduplicator:
    """Keeps each span of `span` consecutive sentences only where it is first seen.

    Spans are compared case- and whitespace-insensitively through an 8-byte hash, so memory
    stays small (about 8 bytes per sentence of the corpus plus set overhead).
    """

    def __init__(self, span: int = 3):
        if span < 1:
            raise ValueError(f"span must be >= 1, got {span}")
        self.span = span
        self._seen: set[bytes] = set()

    def _key(self, sentences: list[str]) -> bytes:
        joined = " ".join(_WS.sub(" ", s).lower() for s in sentences)
        return hashlib.blake2b(joined.encode("utf-8"), digest_size=8).digest()

    def dedupe(self, text: str) -> tuple[str, int]:
        """Cut spans seen before (in earlier pages or earlier in this page); returns (the
        remaining text, its line structure kept, the number of sentences removed)."""
        numbered = [(i, sentence) for i, line in enumerate(text.splitlines())
                    for sentence in split_sentences(line)]
        sentences = [sentence for _, sentence in numbered]
        drop = [False] * len(sentences)
        for start in range(len(sentences) - self.span + 1):
            key = self._key(sentences[start:start + self.span])
            if key in self._seen:
                drop[start:start + self.span] = [True] * self.span
            else:
                self._seen.add(key)
        if not any(drop):
            return text, 0
        lines: dict[int, list[str]] = collections.defaultdict(list)
        for (i, sentence), dropped in zip(numbered, drop, strict=True):
            if not dropped:
                lines[i].append(sentence)
        return "\n".join(" ".join(lines[i]) for i in sorted(lines)), sum(drop)


def clean_documents(docs: Iterable[Document], config: CleanConfig = CleanConfig(),
                    stats: CleanStats | None = None,
                    deduplicator: SpanDeduplicator | None = None) -> Iterator[Document]:
    """Clean a stream of (id, text) documents with all six rules, deduplicating across it (or,
    given one `deduplicator` for several calls, across several streams)."""
    stats = stats if stats is not None else CleanStats()
    dedup = deduplicator
    if dedup is None and config.dedupe_span > 0:
        dedup = SpanDeduplicator(config.dedupe_span)
    for doc_id, text in docs:
        stats.input_docs += 1
        stats.input_chars += len(text)
        cleaned = clean_page(text, config, stats)
        if cleaned is None:
            continue
        if dedup is not None:
            cleaned, removed = dedup.dedupe(cleaned)
            stats.removed_duplicate_sentences += removed
            if removed and len(split_sentences(cleaned)) < config.min_sentences:
                stats.dropped_docs["duplicate"] += 1
                continue
        stats.kept_docs += 1
        stats.kept_chars += len(cleaned)
        yield doc_id, cleaned


class DecodeError(ValueError):
    """Input bytes are not valid in the requested encoding."""


def decode_bytes(data: bytes, source: str, encoding_errors: str = "strict") -> str:
    """Decode UTF-8; on bad bytes raise DecodeError naming `source` and the byte offset."""
    try:
        return data.decode("utf-8", errors=encoding_errors)
    except UnicodeDecodeError as e:
        bad = data[e.start:e.end].hex(" ")
        raise DecodeError(
            f"{source}: not valid UTF-8 at byte offset {e.start} (bytes {bad}: {e.reason}). "
            "Convert the file to UTF-8, or pass --encoding_errors=replace (Python: "
            "encoding_errors='replace') to substitute U+FFFD and go on.") from e


def _expand(paths: Iterable[str | os.PathLike]) -> Iterator[Path]:
    for p in map(Path, paths):
        if p.is_dir():
            yield from sorted(q for q in p.rglob("*") if q.is_file())
        elif p.is_file():
            yield p
        else:
            raise FileNotFoundError(f"no such input file or directory: {p}")


def read_documents(paths: Iterable[str | os.PathLike],
                   encoding_errors: str = "strict") -> Iterator[Document]:
    """Yield (id, text) from files: `.jsonl` = one JSON object per line with `text` (and
    optionally `id`); any other file = one document; directories are walked in sorted order."""
    for path in _expand(paths):
        text = decode_bytes(path.read_bytes(), str(path), encoding_errors)
        if path.suffix != ".jsonl":
            yield str(path), text
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from e
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"{path}:{lineno}: expected an object with a string 'text' field")
            yield str(record.get("id", f"{path}:{lineno}")), record["text"]


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; prints the kept/dropped summary. Returns the exit status."""
    p = argparse.ArgumentParser(
        prog="python -m t5x_like.data.clean",
        description="C4-style cleaning of text files (one document per file) or JSONL "
                    "(one document per line, field 'text') into a JSONL corpus.")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files or directories")
    p.add_argument("--output", required=True, help="output JSONL path (fields id, text)")
    d = CleanConfig()
    p.add_argument("--min_words_per_line", type=flags.non_negative_int,
                   default=d.min_words_per_line)
    p.add_argument("--min_sentences", type=flags.non_negative_int, default=d.min_sentences)
    p.add_argument("--max_word_length", type=flags.positive_int, default=d.max_word_length)
    p.add_argument("--dedupe_span", type=flags.positive_int, default=d.dedupe_span,
                   help="sentences per deduplicated span; 0 disables deduplication")
    p.add_argument("--keep_policy_lines", action="store_true",
                   help="keep lines mentioning cookies / privacy policies / terms of use")
    p.add_argument("--encoding_errors", choices=("strict", "replace"), default="strict",
                   help="'strict' stops at the first non-UTF-8 byte; 'replace' uses U+FFFD")
    args = p.parse_args(argv)
    config = CleanConfig(min_words_per_line=args.min_words_per_line,
                         min_sentences=args.min_sentences, max_word_length=args.max_word_length,
                         dedupe_span=args.dedupe_span, drop_policy_lines=not args.keep_policy_lines)
    stats = CleanStats()
    out = Path(args.output)
    try:
        with atomic.write_file(out) as tmp, open(tmp, "w", encoding="utf-8") as f:
            docs = read_documents(args.inputs, args.encoding_errors)
            for doc_id, text in clean_documents(docs, config, stats):
                f.write(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n")
    except (DecodeError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(stats.summary())
    print(f"wrote {stats.kept_docs} documents to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
