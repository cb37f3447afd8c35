"""The downstream suite: well-formed, deterministic, disjoint splits; registry; baselines."""

from __future__ import annotations

import collections
import logging
import re

import numpy as np
import pytest

from t5x_like.data import corpus, downstream, tasks

# The documented split sizes (docs/downstream.md); a change to the building rules that
# moves them must update that table too.
SIZES = {
    "downstream_spam": {"train": 2000, "validation": 300, "test": 319},
    "downstream_brown_genre": {"train": 2000, "validation": 300, "test": 500},
    "downstream_sotu_party": {"train": 2000, "validation": 300, "test": 500},
    "downstream_sotu_decade": {"train": 2000, "validation": 300, "test": 500},
    "downstream_cloze": {"train": 2000, "validation": 300, "test": 435},
    "downstream_word_order": {"train": 2000, "validation": 300, "test": 500},
}
PREFIX = {"downstream_spam": "spam or ham: ", "downstream_brown_genre": "genre: ",
          "downstream_sotu_party": "party: ", "downstream_sotu_decade": "decade: ",
          "downstream_cloze": "cloze: ", "downstream_word_order": "order: "}


@pytest.fixture(scope="module")
def manifest(data_dir):
    return downstream.ensure_built(data_dir)


@pytest.fixture(scope="module")
def rebuilt(manifest, data_dir):
    """A fresh, uncached build (task -> split -> examples with their 'id')."""
    return downstream.build_examples(data_dir)


def test_suite_names_and_specs():
    assert downstream.SUITE == tuple(SIZES)
    for name in downstream.SUITE:
        spec = downstream.get_spec(name)
        assert spec.name == name and spec.kind in ("classification", "generation")
        assert set(spec.sequence_length) == {"inputs", "targets"}
        assert (spec.labels is None) == (spec.kind == "generation")
    assert len(downstream.get_spec("downstream_brown_genre").labels) == 15
    assert downstream.get_spec("downstream_spam:c4like_8k").name == "downstream_spam"


def test_training_stream_is_shuffled_without_seqio_warning(manifest, caplog):
    """Training reads a shuffled stream, and seqio's uncached-FunctionDataset warning (meant for
    file-backed functions) stays out of a healthy run's stderr."""
    def first_targets(seed: int) -> list[bytes]:
        ds = tasks.get_dataset("downstream_spam", split="train",
                               sequence_length={"inputs": 64, "targets": 4}, batch_size=8,
                               model_family="encoder_decoder", vocabulary="c4like_8k",
                               pack=False, shuffle=True, seed=seed, num_epochs=1)
        return next(iter(ds.as_numpy_iterator()))["encoder_input_tokens"].tolist()

    with caplog.at_level(logging.WARNING):
        a, b, again = first_targets(0), first_targets(1), first_targets(0)
    assert "FunctionDataset" not in caplog.text
    assert a == again and a != b


@pytest.mark.parametrize("name", list(SIZES))
def test_examples_well_formed(manifest, name):
    spec = downstream.get_spec(name)
    assert manifest["sizes"][name] == SIZES[name]
    for split in downstream.SPLITS:
        examples = downstream.load_examples(name, split)
        assert len(examples) == SIZES[name][split]
        for e in examples:
            assert set(e) == {"inputs", "targets"}
            assert e["inputs"].startswith(PREFIX[name])
            text = e["inputs"][len(PREFIX[name]):]
            assert text.strip() and e["targets"].strip() == e["targets"] != ""
            assert len(text.split()) <= downstream.MAX_WORDS
            assert len(text) <= downstream.MAX_CHARS
            e["inputs"].encode("utf-8")
            if spec.labels is not None:
                assert e["targets"] in spec.labels, e["targets"]
            else:  # cloze: an alphabetic word that also occurs in its context
                assert re.fullmatch(r"[A-Za-z]{3,}", e["targets"])
                assert e["targets"].lower() in text.lower()


