"""README.md's Results section says only what the committed report says: every claim quoted
there ("<claim>": verdict, difference [interval] (p)) is looked up in the report JSON, with its
label (robust: settled after Holm's correction; suggestive: p < 0.05 for the claim alone, not
settled) and host caveat; every other number is checked against the JSON it comes from; and no
decimal number in the section goes unchecked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from t5x_like.sweep import stats

REPO = Path(__file__).resolve().parents[1]
REPORT = REPO / "benchmarks" / "t5_tables_tiny.json"
WORD_ORDER = REPO / "benchmarks" / "word_order_tiny.json"  # its sweep report
NUM = r"[+-]?\d+\.\d+"
CLAIM = re.compile(
    rf'"(?P<claim>[^"]+)": (?P<verdict>reproduced|contradicted|unresolved), (?P<d>{NUM}) '
    rf"\[(?P<lo>{NUM}), (?P<hi>{NUM})\] "
    rf"\((?:Holm p (?P<holm>< 0\.001|\d\.\d+)|p (?P<p>\d\.\d+) alone)"
    rf"(?:; the paper: (?P<paper>{NUM}))?\)")
LABELS = ("Robust", "Suggestive", "No longer reproduced")
WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def _section() -> str:
    """The Results section, whitespace collapsed (sentences wrap across lines)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("## Results")
    return " ".join(text[start:text.index("\n## ", start + 1)].split())


class Checked:
    """The section and the spans of the numbers a check has compared with the report."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.spans: list[tuple[int, int]] = []

    def find(self, pattern: str) -> re.Match:
        found = re.search(pattern, self.text)
        assert found, f"README Results no longer says: {pattern}"
        return found

    def number(self, match: re.Match, group: str | int, value: float, fmt: str) -> None:
        """Group `group` of `match` must print as `value` does with `fmt`."""
        assert match.group(group) == format(value, fmt), (match.group(0), value)
        self.spans.append(match.span(group))


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads(REPORT.read_text(encoding="utf-8"))


def _claims(report: dict) -> dict[str, dict]:
    return {c["claim"]: c for t in report["tables"].values() for c in t["claims"]}


def _bullet_label(text: str, at: int) -> str | None:
    """The last label ('**Robust', ...) before `at` within the same bullet."""
    bullet = text.rfind(" - ", 0, at)
    found = [(text.rfind(f"**{label}", bullet, at), label) for label in LABELS]
    position, label = max(found)
    return label if position >= 0 else None


def _check_claims(checked: Checked, report: dict) -> int:
    claims = _claims(report)
    matches = list(CLAIM.finditer(checked.text))
    for m in matches:
        c = claims[m["claim"]]
        assert m["verdict"] == c["verdict"], m["claim"]
        checked.number(m, "d", c["difference"], "+.2f")
        checked.number(m, "lo", c["ci"][0], "+.2f")
        checked.number(m, "hi", c["ci"][1], "+.2f")
        if m["holm"] == "< 0.001":
            assert c["p_holm"] < 0.001, m["claim"]
            checked.spans.append(m.span("holm"))
        elif m["holm"]:
            checked.number(m, "holm", c["p_holm"], ".3f")
        else:
            checked.number(m, "p", c["p"], ".3f")
        if m["paper"]:
            checked.number(m, "paper", c["paper_difference"], "+.2f")
        label = _bullet_label(checked.text, m.start())
        if label == "Robust":
            assert c["verdict"] != "unresolved" and c["p_holm"] < stats.FAMILY_ALPHA, m["claim"]
        elif label == "Suggestive":
            assert c["verdict"] == "unresolved" and c["p"] < stats.FAMILY_ALPHA, m["claim"]
        elif label == "No longer reproduced":
            assert c["verdict"] == "unresolved", m["claim"]
        after = checked.text[m.end():m.end() + 60]
        if "CPUs" in after.split(" - ")[0]:  # "ran on different CPUs", "across CPUs too"
            assert c["hosts"]["warning"], m["claim"]
    return len(matches)


def test_every_claim_in_the_readme_is_the_reports(report):
    checked = Checked(_section())
    assert _check_claims(checked, report) >= 5


def _pairs(table: dict) -> list[dict]:
    """The table's post-hoc pairs that differ after Holm (suite average)."""
    return [p for p in table["pairs_differ"]["pairs"] if p["differ"]]


