"""Vocabularies: T5 special ids, sentinels at the top, round trips on real text, training."""

from __future__ import annotations

import itertools
import unicodedata

import pytest

from t5x_like.data import corpus, vocab


def _validation_texts(data_dir, n=40):
    return list(itertools.islice(corpus.iter_split_texts("validation", data_dir), n))


@pytest.mark.parametrize("fixture,size", [("c4_32k_vocab", 32_100), ("small_vocab", 8_100)])
def test_special_ids_and_sentinels(fixture, size, request):
    v = request.getfixturevalue(fixture)
    assert (v.vocab_size, v.pad_id, v.eos_id, v.unk_id, v.extra_ids) == (size, 0, 1, 2, 100)
    assert v.decode([size - 1]) == "<extra_id_0>"
    assert v.decode([size - 100]) == "<extra_id_99>"
    assert "<extra_id" not in v.decode([size - 101])  # the first ordinary piece below them


@pytest.mark.parametrize("fixture", ["c4_32k_vocab", "small_vocab"])
def test_round_trip_on_real_text(fixture, request, data_dir):
    v = request.getfixturevalue(fixture)
    exact = 0
    texts = _validation_texts(data_dir)
    for text in texts:
        ids = v.encode(text)
        assert ids and min(ids) > v.unk_id - 1 and max(ids) < v.vocab_size - v.extra_ids
        # SentencePiece normalises with NFKC; c4_32k keeps newlines (`<n>`), c4like_8k doesn't.
        expected = " ".join(unicodedata.normalize("NFKC", text).split())
        decoded = " ".join(v.decode(ids).split())
        exact += decoded == expected
        if v.unk_id not in ids:
            assert decoded == expected
    assert exact >= 0.9 * len(texts)


def test_small_vocab_compresses_english(small_vocab, c4_32k_vocab, data_dir):
    text = " ".join(_validation_texts(data_dir, 10))
    n_small, n_big = len(small_vocab.encode(text)), len(c4_32k_vocab.encode(text))
    words = len(text.split())
    assert words < n_big < n_small < 2 * words


def test_extra_ids_zero_has_no_sentinels(data_dir):
    v = vocab.get_vocabulary("c4_32k", extra_ids=0, data_dir=data_dir)
    assert v.vocab_size == 32_000


def test_unknown_and_missing_vocabularies(tmp_path):
    with pytest.raises(vocab.VocabularyError, match="known: c4_32k, c4like_8k"):
        vocab.get_vocabulary("c4_64k")
    with pytest.raises(vocab.VocabularyError, match="does not exist"):
        vocab.get_vocabulary(str(tmp_path / "nothing.model"))
    with pytest.raises(vocab.VocabularyError, match="t5x_like.data.prepare"):
        vocab.get_vocabulary("c4like_8k", data_dir=tmp_path)


def test_train_is_deterministic_and_t5_compatible(tmp_path, data_dir):
    texts = _validation_texts(data_dir, 30)  # ~3,000 sentences; 500 sampled
    # 500 pieces: 3 specials + 256 bytes + the printable ASCII characters + merges
    a = vocab.train_vocabulary(texts, tmp_path / "a", 500, max_sentences=500)
    b = vocab.train_vocabulary(texts, tmp_path / "b", 500, max_sentences=500)
    assert a.read_bytes() == b.read_bytes()
    v = vocab.get_vocabulary(str(a))
    assert (v.vocab_size, v.pad_id, v.eos_id, v.unk_id) == (600, 0, 1, 2)
    rare = "The President said it: Zo\u00eb's caf\u00e9, 100% [Q] \u65e5\u672c."
    assert v.decode(v.encode(rare)) == rare and v.unk_id not in v.encode(rare)  # byte fallback
    c = vocab.train_vocabulary(texts, tmp_path / "c", 500, max_sentences=500, seed=1)
    assert c.read_bytes() != a.read_bytes()  # the seed picks a different sample


def test_model_without_t5_ids_is_rejected(tmp_path, data_dir):
    import sentencepiece as spm

    text = tmp_path / "t.txt"
    text.write_text("\n".join(_validation_texts(data_dir, 10)))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "default"),
                                   vocab_size=300, minloglevel=2)  # unk=0 bos=1 eos=2
    with pytest.raises(vocab.VocabularyError, match=r"pad=0 eos=1 unk=2, got pad=-1 eos=2 unk=0"):
        vocab.get_vocabulary(str(tmp_path / "default.model"))


def test_cli_train_and_encode(tmp_path, data_dir, capsys):
    src = tmp_path / "docs.txt"
    src.write_text("\n".join(_validation_texts(data_dir, 20)))
    prefix = tmp_path / "cli"
    assert vocab.main(["train", str(src), "--output_prefix", str(prefix), "--vocab_size", "600",
                       "--model_type", "bpe"]) == 0
    assert "600 pieces" in capsys.readouterr().out
    assert vocab.main(["encode", "Hello there.", "--vocabulary", f"{prefix}.model"]) == 0
    out = capsys.readouterr().out
    assert "vocab_size=700" in out and out.splitlines()[-1] == "Hello there."
    assert vocab.main(["encode", "x", "--vocabulary", "nope"]) == 2
    assert "unknown vocabulary 'nope'" in capsys.readouterr().err
