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
WORD_ORDER = REPO / "benchmarks" / "word_order_tiny.json"
NUM = r"[+-]?\d+\.\d+"
CLAIM = re.compile(
    rf'"(?P<claim>[^"]+)": (?P<verdict>reproduced|contradicted|unresolved), (?P<d>{NUM}) '
    rf"\[(?P<lo>{NUM}), (?P<hi>{NUM})\] \((?:Holm p (?P<holm>\d\.\d+)|p (?P<p>\d\.\d+) alone)"
    rf"(?:; the paper: (?P<paper>{NUM}))?\)")
LABELS = ("Robust", "Suggestive", "No longer reproduced")


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
        if m["holm"]:
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


def test_every_decimal_number_in_the_results_section_is_checked(report):
    checked = Checked(_section())
    _check_claims(checked, report)
    tables = report["tables"]
    rows = [r for t in tables.values() for r in t["rows"] if r["num_seeds"]]
    m = checked.find(r"\((\d+\.\d)M-parameter models")
    checked.number(m, 1, max(r["parameters"] for r in rows) / 1e6, ".1f")
    m = checked.find(r"(\d+\.\d+)-(\d+\.\d+) minutes a cell")
    minutes = [r["seconds_per_cell"] / 60 for r in rows]
    checked.number(m, 1, min(minutes), ".1f")
    checked.number(m, 2, max(minutes), ".1f")
    m = checked.find(r"Tables 2 \+ 3, (\d+) seeds per row")
    assert {r["num_seeds"] for r in rows} == {int(m.group(1))}
    assert checked.find(r"its (\d+) cells")[1] == str(report["num_cells_done"])
    m = checked.find(r"\*Suggestive\*: p < (\d\.\d+) alone")
    checked.number(m, 1, stats.FAMILY_ALPHA, ".2f")
    m = checked.find(r"varies by (\d+\.\d+)-(\d+\.\d+) points")
    stds = [t["rows_differ"]["suite_average"]["seed_std"] for t in tables.values()]
    checked.number(m, 1, min(stds), ".2f")
    checked.number(m, 2, max(stds), ".2f")
    table2 = tables["table2"]
    m = checked.find(rf"Kendall τ = ({NUM}) \(exact p (\d\.\d+)\)")
    checked.number(m, 1, table2["kendall_tau"], ".2f")
    checked.number(m, 2, table2["kendall_p_value"], ".3f")
    checked.number(checked.find(r"ANOVA p (\d\.\d+)"), 1,
                   table2["rows_differ"]["suite_average"]["p"], ".3f")
    m = checked.find(r"one row: (.+?) \((\d+\.\d+)\) is below three others")
    row = next(r for r in table2["rows"] if r["row"] == m.group(1))
    checked.number(m, 2, row["ours_mean"], ".2f")
    differ = [p for p in table2["pairs_differ"]["pairs"] if p["differ"]]
    assert len(differ) == 3 and {p["worse"] for p in differ} == {m.group(1)}
    m = checked.find(r"All (\w+) claims are unresolved")
    assert m.group(1) == "nine" and len(table2["claims"]) == 9
    assert all(c["verdict"] == "unresolved" for c in table2["claims"])
    order = json.loads(WORD_ORDER.read_text(encoding="utf-8"))["rows"]
    m = checked.find(r"BERT-style scores (\d+\.\d), deshuffling (\d+\.\d)")
    checked.number(m, 1, order["table3: BERT-style"]["240"]["mean"], ".1f")
    checked.number(m, 2, order["table3: Deshuffling"]["240"]["mean"], ".1f")
    checked.find(r"no row spans both hosts")
    assert all(not t["host_factor"]["testable"] for t in tables.values())
    for found in re.finditer(r"\d+\.\d+", checked.text):
        assert any(lo <= found.start() and found.end() <= hi for lo, hi in checked.spans), (
            f"unchecked number {found.group(0)!r} in README Results: "
            f"...{checked.text[max(0, found.start() - 60):found.end() + 20]}")


def test_the_checker_catches_a_wrong_number(report):
    wrong = _section().replace("-5.69", "-5.96", 1)
    assert wrong != _section()
    with pytest.raises(AssertionError):
        _check_claims(Checked(wrong), report)