def test_every_decimal_number_in_the_results_section_is_checked(report):
    checked = Checked(_section())
    _check_claims(checked, report)
    tables = report["tables"]
    rows = [r for t in tables.values() for r in t["rows"] if r["num_seeds"]]
    m = checked.find(r"\((\d+\.\d)M-parameter models")
    checked.number(m, 1, max(r["parameters"] for r in rows) / 1e6, ".1f")
    m = checked.find(r"(\d+\.\d+)-(\d+\.\d+) CPU minutes a cell")
    minutes = [r["cpu_seconds_per_cell"] / 60 for r in rows]
    checked.number(m, 1, min(minutes), ".1f")
    checked.number(m, 2, max(minutes), ".1f")
    m = checked.find(r"no-pre-training control, (\d+) seeds per row")
    assert {r["num_seeds"] for r in rows} == {int(m.group(1))}
    assert checked.find(r"its (\d+) cells")[1] == str(report["num_cells_done"])
    assert report["num_cells_done"] == report["num_cells"]
    m = checked.find(r"\*Suggestive\*: p < (\d\.\d+) alone")
    checked.number(m, 1, stats.FAMILY_ALPHA, ".2f")
    m = checked.find(r"varies by (\d+\.\d+)-(\d+\.\d+) points")
    stds = [t["rows_differ"]["suite_average"]["seed_std"] for t in tables.values()]
    checked.number(m, 1, min(stds), ".2f")
    checked.number(m, 2, max(stds), ".2f")
    # the control: which pre-trained rows it beats, and which beat it (Holm over pairs)
    table2, table3 = tables["table2"], tables["table3"]
    control = next(r for r in table2["rows"] if r["control"])
    m = checked.find(r"scores? (\d+\.\d+): above (\d+) of Table 2's (\d+) pre-trained rows")
    checked.number(m, 1, control["ours_mean"], ".2f")
    assert int(m[2]) == sum(p["better"] == control["row"] for p in _pairs(table2))
    assert int(m[3]) == sum(not r["control"] for r in table2["rows"])
    m = checked.find(r"Only (\w+) scores above it \(\+(\d+\.\d+), Holm p (\d\.\d+)\)")
    above = [p for t in (table2, table3) for p in _pairs(t) if p["worse"] == control["row"]]
    assert [p["better"].lower() for p in above] == [m[1]]
    checked.number(m, 2, above[0]["difference"], ".2f")
    checked.number(m, 3, above[0]["p_holm"], ".3f")
    m = checked.find(r"Table 2's (\w+) other claims are unresolved")
    settled_or_quoted = {c["claim"] for c in table2["claims"] if c["verdict"] != "unresolved"}
    settled_or_quoted |= {q["claim"] for q in CLAIM.finditer(checked.text)}
    others = [c for c in table2["claims"] if c["claim"] not in settled_or_quoted]
    assert WORDS.index(m[1]) == len(others)
    assert all(c["verdict"] == "unresolved" for c in others)
    m = checked.find(rf"Kendall τ = ({NUM}) \(exact p (\d\.\d+)\) over its (\d+) rows")
    checked.number(m, 1, table2["kendall_tau"], ".2f")
    checked.number(m, 2, table2["kendall_p_value"], ".3f")
    assert int(m[3]) == table2["kendall_rows"]
    # hosts: the cell counts per CPU, and host tested as a factor in each table
    m = checked.find(r"(\d+) cells \(seeds 0-2 of three LM rows\) ran on an AMD host, "
                     r"(\d+) on an Intel one")
    counts = {h.split(",")[0].split()[0]: n for h, n in report["hosts"].items()}
    assert counts == {"AMD": int(m[1]), "Intel(R)": int(m[2])}
    m = checked.find(r"\(p (\d\.\d+) in Table 2, (\d\.\d+) in Table 3\)")
    for group, table in ((1, table2), (2, table3)):
        assert table["host_factor"]["testable"]
        checked.number(m, group, table["host_factor"]["p"], ".3f")
        assert table["host_factor"]["p"] >= stats.FAMILY_ALPHA  # "shifts no score detectably"
    # the word-order rerun: its own sweep report
    order = json.loads(WORD_ORDER.read_text(encoding="utf-8"))["tables"]["table3"]
    task = "downstream_word_order"
    assert order["exploratory_tasks"] == [task]
    m = checked.find(r"\(best constant (\d+\.\d+)\), BERT-style scores (\d+\.\d+), prefix LM "
                     r"(\d+\.\d+), deshuffling (\d+\.\d+) and the control (\d+\.\d+), "
                     r"(\d) seeds each")
    checked.number(m, 1, order["best_constant"][task], ".2f")
    means = {r["row"]: r for r in order["rows"]}
    for group, row in enumerate(("BERT-style", "Prefix LM", "Deshuffling", "No pre-training"), 2):
        checked.number(m, group, means[row]["ours_mean"], ".2f")
        assert means[row]["num_seeds"] == int(m[6]), row
    checked.find(r"Only BERT-style is above chance")
    assert order["above_constant"][task] == ["BERT-style"]
    for found in re.finditer(r"\d+\.\d+", checked.text):
        assert any(lo <= found.start() and found.end() <= hi for lo, hi in checked.spans), (
            f"unchecked number {found.group(0)!r} in README Results: "
            f"...{checked.text[max(0, found.start() - 60):found.end() + 20]}")


def test_the_checker_catches_a_wrong_number(report):
    wrong = _section().replace("-5.57", "-5.75", 1)
    assert wrong != _section()
    with pytest.raises(AssertionError):
        _check_claims(Checked(wrong), report)
