"""Sweep files -> cells: every paper row present, a new line adds a cell, dedup, seeds."""

import os

import pytest

from t5x_like.sweep import costs, grid, paper

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
    # 10 + 3 + 4 + 4 + 5 = 26 rows; shared: Table 3 prefix LM = Table 2 enc-dec LM, BERT-style
    # in 3 and 4, the baseline in 2, 4, 5 (15%) and 6 (i.i.d.).
    assert len(cells) == 21
    assert len({c.cell_id for c in cells}) == 21
    baseline = [c for c in cells if ("table2", "Encoder-decoder | Denoising") in c.rows]
    assert len(baseline) == 1
    assert set(baseline[0].rows) == {("table2", "Encoder-decoder | Denoising"),
                                     ("table4", "Replace corrupted spans"), ("table5", "15%"),
                                     ("table6", "i.i.d.")}
    prefix = [c for c in cells if ("table3", "Prefix LM") in c.rows][0]
    assert ("table2", "Encoder-decoder | LM") in prefix.rows
    assert prefix.cell_id.startswith("encdec_2x2__prefix_lm__s0__")
    lm = [c for c in cells if ("table2", "Language model | LM") in c.rows][0]
    assert lm.cell_id.startswith("lm_2L__prefix_lm__")
    six = [c for c in cells if ("table2", "Enc-dec 6 layers | LM") in c.rows][0]
    assert six.cell_id.startswith("encdec_1x1__prefix_lm__")
    # every cell: the scale's inputs length, the objective's own targets length
    assert all(c.sequence_length["inputs"] == scale.inputs_length for c in cells)
    assert baseline[0].sequence_length["targets"] < prefix.sequence_length["targets"]


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
    assert sorted(c.seed for c in seeded) == [0, 0, 0, 1, 1, 1]
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