def test_label_coverage(manifest):
    for name in ("downstream_spam", "downstream_brown_genre", "downstream_sotu_party"):
        for split in downstream.SPLITS:
            got = {e["targets"] for e in downstream.load_examples(name, split)}
            assert got == set(downstream.get_spec(name).labels), (name, split)


def test_deterministic_and_disjoint(rebuilt):
    for name in downstream.SUITE:
        inputs, docs = {}, {}
        for split in downstream.SPLITS:
            cached = downstream.load_examples(name, split)
            assert cached == downstream.load_examples(name, split)
            assert cached == [{"inputs": e["inputs"], "targets": e["targets"]}  # fresh == cache
                              for e in rebuilt[name][split]]
            inputs[split] = {e["inputs"] for e in cached}
            docs[split] = {e["id"].split("#")[0] for e in rebuilt[name][split]}
        for a, b in (("train", "validation"), ("train", "test"), ("validation", "test")):
            assert not inputs[a] & inputs[b], (name, a, b)
            assert not docs[a] & docs[b], (name, a, b)  # no document in two splits


def test_cloze_test_comes_from_c4like_validation(rebuilt, data_dir):
    validation = [" ".join(r["text"].split())
                  for r in corpus.iter_split_records("validation", data_dir)]
    validation_ids = {r["id"] for r in corpus.iter_split_records("validation", data_dir)}
    assert all(corpus.split_of(i) == "validation" for i in validation_ids)
    for e in downstream.load_examples("downstream_cloze", "test"):
        context = e["inputs"][len("cloze: "):]
        assert any(context + " " + e["targets"] in doc for doc in validation), context[:80]
    train_docs = {e["id"].split("#")[0] for e in rebuilt["downstream_cloze"]["train"]}
    assert train_docs and not train_docs & validation_ids


def test_shuffle_words_never_keeps_the_order():
    words = [f"w{i}" for i in range(30)]
    for key in ("doc#0", "doc#1", "doc#2"):
        out = downstream._shuffle_words(words, key)
        assert sorted(out) == sorted(words) and out != words  # the same words, another order
        assert out == downstream._shuffle_words(words, key)  # seeded by the key
    assert downstream._shuffle_words(words, "doc#0") != downstream._shuffle_words(words, "doc#1")
    assert downstream._shuffle_words(["a", "b"], "k") == ["b", "a"]  # the only other order
    assert downstream._shuffle_words(["a"] * 12, "doc#0") is None  # no other order exists


def test_word_order_examples_hold_the_same_words():
    """Both classes are the source passage's words (a bag of words cannot tell them apart);
    'original' is the passage as written; test comes only from c4like validation documents."""
    sentence = "The {} cat sat on the mat while a dog of {} watched it closely."
    text = lambda doc: " ".join(sentence.format(doc, k) for k in range(9))  # noqa: E731
    records = {"train": [{"id": f"t{i}", "text": text(f"t{i}")} for i in range(40)],
               "validation": [{"id": f"v{i}", "text": text(f"v{i}")} for i in range(5)]}
    built = downstream._word_order_examples(records)
    sources = {f"{r['id']}#{k}": downstream._clip(p).split() for rs in records.values()
               for r in rs for k, p in enumerate(downstream._passages(r["text"], 20))}
    labels = collections.Counter()
    for split, examples in built.items():
        assert examples and len({e["id"] for e in examples}) == len(examples)
        for e in examples:
            words = e["inputs"].removeprefix("order: ").split()
            source = sources[e["id"]]
            labels[e["targets"]] += 1
            assert sorted(words) == sorted(source)
            assert (words == source) == (e["targets"] == "original"), e
            assert e["id"].startswith("v") == (split == "test")
    assert labels["original"] > 10 and labels["shuffled"] > 10


