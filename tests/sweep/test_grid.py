"""Sweep files -> cells: every paper row present, a new line adds a cell, dedup, seeds, the
control row, the full-span LM row, and the v4 definitions still naming the archived cells."""

import os

import pytest

from t5x_like.data import tasks
from t5x_like.sweep import costs, grid, paper, runner

ARCHIVE = "benchmarks/sweep_cells/tiny.jsonl.gz"
V4 = ("gin/sweeps/history/v4/t5_table2_architectures.gin",
      "gin/sweeps/history/v4/t5_table3_objectives.gin")
SWEEPS = {
    "table2": "gin/sweeps/t5_table2_architectures.gin",
    "table3": "gin/sweeps/t5_table3_objectives.gin",
    "table4": "gin/sweeps/t5_table4_bert_variants.gin",
    "table5": "gin/sweeps/t5_table5_corruption_rates.gin",
    "table6": "gin/sweeps/t5_table6_span_lengths.gin",
}


@pytest.fixture(scope="module")
def specs():
    return {t: grid.load_sweep(p) for t, p in SWEEPS.items()}


def test_every_paper_row_is_a_sweep_row(specs):
    for table, spec in specs.items():
        assert spec.table == table
        assert list(spec.rows) == list(paper.PUBLISHED[table]), table
    assert set(specs["table2"].bookkeeping) == set(specs["table2"].rows)
    assert specs["table2"].bookkeeping["Enc-dec 6 layers | Denoising"] == ("P", "M/2")


def test_all_tables_expand_with_shared_cells_run_once(specs):
    scale = grid.load_scale("micro")
    cells = grid.expand(list(specs.values()), scale)
    # 11 + 4 + 4 + 4 + 5 = 28 rows; shared: Table 3 prefix LM = Table 2 enc-dec LM, the
    # control in 2 and 3, BERT-style in 3 and 4, the baseline in 2, 4, 5 (15%) and 6 (i.i.d.).
    assert len(cells) == 22
    assert len({c.cell_id for c in cells}) == 22
    baseline = [c for c in cells if ("table2", "Encoder-decoder | Denoising") in c.rows]
    assert len(baseline) == 1
    assert set(baseline[0].rows) == {("table2", "Encoder-decoder | Denoising"),
                                     ("table4", "Replace corrupted spans"), ("table5", "15%"),
                                     ("table6", "i.i.d.")}
    prefix = [c for c in cells if ("table3", "Prefix LM") in c.rows][0]
    assert ("table2", "Encoder-decoder | LM") in prefix.rows
    assert prefix.cell_id.startswith("encdec_2x2__prefix_lm__s0__")
    lm = [c for c in cells if ("table2", "Language model | LM") in c.rows][0]
    assert lm.cell_id.startswith("decoderonly_2L__full_lm__")  # the whole span, decoder-only
    six = [c for c in cells if ("table2", "Enc-dec 6 layers | LM") in c.rows][0]
    assert six.cell_id.startswith("encdec_1x1__prefix_lm__")
    # every cell: the scale's inputs length, the objective's own targets length; the full-span
    # LM reads a prefix-LM example's inputs + targets
    assert all(c.sequence_length["inputs"] == scale.inputs_length for c in cells if c is not lm)
    assert lm.sequence_length == {"targets": sum(prefix.sequence_length.values())}
    assert baseline[0].sequence_length["targets"] < prefix.sequence_length["targets"]
    (control,) = [c for c in cells if c.control]
    assert set(control.rows) == {("table2", paper.NO_PRETRAINING),
                                 ("table3", paper.NO_PRETRAINING)}
    assert control.cell_id.startswith(f"encdec_2x2__{grid.NO_PRETRAINING}__s0__")
    assert "train.num_train_steps = 0" in control.bindings
    assert control.config_hash != baseline[0].config_hash  # the baseline, pre-trained


def test_adding_a_line_adds_a_cell_and_seeds_multiply(tmp_path):
    base = open(os.path.join(grid.REPO_ROOT, SWEEPS["table3"])).read()
    extra = base.replace(
        "    'Deshuffling':",
        "    'Deshuffling 4 heads': ['gin/architectures/encoder_decoder.gin', "
        "'gin/objectives/deshuffling.gin', 'TransformerConfig.num_heads = 4'],\n"
        "    'Deshuffling':")
    path = tmp_path / "t3_plus.gin"
    path.write_text(extra)
    scale = grid.load_scale("micro")
    before = grid.expand([grid.load_sweep(SWEEPS["table3"])], scale)
    after = grid.expand([grid.load_sweep(str(path))], scale)
    assert len(after) == len(before) + 1
    assert {c.cell_id for c in before} < {c.cell_id for c in after}
    seeded = grid.expand([grid.load_sweep(SWEEPS["table3"])], scale, seeds=2)
    assert len(seeded) == 2 * len(before)
    assert sorted(c.seed for c in seeded) == [0] * 4 + [1] * 4
    assert all(f"train.seed = {c.seed}" in c.bindings for c in seeded)
    only = grid.expand([grid.load_sweep(SWEEPS["table3"])], scale, rows=["BERT-style"])
    assert [c.rows for c in only] == [(("table3", "BERT-style"),)]


