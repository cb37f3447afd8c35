"""Reports from hand-made cell results: schema, Markdown, Kendall τ, plots; paper data."""

import json
import os
import re

import pytest

from t5x_like.runtime import host
from t5x_like.sweep import paper, report, runner
from t5x_like.sweep.config import SweepSpec
from t5x_like.sweep.grid import Cell

ROWS = ("Prefix LM", "BERT-style", "Deshuffling")  # paper GLUE: 80.69, 82.96, 73.17


def _spec():
    return SweepSpec(table="table3", title="Table 3: objectives",
                     rows={r: ("gin/objectives/x.gin",) for r in ROWS},
                     base=(), metric="suite_average", bookkeeping={})


def _fake_sweep(sweep_dir, scores, seeds=1, code=None, host=None, control=None,
                exploratory=None):
    """One cell per (row, seed) with results.json + a metrics.jsonl loss curve."""
    cells = []
    for row, score in zip(ROWS, scores, strict=True):
        for seed in range(seeds):
            cell = Cell(cell_id=f"{row.lower().replace(' ', '_')}__s{seed}", seed=seed,
                        gin_files=(), bindings=(), task="c4like_x",
                        sequence_length={"inputs": 8, "targets": 8}, config_hash="0",
                        rows=(("table3", row),))
            path = runner.cell_dir(str(sweep_dir), cell)
            os.makedirs(os.path.join(path, "pretrain"))
            with open(os.path.join(path, "pretrain", "metrics.jsonl"), "w") as f:
                for step in (10, 20):
                    f.write(json.dumps({"step": step, "split": "train", "time": 0.0,
                                        "loss": 5.0 - step / 10 + seed}) + "\n")
            runner.write_json(os.path.join(path, runner.RESULTS), {
                "suite_average": score + seed, "tasks": {"downstream_spam": score},
                "pretrain": {"final_loss": 3.0 + seed}, "parameters": 1000,
                "flops_per_sequence": 2.5e6, "seconds": {"total": 60.0},
                "cpu_seconds": {"total": 40.0 + seed},
                **({"code": code(row, seed)} if code else {}),
                **({"host": host(row, seed)} if host else {}),
                **({"control": True} if control and control(row) else {}),
                **({"exploratory": exploratory} if exploratory is not None else {})})
            cells.append(cell)
    return cells


def test_same_order_tau_one_reversed_minus_one(tmp_path):
    same = _fake_sweep(tmp_path / "a", [50.0, 60.0, 40.0])
    data = report.build([_spec()], same, str(tmp_path / "a"), "micro")
    table = data["tables"]["table3"]
    assert table["kendall_tau"] == pytest.approx(1.0)
    assert table["ranking_ours"] == table["ranking_paper"] == ["BERT-style", "Prefix LM",
                                                               "Deshuffling"]
    reverse = _fake_sweep(tmp_path / "b", [50.0, 40.0, 60.0])
    table = report.build([_spec()], reverse, str(tmp_path / "b"), "micro")["tables"]["table3"]
    assert table["kendall_tau"] == pytest.approx(-1.0)
    assert table["kendall_p_value"] == pytest.approx(2 / 6)  # exact: 2 of the 3! orders
    assert "exact permutation p = 0.333" in report.table_markdown("table3", table)
    assert report.kendall([1.0], [2.0]) == (None, None)