def test_registry_lists_suite_and_rejects_unknown():
    names = tasks.list_tasks()
    assert set(downstream.SUITE) | {downstream.MIXTURE} <= set(names)
    with pytest.raises(ValueError, match="Did you mean: downstream_spam"):
        tasks.get_task("downstream_spma")
    with pytest.raises(ValueError, match="Unknown downstream task 'downstream_nope'"):
        downstream.get_spec("downstream_nope")
    with pytest.raises(ValueError, match="Unknown split 'dev'"):
        downstream.load_examples("downstream_spam", "dev")


def test_seqio_task_has_metrics_and_postprocessor(manifest):
    task = tasks.get_task("downstream_spam", "c4like_8k")
    assert task.name == "downstream_spam:c4like_8k"
    assert {f.__name__ for f in task.metric_fns} == {"accuracy", "f1_macro"}
    assert task.postprocess_fn(b" spam ") == "spam"
    assert tasks.task_objective("downstream_spam") is None
    mixture = tasks.get_task(downstream.MIXTURE, "c4like_8k")
    for t in mixture.tasks:
        assert mixture.get_rate(t) == SIZES[t.name.partition(":")[0]]["train"]


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_only", "prefix_lm"])
def test_get_dataset_every_family(manifest, small_vocab, family):
    lengths = {"inputs": 256, "targets": 16}
    ds = tasks.get_dataset("downstream_spam", split="train", sequence_length=lengths,
                           batch_size=4, model_family=family, vocabulary="c4like_8k",
                           pack=False, shuffle=False, num_epochs=1)
    batch = next(iter(ds.as_numpy_iterator()))
    first = downstream.load_examples("downstream_spam", "train")[0]
    inputs = small_vocab.encode(first["inputs"])[:255] + [1]
    targets = small_vocab.encode(first["targets"]) + [1]
    if family == "encoder_decoder":
        assert set(batch) == {"encoder_input_tokens", "decoder_target_tokens",
                              "decoder_input_tokens", "decoder_loss_weights"}
        assert batch["encoder_input_tokens"].shape == (4, 256)
        assert batch["decoder_target_tokens"].shape == (4, 16)
        assert batch["encoder_input_tokens"][0, :len(inputs)].tolist() == inputs
        assert batch["decoder_target_tokens"][0, :len(targets)].tolist() == targets
    else:
        expected = {"decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights"}
        if family == "prefix_lm":
            expected.add("decoder_causal_attention")
        assert set(batch) == expected
        assert batch["decoder_target_tokens"].shape == (4, 272)
        row = batch["decoder_target_tokens"][0].tolist()
        assert row[:len(inputs) + len(targets)] == inputs + targets
        weights = batch["decoder_loss_weights"][0]
        assert weights.sum() == len(targets)  # loss only on the targets
        assert np.all(weights[len(inputs):len(inputs) + len(targets)] == 1)


@pytest.mark.parametrize("name", list(SIZES))
def test_majority_baseline_is_majority_frequency(manifest, name):
    train = collections.Counter(e["targets"] for e in downstream.load_examples(name, "train"))
    top = max(train.values())
    majority = min(t for t, n in train.items() if n == top)
    assert downstream.majority_target(name) == majority
    test = [e["targets"] for e in downstream.load_examples(name, "test")]
    baseline = downstream.majority_baseline(name)
    key = "accuracy" if downstream.get_spec(name).kind == "classification" else "exact_match"
    assert baseline[key] == pytest.approx(100 * test.count(majority) / len(test))
    assert baseline["score"] == baseline[downstream.get_spec(name).primary_metric]


def test_compute_metrics_score_and_errors(manifest):
    out = downstream.compute_metrics("downstream_spam", ["spam", "ham", "ham"],
                                     [" spam", "ham\n", "spam"])
    assert out["accuracy"] == pytest.approx(200 / 3)
    assert out["score"] == out["f1_macro"]
    with pytest.raises(ValueError, match="differ in length"):
        downstream.compute_metrics("downstream_spam", ["spam"], [])