def test_table2_bookkeeping_measured_at_tiny(specs):
    scale = grid.load_scale("tiny")
    cells = {c.rows[0][1]: c for c in grid.expand([specs["table2"]], scale)
             if c.rows[0][1].endswith("| LM")}
    m = {row.split(" |")[0]: costs.measure(c.gin_files, c.bindings, c.sequence_length)
         for row, c in cells.items()}
    enc_dec, shared, six = m["Encoder-decoder"], m["Enc-dec shared"], m["Enc-dec 6 layers"]
    lm, prefix = m["Language model"], m["Prefix LM"]
    # 2P vs P: the shared / half-depth / decoder-only models have fewer parameters.
    assert shared["parameters"] < enc_dec["parameters"]
    assert six["parameters"] < enc_dec["parameters"]
    assert lm["parameters"] == prefix["parameters"] < enc_dec["parameters"]
    # M: the full-span LM reads as many tokens per sequence as the prefix LM beside it.
    assert lm["flops_per_sequence"] == prefix["flops_per_sequence"]
    assert cells["Language model | LM"].sequence_length == {"targets": 2 * scale.inputs_length}
    # M vs M/2: the shared model costs as much as the baseline, half the layers about half.
    assert shared["flops_per_sequence"] == pytest.approx(enc_dec["flops_per_sequence"], rel=0.01)
    assert six["flops_per_sequence"] < 0.75 * enc_dec["flops_per_sequence"]
    assert enc_dec["batch_size"] == 32 and enc_dec["num_train_steps"] > 0


def test_bad_input_is_named(tmp_path):
    with pytest.raises(grid.SweepError, match="unknown scale 'huge'"):
        grid.load_scale("huge")
    with pytest.raises(grid.SweepError, match="unknown row"):
        grid.select_rows([grid.load_sweep(SWEEPS["table3"])], ["BERT"])
    bad = tmp_path / "bad.gin"
    bad.write_text("import t5x_like.sweep.config\nsweep.table = 't'\nsweep.title = 'T'\n"
                   "sweep.rows = {'a': 'gin/objectives/prefix_lm.gin'}\n")
    with pytest.raises(grid.SweepError, match="list of gin files"):
        grid.load_sweep(str(bad))
    missing = tmp_path / "missing.gin"
    missing.write_text("import t5x_like.sweep.config\nsweep.table = 't'\nsweep.title = 'T'\n"
                       "sweep.rows = {'a': ['gin/objectives/nope.gin']}\n")
    with pytest.raises(grid.SweepError, match="nope.gin"):
        grid.expand([grid.load_sweep(str(missing))], grid.load_scale("micro"))
    corpus = tmp_path / "corpus.gin"
    corpus.write_text("include 'gin/sweeps/scales/micro.gin'\nsweep_scale.corpus = 'wiki'\n")
    with pytest.raises(grid.SweepError, match="corpus must be one of"):
        grid.load_scale(str(corpus))


def test_the_rerun_reuses_every_unchanged_archived_cell_and_v4_names_them_all(tmp_path):
    """Tables 2 + 3 at `tiny`, 3 seeds: the full-span LM row and the control are new cells, the
    other 33 are v4's, restored with their cell.json as archived (a sweep rewrites it and
    archives it again); the v4 definitions (gin/sweeps/history/v4) name 36 archived cells, so
    that report can be rebuilt; every other archived cell is one of the v5 sweep's (6 seeds) or
    of the word-order rerun's, and all of them are there."""
    scale = grid.load_scale("tiny")
    records = runner.read_archive(os.path.join(grid.REPO_ROOT, ARCHIVE))
    archived = set(records)
    tables = [grid.load_sweep(SWEEPS["table2"]), grid.load_sweep(SWEEPS["table3"])]
    now = grid.expand(tables, scale, seeds=3)
    v4 = grid.expand([grid.load_sweep(p) for p in V4], scale, seeds=3)
    v4_ids = {c.cell_id for c in v4}
    new = sorted(c.cell_id for c in now if c.cell_id not in v4_ids)
    assert len(now) == 39 and len(new) == 6
    assert [n.split("__")[1] for n in new] == ["full_lm"] * 3 + [grid.NO_PRETRAINING] * 3
    restored = runner.restore(now, os.path.join(grid.REPO_ROOT, ARCHIVE), str(tmp_path))
    assert restored == 33 + len(archived & set(new))
    for cell in now:
        if cell.cell_id in archived:
            spec = os.path.join(runner.prepare(cell, scale, str(tmp_path)), runner.CELL_SPEC)
            assert open(spec).read() == records[cell.cell_id][runner.CELL_SPEC], cell.cell_id
    assert len(v4_ids) == 36 and v4_ids <= archived and not any(c.control for c in v4)
    word_order = grid.expand([grid.load_sweep("gin/sweeps/word_order_objectives.gin")],
                             grid.load_scale("tiny_word_order"), seeds=3)
    v5 = {c.cell_id for c in grid.expand(tables, scale, seeds=6)}
    assert archived - v4_ids == (v5 | {c.cell_id for c in word_order}) - v4_ids


def test_corpora_and_word_order_definition_come_from_their_one_place():
    for corpus in tasks.CORPORA:
        for other in tasks.CORPORA:
            assert grid.corpus_task(f"{other}_prefix_lm", corpus) == f"{corpus}_prefix_lm"
    assert grid.corpus_task("downstream_spam", "c4") == "downstream_spam"
    scale = grid.load_scale("tiny_word_order")
    assert scale.evaluate_flags[0] == "--tasks=downstream_word_order"
    cells = grid.expand([grid.load_sweep("gin/sweeps/word_order_objectives.gin")], scale)
    rows = [row for c in cells for _, row in c.rows]
    assert rows == ["Prefix LM", "BERT-style", "Deshuffling", paper.NO_PRETRAINING]
    assert [c.control for c in cells] == [False, False, False, True]
