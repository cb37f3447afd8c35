"""The committed sweep results: each sweep's cells are one archive file under benchmarks/, and
`python -m t5x_like.sweep --report_only --archive=...` rebuilds every committed report from
them byte for byte (Markdown with its discussion, JSON, every PNG). A report whose cells were
never archived is listed in `NOT_ARCHIVED` with the reason; any other sweep report under
benchmarks/ must be in `REBUILT`, so a new report cannot go untested."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from t5x_like.sweep import runner
from t5x_like.sweep.__main__ import main

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
V2 = "benchmarks/history/protocol_v2"
#: Tables 2 + 3 as the v4 run defined them, and as the current (v5) files do: they add the
#: full-span "Language model | LM" row and the no-pre-training control.
T23 = ("gin/sweeps/history/v4/t5_table2_architectures.gin,"
       "gin/sweeps/history/v4/t5_table3_objectives.gin")
T23_V5 = "gin/sweeps/t5_table2_architectures.gin,gin/sweeps/t5_table3_objectives.gin"
T456 = ("gin/sweeps/t5_table4_bert_variants.gin,gin/sweeps/t5_table5_corruption_rates.gin,"
        "gin/sweeps/t5_table6_span_lengths.gin")
TINY = "benchmarks/sweep_cells/tiny.jsonl.gz"
#: archive file -> its number of cells.
#: tiny.jsonl.gz: the v5 report's 78 cells, the 3 of v4's prefix-LM-loss "Language model | LM"
#: and the word-order rerun's 12.
ARCHIVES = {TINY: 93, f"{V2}/sweep_cells_tiny.jsonl.gz": 45}
#: report prefix (`--out`) -> (scale, seeds, sweep files, archive).
REBUILT = {
    "benchmarks/t5_tables_tiny": ("tiny", 6, T23_V5, TINY),
    "benchmarks/history/v4/t5_tables_tiny": ("tiny", 3, T23, TINY),
    "benchmarks/word_order_tiny": ("tiny_word_order", 3, "gin/sweeps/word_order_objectives.gin",
                                   TINY),
    f"{V2}/t5_tables_tiny": (f"{V2}/tiny.gin", 3, T23, f"{V2}/sweep_cells_tiny.jsonl.gz"),
    f"{V2}/t5_tables_tiny_t456": (f"{V2}/tiny.gin", 1, T456, f"{V2}/sweep_cells_tiny.jsonl.gz"),
}
NOT_ARCHIVED = {
    f"{V2}/t5_tables_tiny_t3": "seeds 3-4 of two rows were not archived",
}
MAX_BENCHMARK_FILES = 80


def test_each_sweep_archive_is_one_file_and_no_cell_dirs_are_committed():
    for path, count in ARCHIVES.items():
        assert (REPO / path).is_file(), path
        assert len(runner.read_archive(str(REPO / path))) == count, path
    assert not [p for p in BENCH.rglob("cells") if p.is_dir()]
    assert not list(BENCH.rglob("cell.json"))


def test_benchmarks_stay_small():
    """Files under benchmarks/ that git tracks, or would after `git add -A` (untracked but not
    ignored, deletions dropped)."""
    try:
        listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "--cached", "--others",
                                 "--exclude-standard", "benchmarks"], capture_output=True,
                                text=True, check=True, timeout=60).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout")
    files = {f for f in listed if f and (REPO / f).is_file()}
    assert len(files) <= MAX_BENCHMARK_FILES, len(files)


def test_every_committed_report_is_rebuilt_or_said_why_not():
    """A sweep report is any Markdown file under benchmarks/ that the report writer titled."""
    reports = {str(p.relative_to(REPO))[:-3] for p in BENCH.rglob("*.md")
               if p.read_text(encoding="utf-8").startswith("# T5 paper tables at the ")}
    assert reports == set(REBUILT) | set(NOT_ARCHIVED)


@pytest.mark.parametrize("prefix", sorted(REBUILT))
def test_report_only_rebuilds_the_committed_report_byte_for_byte(prefix, tmp_path, capsys):
    scale, seeds, sweeps, archive = REBUILT[prefix]
    committed = REPO / prefix
    out = tmp_path / "out" / committed.name  # the same name: the same image links
    out.parent.mkdir()
    shutil.copyfile(f"{committed}_discussion.md", f"{out}_discussion.md")
    assert main([f"--scale={scale}", f"--seeds={seeds}", f"--sweep={sweeps}", "--report_only",
                 f"--archive={archive}", f"--sweep_dir={tmp_path / 'sweep'}",
                 f"--out={out}"]) == 0
    log = capsys.readouterr().out
    rebuilt = sorted(p.name for p in out.parent.iterdir() if p.name != f"{out.name}_discussion.md")
    assert f"{out}.md" in log and len(rebuilt) >= 4, log  # md, json, loss curves, a table
    for name in rebuilt:
        assert (committed.parent / name).read_bytes() == (out.parent / name).read_bytes(), name
    pattern = re.escape(committed.name) + r"(\.md|\.json|_loss_curves\.png|_table\d+\.png)"
    ours = {p.name for p in committed.parent.iterdir() if re.fullmatch(pattern, p.name)}
    assert ours == set(rebuilt)  # no committed file of this report left stale
