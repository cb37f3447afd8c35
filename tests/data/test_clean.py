"""The C4-style cleaner: each rule, deduplication, bad input, and the CLI on real files."""

from __future__ import annotations

import json

import pytest

from t5x_like.data import clean

GOOD = ("The committee met on Monday to review the budget.\n"
        "Several members asked for more time to study the figures.\n"
        "The chair agreed and adjourned the meeting until Friday.")


def _clean(text: str, **cfg):
    stats = clean.CleanStats()
    out = list(clean.clean_documents([("d", text)], clean.CleanConfig(**cfg), stats))
    return (out[0][1] if out else None), stats


def test_good_page_is_kept_verbatim():
    out, stats = _clean(GOOD)
    assert out == GOOD
    assert stats.kept_docs == 1 and not stats.dropped_docs


def test_line_without_terminal_punctuation_is_dropped():
    out, stats = _clean(GOOD + "\nClick here to subscribe to our newsletter")
    assert out == GOOD
    assert stats.dropped_lines["no_terminal_punctuation"] == 1


@pytest.mark.parametrize("line", ['He said "stop here."', "Thank you all. (Applause.)",
                                  "Is this the end of it?", "So many words to say\u2026"])
def test_terminal_punctuation_variants_are_kept(line):
    assert clean.line_drop_reason(line) is None


def test_min_words_per_line_is_configurable():
    text = GOOD + "\nVery short line."
    out3, stats3 = _clean(text)  # 3 words: kept with the default
    assert out3.endswith("Very short line.")
    out5, stats5 = _clean(text, min_words_per_line=5)  # C4's setting drops it
    assert out5 == GOOD
    assert stats5.dropped_lines["too_few_words"] == 1 and not stats3.dropped_lines


def test_page_with_too_few_sentences_is_dropped():
    two = "The first sentence is here. The second sentence follows it."
    out, stats = _clean(two)
    assert out is None and stats.dropped_docs["too_few_sentences"] == 1
    out, _ = _clean(two, min_sentences=2)
    assert out == two


@pytest.mark.parametrize("line, reason", [
    ("Lorem ipsum dolor sit amet, consectetur adipiscing elit.", "lorem_ipsum"),
    ("The function returns {x: 1} to the caller.", "curly_brace")])
def test_lorem_ipsum_and_curly_brace_drop_the_page(line, reason):
    out, stats = _clean(GOOD + "\n" + line)
    assert out is None and stats.dropped_docs[reason] == 1


def test_javascript_and_policy_lines_are_dropped_not_the_page():
    text = (GOOD + "\nPlease enable JavaScript to view this page properly."
            "\nBy using this site you agree to our Privacy Policy and terms.")
    out, stats = _clean(text)
    assert out == GOOD
    assert stats.dropped_lines["javascript"] == 1 and stats.dropped_lines["policy"] == 1
    out_kept, _ = _clean(text, drop_policy_lines=False)
    assert "Privacy Policy" in out_kept and "JavaScript" not in out_kept


def test_overlong_word_drops_the_line():
    out, stats = _clean(GOOD + "\nVisit " + "x" * 60 + " for the details.", max_word_length=50)
    assert out == GOOD and stats.dropped_lines["long_word"] == 1


@pytest.mark.parametrize("text", ["", "   ", "\n\n\t \n"])
def test_empty_and_whitespace_documents_are_dropped_and_counted(text):
    out, stats = _clean(text)
    assert out is None
    assert stats.dropped_docs["empty"] == 1 and stats.input_docs == 1 and stats.kept_docs == 0
    assert "dropped documents, empty: 1" in stats.summary()


def test_whitespace_inside_lines_is_normalised():
    out, _ = _clean(GOOD.replace(" ", "  \t"))
    assert out == GOOD


def test_split_sentences():
    s = clean.split_sentences('One here. "Two there!" she said. Three? (Four.) Five')
    assert s == ["One here.", '"Two there!"', "she said.", "Three?", "(Four.)", "Five"]


def test_dedupe_cuts_repeated_three_sentence_span_across_documents():
    shared = "Alpha beta gamma one. Delta epsilon zeta two. Eta theta iota three."
    doc_a = f"{shared}\nThe first page goes on with text of its own here."
    doc_b = ("The second page starts with its own words here. It adds another point too.\n"
             f"{shared.upper()}\nAnd it ends with a fourth original sentence.")
    stats = clean.CleanStats()
    out = dict(clean.clean_documents([("a", doc_a), ("b", doc_b)], stats=stats))
    assert out["a"] == doc_a  # first occurrence kept
    assert "ALPHA" not in out["b"] and "fourth original sentence" in out["b"]
    assert out["b"].startswith("The second page starts")
    assert stats.removed_duplicate_sentences == 3


def test_dedupe_drops_page_left_too_short_and_can_be_disabled():
    text = "Alpha beta gamma one. Delta epsilon zeta two. Eta theta iota three."
    stats = clean.CleanStats()
    out = list(clean.clean_documents([("a", text), ("b", text)], stats=stats))
    assert [i for i, _ in out] == ["a"] and stats.dropped_docs["duplicate"] == 1
    out = list(clean.clean_documents([("a", text), ("b", text)],
                                     clean.CleanConfig(dedupe_span=0)))
    assert [i for i, _ in out] == ["a", "b"]


def test_dedupe_within_one_document():
    span = "One more time here. Two more times here. Three more times here."
    text = f"{span}\nSomething different is said here.\n{span}"
    out, stats = _clean(text)
    assert out == f"{span}\nSomething different is said here."
    assert stats.removed_duplicate_sentences == 3


def test_non_utf8_error_names_file_and_offset(tmp_path, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(GOOD.encode() + b"\nCaf\xe9 prices went up again this year.")
    offset = len(GOOD.encode()) + 4
    with pytest.raises(clean.DecodeError, match=rf"latin1\.txt.*byte offset {offset}"):
        list(clean.read_documents([bad]))
    out = tmp_path / "out.jsonl"
    assert clean.main([str(bad), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"byte offset {offset}" in err and "--encoding_errors=replace" in err
    assert not out.exists()
    assert clean.main([str(bad), "--output", str(out), "--encoding_errors=replace"]) == 0
    text = json.loads(out.read_text())["text"]
    assert "Caf\ufffd prices" in text


def test_cli_on_text_files_and_jsonl(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text(GOOD + "\nMenu | Home | Contact\n")
    (tmp_path / "in" / "b.txt").write_text("  \n \n")
    records = [{"id": "j1", "text": GOOD.replace("budget", "harbour plan")},
               {"text": "Only one sentence."}]
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    out = tmp_path / "clean.jsonl"
    assert clean.main([str(tmp_path / "in"), str(tmp_path / "docs.jsonl"),
                       "--output", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [str(tmp_path / "in" / "a.txt"), "j1"]
    assert rows[0]["text"] == GOOD
    summary = capsys.readouterr().out
    assert "4 in, 2 kept, 2 dropped" in summary
    assert "dropped documents, empty: 1" in summary
    assert "dropped documents, too_few_sentences: 1" in summary


def test_jsonl_errors_name_the_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "fine."}\n{"txt": "no text field"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: expected an object"):
        list(clean.read_documents([p]))
    with pytest.raises(FileNotFoundError, match="no such input"):
        list(clean.read_documents([tmp_path / "missing.txt"]))