def test_schema_markdown_and_plots(tmp_path):
    cells = _fake_sweep(tmp_path, [50.0, 60.0, 40.0], seeds=2)
    data = report.build([_spec()], cells, str(tmp_path), "micro")
    assert data["scale"] == "micro" and data["num_cells_done"] == 6
    row = data["tables"]["table3"]["rows"][1]
    assert set(row) >= {"row", "ours_mean", "ours_std", "num_seeds", "paper", "per_task",
                        "pretrain_loss"}
    assert row["row"] == "BERT-style" and row["num_seeds"] == 2
    assert row["ours_mean"] == pytest.approx(60.5)
    assert row["ours_std"] == pytest.approx(0.7071, 1e-3)
    assert row["paper"]["GLUE"] == 82.96 and row["pretrain_loss"] == pytest.approx(3.5)
    assert row["seconds_per_cell"] == 60.0 and row["cpu_seconds_per_cell"] == 40.5  # wall, CPU
    out = tmp_path / "bench" / "t5_tables_micro"
    written = report.write(data, cells, str(tmp_path), out=str(out))
    for path in written:
        assert os.path.getsize(path) > 0, path
    md = (tmp_path / "bench" / "t5_tables_micro.md").read_text()
    assert "| BERT-style |" in md and "60.50 ± 0.71" in md and "82.96" in md
    assert "![table3](t5_tables_micro_table3.png)" in md
    assert (tmp_path / "bench" / "t5_tables_micro_loss_curves.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((tmp_path / "bench" / "t5_tables_micro.json").read_text())
    assert saved["tables"]["table3"]["kendall_tau"] == pytest.approx(1.0)
    assert "## Discussion" not in md
    # a hand-written analysis beside the results survives regenerating them
    (tmp_path / "bench" / "t5_tables_micro_discussion.md").write_text("## Discussion\n\nWhy.\n")
    report.write(data, cells, str(tmp_path), out=str(out))
    md = (tmp_path / "bench" / "t5_tables_micro.md").read_text()
    assert md.rstrip().endswith("## Discussion\n\nWhy.") and "| BERT-style |" in md


def test_missing_cells_are_dashes(tmp_path):
    cells = _fake_sweep(tmp_path, [50.0, 60.0, 40.0])
    os.remove(os.path.join(runner.cell_dir(str(tmp_path), cells[0]), runner.RESULTS))
    table = report.build([_spec()], cells, str(tmp_path), "micro")["tables"]["table3"]
    assert table["rows"][0]["ours_mean"] is None and table["kendall_rows"] == 2
    assert "| Prefix LM | — |" in report.table_markdown("table3", table)


def test_the_report_names_the_code_and_host_each_cell_finished_on(tmp_path):
    cells = _fake_sweep(tmp_path, [50.0, 60.0, 40.0], seeds=2,
                        code=lambda row, seed: None if seed else f"abc{len(row) % 2}",
                        host=lambda row, seed: f"cpu{seed}")
    data = report.build([_spec()], cells, str(tmp_path), "micro")
    assert data["code_versions"] == {"abc0": 1, "abc1": 2, "unrecorded": 3}
    assert data["hosts"] == {"cpu0": 3, "cpu1": 3}
    md = report.markdown(data)
    assert "Code (t5x_like commit: cells): abc0: 1, abc1: 2, unrecorded: 3." in md
    assert "Hosts (CPU: cells): cpu0: 3, cpu1: 3." in md
    assert re.fullmatch(r".+, \d+ CPUs(, AVX(-512|2))?(, flags [0-9a-f]{8})?", host.describe())
    version = runner.code_version()  # this checkout's
    assert version is None or re.fullmatch(r"[0-9a-f]{12}(\+dirty)?", version), version


def test_paper_data_is_sane():
    for table, rows in paper.PUBLISHED.items():
        assert table in paper.TABLE_NUMBERS
        for row, scores in rows.items():
            assert list(scores) == list(paper.COLUMNS), (table, row)
            assert 50 < scores["GLUE"] < 90 and 15 < scores["CNNDM"] < 25
            assert 20 < scores["EnDe"] < 30 and 30 < scores["EnFr"] < 45
    baseline = paper.published("table2", "Encoder-decoder | Denoising")
    for same in (("table4", "Replace corrupted spans"), ("table5", "15%"), ("table6", "i.i.d.")):
        assert paper.published(*same) == baseline
    assert paper.published("table3", "BERT-style") == paper.published("table4", "BERT-style")
    assert paper.published("table2", "Language model | LM")["SQuAD"] == 53.81
    assert paper.published("table9", "x") is None


def test_claims_reproduce_with_the_paper_direction_in_the_paper_tables():
    """Every claim names rows of its table, and the paper's own scores agree with it."""
    for claim in paper.CLAIMS:
        rows = paper.PUBLISHED[claim.table]
        assert set(claim.better) | set(claim.worse) <= set(rows), claim
        diff = (sum(rows[r]["GLUE"] for r in claim.better) / len(claim.better)
                - sum(rows[r]["GLUE"] for r in claim.worse) / len(claim.worse))
        assert diff > 0 if claim.relation == ">" else abs(diff) <= 1.0, claim


def _write_predictions(sweep_dir, cells, right_share, offset=None, constant=None):
    """Spam test predictions per cell: `right_share[row]` of 200 examples right, a run of
    examples starting at `offset[row]` (default 0); `constant(row, seed)` -> a label that cell
    outputs for every example instead (a collapsed fine-tune), or None."""
    targets = ["spam" if i % 3 == 0 else "ham" for i in range(200)]
    for cell in cells:
        row = cell.rows[0][1]
        good = int(200 * right_share[row])
        fixed = constant(row, cell.seed) if constant else None
        path = os.path.join(runner.cell_dir(str(sweep_dir), cell), "eval", "predictions")
        os.makedirs(path)
        with open(os.path.join(path, "downstream_spam.jsonl"), "w") as f:
            for i, t in enumerate(targets):
                wrong = "ham" if t == "spam" else "spam"
                right = (i - (offset or {}).get(row, 0)) % 200 < good
                f.write(json.dumps({"inputs": "x", "targets": t,
                                    "output": fixed or (t if right else wrong)}) + "\n")


def test_intervals_and_claims_from_saved_predictions(tmp_path):
    cells = _fake_sweep(tmp_path, [50.0, 60.0, 40.0], seeds=2)
    shares = {"Prefix LM": 0.6, "BERT-style": 0.95, "Deshuffling": 0.62}
    _write_predictions(tmp_path, cells, shares, offset={"Deshuffling": 100})
    table = report.build([_spec()], cells, str(tmp_path), "micro")["tables"]["table3"]
    by_row = {r["row"]: r for r in table["rows"]}
    lo, hi = by_row["BERT-style"]["ci"]
    assert lo < hi and lo > by_row["Prefix LM"]["ci"][1]
    claims = {c["claim"]: c for c in table["claims"]}
    assert set(claims) == {c.text for c in paper.CLAIMS if c.table == "table3"}
    bert = claims["BERT-style beats prefix LM"]
    assert bert["verdict"] == "reproduced" and bert["paper_difference"] == pytest.approx(2.27)
    assert bert["p_holm"] < 0.05 and bert["ci"][0] > 0 and bert["ci_confidence"] > 0.95
    assert bert["ci95"][0] > bert["ci"][0]  # Holm's level is stricter than 95%
    # Prefix LM (60% right) vs Deshuffling (62%, other examples): too close to call
    close = claims["Deshuffling is worse than prefix LM"]
    assert close["verdict"] == "unresolved" and close["p_holm"] >= 0.05
    assert close["ci"][0] < 0 < close["ci"][1]
    assert "Holm" in table["verdict_method"] and "kendall_tau_ci" not in table
    md = report.table_markdown("table3", table)
    assert "| BERT-style beats prefix LM | 2.27 | +36.14 | [+27.81, +44.46] (98.3%) | < 0.001" in md
    assert "interval at Holm's level" in md and "95% t interval" in md
    # the same 2 points, when Deshuffling is right on a superset of Prefix LM's examples: the
    # test examples are shared across rows, so the difference is resolved (against the paper)
    paired = _fake_sweep(tmp_path / "paired", [50.0, 60.0, 40.0], seeds=2)
    _write_predictions(tmp_path / "paired", paired, shares)
    table = report.build([_spec()], paired, str(tmp_path / "paired"), "micro")["tables"]["table3"]
    claims = {c["claim"]: c for c in table["claims"]}
    assert claims["Deshuffling is worse than prefix LM"]["verdict"] == "contradicted"


def test_no_predictions_no_claims(tmp_path):
    cells = _fake_sweep(tmp_path, [50.0, 60.0, 40.0])
    table = report.build([_spec()], cells, str(tmp_path), "micro")["tables"]["table3"]
    assert table["claims"] == [] and table["verdict_method"] is None
    assert all(r["ci"] is None for r in table["rows"])


def test_claims_across_hosts_are_flagged_and_host_is_tested(tmp_path):
    """Prefix LM on host A, the other rows on B: the claims with Prefix LM on one side compare
    hosts; with every row on one host the host is confounded (untested). Seeds split across
    the hosts make it a testable factor."""
    on_a = lambda row, seed: "cpu-A" if row == "Prefix LM" else "cpu-B"
    cells = _fake_sweep(tmp_path, [50.0, 60.0, 40.0], seeds=2, host=on_a)
    _write_predictions(tmp_path, cells, {"Prefix LM": 0.6, "BERT-style": 0.95,
                                         "Deshuffling": 0.62})
    table = report.build([_spec()], cells, str(tmp_path), "micro")["tables"]["table3"]
    claims = {c["claim"]: c["hosts"] for c in table["claims"]}
    assert claims["BERT-style beats prefix LM"] == {"better": {"cpu-B": 2},
                                                    "worse": {"cpu-A": 2}, "warning": True}
    assert not claims["Deshuffling is worse than BERT-style"]["warning"]
    assert table["hosts"] == {"cpu-A": 2, "cpu-B": 4}
    assert not table["host_factor"]["testable"] and table["host_factor"]["f"] is None
    md = report.table_markdown("table3", table)
    assert "| B2 vs A2 ⚠ |" in md and "| B2 vs B2 |" in md and "A = cpu-A; B = cpu-B" in md
    assert "cannot be told apart from the rows (untested)" in md
    split = _fake_sweep(tmp_path / "split", [50.0, 60.0, 40.0], seeds=2,
                        host=lambda row, seed: f"cpu{seed}")
    table = report.build([_spec()], split, str(tmp_path / "split"), "micro")["tables"]["table3"]
    found = table["host_factor"]  # seed 1 scores one point above seed 0 in every row
    assert found["testable"] and found["rows_spanning_hosts"] == 3
    assert found["effects"]["cpu1"] == pytest.approx(1.0) and found["df"] == [1, 2]
    assert "Suite average = row + host" in report.table_markdown("table3", table)
    alone = report.build([_spec()], _fake_sweep(tmp_path / "one", [50.0, 60.0, 40.0], seeds=2),
                         str(tmp_path / "one"), "micro")["tables"]["table3"]
    assert alone["host_factor"] is None and "Host as a factor" not in report.table_markdown(
        "table3", alone)


def test_an_exploratory_task_is_marked(tmp_path):
    cells = _fake_sweep(tmp_path, [50.0, 60.0, 40.0], exploratory={"downstream_spam": True})
    table = report.build([_spec()], cells, str(tmp_path), "micro")["tables"]["table3"]
    assert table["exploratory_tasks"] == ["downstream_spam"]
    md = report.table_markdown("table3", table)
    assert "| spam † |" in md and "† Exploratory task: designed after results were seen" in md
    plain = _fake_sweep(tmp_path / "plain", [50.0, 60.0, 40.0],
                        exploratory={"downstream_spam": False})
    table = report.build([_spec()], plain, str(tmp_path / "plain"), "micro")["tables"]["table3"]
    assert table["exploratory_tasks"] == [] and "†" not in report.table_markdown("table3", table)


def test_a_control_row_is_shown_but_not_ranked(tmp_path):
    cells = _fake_sweep(tmp_path, [50.0, 60.0, 40.0], control=lambda row: row == "Deshuffling")
    table = report.build([_spec()], cells, str(tmp_path), "micro")["tables"]["table3"]
    assert [r["control"] for r in table["rows"]] == [False, False, True]
    assert table["kendall_rows"] == 2 and "Deshuffling" not in table["ranking_ours"]
    assert table["rows"][2]["ours_mean"] == pytest.approx(40.0)


def test_collapsed_fine_tunes_are_counted_per_row(tmp_path):
    cells = _fake_sweep(tmp_path, [50.0, 60.0, 40.0], seeds=2)
    shares = {"Prefix LM": 0.6, "BERT-style": 0.95, "Deshuffling": 0.62}
    _write_predictions(tmp_path, cells, shares,
                       constant=lambda row, seed: "ham" if row == "BERT-style" and seed else None)
    table = report.build([_spec()], cells, str(tmp_path), "micro")["tables"]["table3"]
    counts = {r["row"]: r["collapsed"]["downstream_spam"] for r in table["rows"]}
    assert counts == {"Prefix LM": 0, "BERT-style": 1, "Deshuffling": 0}
    # always "ham", 133 of 200 targets ham: macro-F1 = (F1(ham) + F1(spam) = 0) / 2
    assert table["best_constant"]["downstream_spam"] == pytest.approx(100 * 133 / 333)
    md = report.table_markdown("table3", table)
    assert "| BERT-style | 1/2 |" in md and "| best constant score | 39.94 |" in md
    healthy = _fake_sweep(tmp_path / "healthy", [50.0, 60.0, 40.0], seeds=2)
    _write_predictions(tmp_path / "healthy", healthy, shares)
    table = report.build([_spec()], healthy, str(tmp_path / "healthy"), "micro")
    assert "collapsed" not in report.table_markdown("table3", table["tables"]["table3"])


def test_rows_above_the_best_constant_are_counted_per_task(tmp_path):
    """A row counts when its task score's CI lies above the best constant predictor's score
    (spam: always "ham" = 39.94 macro-F1): 95% right clears it, 40% right does not, and a row
    whose seeds are always "ham" sits on it."""
    cells = _fake_sweep(tmp_path, [50.0, 60.0, 40.0], seeds=2)
    shares = {"Prefix LM": 0.4, "BERT-style": 0.95, "Deshuffling": 0.6}
    _write_predictions(tmp_path, cells, shares,
                       constant=lambda row, seed: "ham" if row == "Deshuffling" else None)
    table = report.build([_spec()], cells, str(tmp_path), "micro")["tables"]["table3"]
    assert table["above_constant"] == {"downstream_spam": ["BERT-style"]}
    md = report.table_markdown("table3", table)
    assert "| rows above it | 1/3 |" in md and "| best constant score | 39.94 |" in md
    none = _fake_sweep(tmp_path / "none", [50.0, 60.0, 40.0])
    table = report.build([_spec()], none, str(tmp_path / "none"), "micro")["tables"]["table3"]
    assert table["above_constant"] is None
    assert "rows above it" not in report.table_markdown("table3", table)


def test_rows_differ_is_a_one_way_anova_over_seeds():
    """F = between-row mean square / within-row mean square, checked by hand; rows with one
    seed are left out; constant rows have no F."""
    groups = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0]]
    result = report.rows_differ(groups)
    # two rows of 3: grand mean 3.5; between SS = 3 * (1.5^2 + 1.5^2) = 13.5 (1 df);
    # within SS = 2 + 2 = 4 (4 df): F = 13.5 / 1.0
    assert result["rows"] == 2 and result["f"] == pytest.approx(13.5)
    assert 0.0 < result["p"] < 0.05
    assert result["seed_df"] == 4 and result["seed_std"] == pytest.approx(1.0)  # sqrt(4 / 4)
    alike = report.rows_differ([[1.0, 3.0, 2.0], [2.0, 1.0, 3.0]])
    assert alike["f"] == pytest.approx(0.0) and alike["p"] == pytest.approx(1.0)
    assert report.rows_differ([[1.0, 2.0], [3.0]]) is None
    assert report.rows_differ([[1.0, 1.0], [2.0, 2.0]])["f"] is None


