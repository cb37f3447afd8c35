"""The no-pre-training control through the runner, end to end (initialise, evaluate, archive,
report) at a trimmed micro scale: a fresh initialisation of the baseline, fine-tuned; one cell
serving Tables 2 and 3. (test_cells.py runs the trained cells, the full-span LM row among them.)"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import gin
import jax
import numpy as np
import pytest

from t5x_like.convert.cli import read_tree
from t5x_like.data import downstream
from t5x_like.models import TransformerConfig, make_model
from t5x_like.sweep import grid, paper, runner
from t5x_like.train import partitioning, train_state
from t5x_like.train.optimizers import create_optimizer

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = "gin/sweeps/t5_table2_architectures.gin,gin/sweeps/t5_table3_objectives.gin"
MICRO = ROOT / "gin" / "sweeps" / "scales" / "micro.gin"


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    """The sweep dir: the control cell at micro with 2 fine-tuning steps, archived."""
    root = tmp_path_factory.mktemp("controls")
    scale = root / "micro_fast.gin"
    scale.write_text(f"include '{MICRO}'\nsweep_scale.name = 'micro_fast'\n"
                     "sweep_scale.evaluate_flags = ['--tasks=downstream_spam', "
                     "'--finetune_steps=2']\n")
    argv = [sys.executable, "-m", "t5x_like.sweep", f"--sweep={SWEEPS}", f"--scale={scale}",
            f"--rows={paper.NO_PRETRAINING}", f"--sweep_dir={root / 'sweep'}",
            f"--archive={root / 'archive.jsonl.gz'}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[sweep] 1 cells (table2, table3" in proc.stdout
    return root / "sweep"


def _cell(sweep_dir: Path, part: str) -> tuple[Path, dict]:
    (path,) = (sweep_dir / "cells").glob(f"*__{part}__s0__*")
    return path, json.loads((path / runner.RESULTS).read_text())


def test_the_control_cell_fine_tunes_a_fresh_initialisation(swept):
    path, results = _cell(swept, grid.NO_PRETRAINING)
    spec = json.loads((path / runner.CELL_SPEC).read_text())
    assert spec["control"] is results["control"] is True
    assert sorted(map(tuple, results["rows"])) == [("table2", paper.NO_PRETRAINING),
                                                   ("table3", paper.NO_PRETRAINING)]
    assert results["num_train_steps"] == 0 and results["pretrain"]["input_tokens"] == 0
    assert results["pretrain"]["final_step"] == 0 and results["pretrain"]["final_loss"] is None
    assert results["host"] and results["code"] == runner.code_version()
    assert results["exploratory"] == {"downstream_spam": False}
    assert 0.0 <= results["suite_average"] <= 100.0 and results["evaluation"]["step"] is None
    model_dir = path / "pretrain"
    assert not (model_dir / "checkpoints").exists() and (model_dir / "params").is_dir()
    assert "train.num_train_steps = 0" in (model_dir / "config.gin").read_text()
    fine_tune = (path / "eval" / "finetune" / "downstream_spam" / "config.gin").read_text()
    assert re.search(r"^train\.init_params_path = (\\\n\s*)?" + re.escape(repr(str(model_dir))),
                     fine_tune, re.M)  # (gin may wrap a long value onto the next line)
    # its params: the trainer's step-0 params under the cell's seed, untrained
    grid._parse(spec["gin_files"], spec["bindings"])
    try:
        model, optimizer = make_model(TransformerConfig()), create_optimizer()
    finally:
        gin.clear_config()
    mesh = partitioning.create_mesh((1, 1, 1), jax.devices()[:1])  # as the cell: one CPU device
    rules = partitioning.logical_axis_rules("fsdp")
    batch = model.example_batch(1, spec["sequence_length"], packed=True)
    plan = train_state.sharded_state(model, optimizer, batch, mesh, rules)
    fresh = jax.device_get(
        train_state.create_state(plan, jax.random.key(spec["seed"]), mesh, rules).params)
    saved = read_tree(str(model_dir / "params"))
    assert jax.tree.structure(saved) == jax.tree.structure(fresh)
    for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(fresh), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    before = (model_dir / "config.gin").stat().st_mtime_ns
    assert runner.init_model(str(path)) == str(model_dir)  # done: not written again
    assert (model_dir / "config.gin").stat().st_mtime_ns == before


def test_both_are_archived_and_reported_the_control_marked(swept):
    archived = runner.read_archive(str(swept.parent / "archive.jsonl.gz"))
    assert sorted(archived) == sorted(os.listdir(swept / "cells"))
    control = next(files for name, files in archived.items() if grid.NO_PRETRAINING in name)
    assert "pretrain/metrics.jsonl" not in control  # nothing was pre-trained
    assert json.loads(control["cell.json"])["control"] is True
    report = json.loads((swept / "t5_tables_micro_fast.json").read_text())
    for table in ("table2", "table3"):
        rows = {r["row"]: r for r in report["tables"][table]["rows"]}
        assert rows[paper.NO_PRETRAINING]["num_seeds"] == 1, table
        assert rows[paper.NO_PRETRAINING]["paper"]["GLUE"] == 66.22
    assert report["tables"]["table2"]["rows"][-1]["row"] == paper.NO_PRETRAINING


def test_word_order_is_the_one_exploratory_task():
    flags = {name: downstream.get_spec(name).exploratory for name in downstream.SUITE}
    assert [n for n, f in flags.items() if f] == ["downstream_word_order"]
    assert "after" in downstream.get_spec("downstream_word_order").exploratory_reason
    assert runner.exploratory_tasks(["downstream_spam", "downstream_word_order"]) == {
        "downstream_spam": False, "downstream_word_order": True}
