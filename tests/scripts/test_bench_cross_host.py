"""scripts/bench_cross_host.py's comparison on real archived cell records (no cell is run here:
the rerun is `runner.run_cell_dir`, tested in tests/sweep/test_cells.py), the committed archive
file unpacked as the script does."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

from t5x_like.sweep import runner
from tests.scripts import REPO, load_script

ARCHIVE_FILE = REPO / "benchmarks" / "sweep_cells" / "tiny.jsonl.gz"
PROTOCOL_V2 = REPO / "benchmarks" / "history" / "protocol_v2" / "sweep_cells_tiny.jsonl.gz"
CELL = "lm_2L__prefix_lm__s0__e65b7f2f"  # protocol v3, seeds 0-2 archived


def _bench():
    return load_script("bench_cross_host")


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    """The committed archive file unpacked into cell dirs, as the script does, with protocol
    v2's archived cells beside them (same rows, other fine-tuning: `seed_std` must skip them)."""
    path = Path(_bench().archive_dir(str(ARCHIVE_FILE), str(tmp_path_factory.mktemp("xh"))))
    assert (path / "cells" / CELL / "results.json").is_file()
    assert len(runner.unpack(str(PROTOCOL_V2), str(path))) == 45
    return path


def _rewrite_jsonl(path: Path, edit) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.write_text("".join(json.dumps(edit(i, r)) + "\n" for i, r in enumerate(rows)))


def test_a_cell_against_itself_is_identical(archive: Path) -> None:
    bench = _bench()
    row = bench.compare_cells(str(archive / "cells" / CELL), str(archive / "cells" / CELL))
    p = row["pretrain"]
    assert p["identical_steps"] == p["steps_compared"] > 1
    assert p["first_different_step"] is None and p["max_abs_loss_difference"] == 0.0
    assert p["first_different_grad_norm_step"] is None
    assert row["suite_difference"] == 0.0
    assert all(t["agreement"] == 1.0 and t["difference"] == 0.0 for t in row["tasks"].values())


def test_a_changed_loss_and_prediction_are_found(archive: Path, tmp_path: Path) -> None:
    bench = _bench()
    other = tmp_path / CELL
    shutil.copytree(archive / "cells" / CELL, other)
    metrics = other / "pretrain" / "metrics.jsonl"
    losses = [json.loads(x) for x in metrics.read_text().splitlines()]
    second = sorted(r["step"] for r in losses if r.get("split") == "train")[1]
    _rewrite_jsonl(metrics,
                   lambda i, r: {**r, "loss": r["loss"] + 1e-6}
                   if r.get("split") == "train" and r["step"] >= second else r)
    spam = other / "eval" / "predictions" / "downstream_spam.jsonl"
    n = len(spam.read_text().splitlines())
    _rewrite_jsonl(spam, lambda i, r: {**r, "output": "spam" if r["output"] == "ham" else "ham"}
                   if i == 0 else r)
    row = bench.compare_cells(str(archive / "cells" / CELL), str(other))
    p = row["pretrain"]
    assert p["first_different_step"] == second
    assert p["first_different_grad_norm_step"] is None  # only the loss was changed
    assert p["identical_steps"] == 1
    assert p["max_abs_loss_difference"] == pytest.approx(1e-6, rel=1e-3)
    assert row["tasks"]["downstream_spam"]["agreement"] == pytest.approx((n - 1) / n)
    assert row["tasks"]["downstream_brown_genre"]["agreement"] == 1.0


def test_seed_std_uses_only_the_same_configuration(archive: Path) -> None:
    bench = _bench()
    std, n = bench.seed_std(str(archive), CELL)
    # the row's protocol-v3 seeds, not its protocol-v2 cells (same prefix, other fine-tuning)
    assert n == 3
    scores = [json.loads((archive / "cells" / c / "results.json").read_text())["suite_average"]
              for c in ("lm_2L__prefix_lm__s0__e65b7f2f", "lm_2L__prefix_lm__s1__51ca3bc0",
                        "lm_2L__prefix_lm__s2__654c46a3")]
    assert std == pytest.approx(statistics.stdev(scores))


def test_a_different_cell_is_refused(archive: Path) -> None:
    bench = _bench()
    with pytest.raises(ValueError, match="different cells"):
        bench.compare_cells(str(archive / "cells" / CELL),
                            str(archive / "cells" / "lm_2L__prefix_lm__s1__51ca3bc0"))