def test_rows_differ_in_the_report(tmp_path):
    cells = _fake_sweep(tmp_path, [50.0, 60.0, 40.0], seeds=2)
    table = report.build([_spec()], cells, str(tmp_path), "micro")["tables"]["table3"]
    suite = table["rows_differ"]["suite_average"]  # rows 10 points apart, seeds 1 point
    # between: 2 * (0 + 10^2 + 10^2) / 2 df = 200; within: 3 * 0.5 / 3 df = 0.5
    assert suite["rows"] == 3 and suite["f"] == pytest.approx(400.0) and suite["p"] < 0.001
    assert table["rows_differ"]["downstream_spam"]["f"] is None  # the same score every seed
    md = report.table_markdown("table3", table)
    assert "| rows differ: F (p) | — | 400.0 (p < 0.001) |" in md
    assert suite["seed_df"] == 3 and suite["seed_std"] == pytest.approx(0.5 ** 0.5)
    assert "| seed std, pooled (df) | 0.00 (3) | 0.71 (3) |" in md
    pairs = {(p["better"], p["worse"]): p for p in table["pairs_differ"]["pairs"]}
    assert all(p["differ"] for p in pairs.values()) and set(pairs) == {
        ("BERT-style", "Prefix LM"), ("Prefix LM", "Deshuffling"), ("BERT-style", "Deshuffling")}
    assert "3 pairs differ: BERT-style > Prefix LM (+10.00, Holm p" in md
    one_seed = _fake_sweep(tmp_path / "one", [50.0, 60.0, 40.0])
    table = report.build([_spec()], one_seed, str(tmp_path / "one"), "micro")["tables"]["table3"]
    assert table["rows_differ"]["suite_average"] is None
    md = report.table_markdown("table3", table)
    assert "rows differ" not in md and "Seed std" not in md  # one seed: no ANOVA, no note
    assert table["pairs_differ"] is None and "Which rows differ" not in md
