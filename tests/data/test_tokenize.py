"""Batched SentencePiece tokenization: seqio's ids on the whole c4like corpus and on awkward text
(exactly the op's for BPE, the library's for unigram), other features untouched, order kept."""

from __future__ import annotations

import numpy as np
import pytest
import seqio
import tensorflow as tf

from t5x_like.data import tokenize


def _dataset(texts: list[bytes]) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(
        {"targets": tf.constant(texts, tf.string), "id": tf.range(len(texts))})


def _both(texts: list[bytes], vocabulary: seqio.Vocabulary, batch_size: int = 64):
    """(ours, seqio's tensorflow_text op) examples for `texts`."""
    features = {"targets": seqio.Feature(vocabulary)}
    ours = tokenize.tokenize(_dataset(texts), features, batch_size=batch_size)
    reference = seqio.preprocessors.tokenize(_dataset(texts), features, copy_pretokenized=False)
    return list(ours.as_numpy_iterator()), list(reference.as_numpy_iterator())


@pytest.fixture(scope="module")
def corpus_texts(c4like_source) -> list[bytes]:
    return [ex["text"] for split in ("train", "validation")
            for ex in c4like_source.get_dataset(split, shuffle=False).as_numpy_iterator()]


def test_bpe_ids_equal_the_tensorflow_text_op_on_the_whole_corpus(corpus_texts, c4_32k_vocab):
    assert len(corpus_texts) > 4000
    ours, reference = _both(corpus_texts, c4_32k_vocab)
    assert len(ours) == len(reference) == len(corpus_texts)
    for a, b in zip(ours, reference, strict=True):
        assert a["id"] == b["id"] and a["targets"].dtype == np.int32
        np.testing.assert_array_equal(a["targets"], b["targets"])


def test_unigram_ids_are_the_librarys_and_almost_always_the_ops(corpus_texts, small_vocab):
    ours, reference = _both(corpus_texts, small_vocab)
    differing = total = 0
    for text, a, b in zip(corpus_texts, ours, reference, strict=True):
        assert a["targets"].tolist() == small_vocab.encode(text.decode())  # seqio's Python ids
        total += b["targets"].size
        x, y = a["targets"], b["targets"]  # near-ties broken the other way: a few positions
        n = min(x.size, y.size)
        differing += int((x[:n] != y[:n]).sum()) + abs(x.size - y.size)
    assert differing < 1e-4 * total
    exact = tokenize.tokenize(_dataset(corpus_texts[:50]), {"targets": seqio.Feature(small_vocab)},
                              engine="tensorflow_text")
    for a, b in zip(exact.as_numpy_iterator(), reference[:50], strict=True):
        np.testing.assert_array_equal(a["targets"], b["targets"])


def test_awkward_text_and_uneven_batches(c4_32k_vocab):
    texts = ["", "   ", "plain words", "two\n\nlines\ttabs", "<extra_id_3> names a sentinel",
             "ünïcödé ﬁ ligature ＦＵＬＬ", "a" * 5000]
    raw = [t.encode() for t in texts] + [b"\xff\xfe not utf-8 \xc3"]
    ours, reference = _both(raw, c4_32k_vocab, batch_size=3)
    assert [x["id"] for x in ours] == list(range(len(raw)))
    for a, b in zip(ours, reference, strict=True):
        np.testing.assert_array_equal(a["targets"], b["targets"])
    assert ours[0]["targets"].size == 0 and ours[4]["targets"][0] == c4_32k_vocab.vocab_size - 4


def test_vocabulary_without_sentencepiece_falls_back_to_seqio():
    byte_vocab = seqio.ByteVocabulary()
    assert tokenize.sentencepiece_processor(byte_vocab) is None
    ours, reference = _both([b"bytes", b""], byte_vocab)
    for a, b in zip(ours, reference, strict=True):
        np.testing.assert_array_equal(a["targets"], b["targets"])


def test_bad_settings_are_named():
    features = {"targets": seqio.Feature(seqio.ByteVocabulary())}
    with pytest.raises(ValueError, match="tokenize.engine='tf'"):
        tokenize.tokenize(_dataset([b"x"]), features, engine="tf")
    with pytest.raises(ValueError, match="tokenize.batch_size=0"):
        tokenize.tokenize(_dataset([b"x"]), features, batch_size=0)
