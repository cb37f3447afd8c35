"""`python -m t5x_like.sweep`: --print_commands, argument errors and a failed cell's message
(real cells: test_cells.py)."""

import json
import os
import shlex
import sys

import pytest

from t5x_like.sweep import costs, grid, runner
from t5x_like.sweep.__main__ import main

T2 = "gin/sweeps/t5_table2_architectures.gin"
T3 = "gin/sweeps/t5_table3_objectives.gin"


def test_print_commands_one_line_per_cell(tmp_path, capsys):
    assert main([f"--sweep={T2},{T3}", "--scale=micro", f"--sweep_dir={tmp_path}",
                 "--print_commands"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 13  # 11 + 4 rows; Table 3's prefix LM = Table 2's enc-dec LM, and the
    # no-pre-training control is one cell in both tables
    for line in lines:
        argv = shlex.split(line)
        assert argv[1:3] == ["-m", "t5x_like.sweep"] and argv[3].startswith("--run_cell=")
        spec = json.loads(open(os.path.join(argv[3].split("=", 1)[1], "cell.json")).read())
        assert "gin/sweeps/scales/micro.gin" in spec["gin_files"]
        train = runner.train_command(spec, "/x")
        assert train[1:3] == ["-m", "t5x_like.train"] and "--model_dir=/x/pretrain" in train
        evaluate = runner.evaluate_command(spec, "/x")
        assert "--checkpoint=/x/pretrain" in evaluate and "--out_dir=/x/eval" in evaluate
        probe = runner.evaluate_command(spec, "/x", "eval_p", 3,
                                        ["--finetune_steps=7", "train.batch_size = 2"])
        assert "--out_dir=/x/eval_p" in probe
        # argparse and gin keep the last value: the probe's flags and bindings win
        steps = [a for a in probe if a.startswith("--finetune_steps")]
        assert steps[-1] == "--finetune_steps=7"
        assert probe[-2:] == ["--gin_bindings=train.seed = 3",
                              "--gin_bindings=train.batch_size = 2"]
    shared = [json.loads(open(os.path.join(shlex.split(x)[3][11:], "cell.json")).read())
              for x in lines]
    assert sum(len(s["rows"]) == 2 for s in shared) == 2
    assert [s.get("control", False) for s in shared] == [False] * 12 + [True]  # last: untrained
    measured = [costs.measure(s["gin_files"], s["bindings"], s["sequence_length"])
                for s in shared]
    flops = [m["flops_per_sequence"] * m["batch_size"] * m["num_train_steps"] for m in measured]
    assert flops == sorted(flops, reverse=True) and flops[0] > flops[-1]  # longest first


def test_cells_run_seed_major_longest_first_within_a_seed():
    """Every row's seed 0, then seed 1: a sweep spread over hosts gives each row seeds on each
    host it spans; within a seed the most training FLOPs first."""
    specs = [grid.load_sweep(T2), grid.load_sweep(T3)]
    cells = grid.expand(specs, grid.load_scale("micro"), seeds=2)
    order = runner.run_order(cells)
    assert sorted(c.cell_id for c in order) == sorted(c.cell_id for c in cells)
    assert [c.seed for c in order] == [0] * 13 + [1] * 13
    for seed in range(2):
        in_seed = [c for c in order if c.seed == seed]
        measured = [costs.measure(c.gin_files, c.bindings, c.sequence_length) for c in in_seed]
        flops = [m["flops_per_sequence"] * m["batch_size"] * m["num_train_steps"]
                 for m in measured]
        assert flops == sorted(flops, reverse=True)
        # the rows in the same order in every seed
        assert [c.rows for c in in_seed] == [c.rows for c in order if c.seed == 0]


def test_bad_arguments_exit_2(tmp_path, capsys):
    assert main(["--scale=micro"]) == 2
    assert main([f"--sweep={T2}", "--scale=nope", f"--sweep_dir={tmp_path}"]) == 2
    assert main([f"--sweep={T2}", "--scale=micro", "--rows=Encoder", "--print_commands",
                 f"--sweep_dir={tmp_path}"]) == 2
    assert main([f"--sweep={T2},{T2}", "--scale=micro", "--print_commands"]) == 2
    err = capsys.readouterr().err
    assert "unknown scale 'nope'" in err and "unknown row" in err and "same table" in err


def test_a_failed_cell_subprocess_names_its_error(tmp_path):
    """A cell's train/evaluate failure says why on the console, not only in its log: the
    child's last `error:` line, else its traceback's last line."""
    log = tmp_path / "pretrain.log"
    failing = "import sys; print('step 1'); print('error: corpus X is not prepared'); sys.exit(2)"
    with pytest.raises(runner.CellFailed,
                       match=r"exited with status 2: corpus X is not prepared; see .*pretrain.log"):
        runner._run([sys.executable, "-c", failing], str(log), "cell: python -m t5x_like.train")
    log2 = tmp_path / "eval.log"
    with pytest.raises(runner.CellFailed, match=r"status 1: ValueError: bad binding; see"):
        runner._run([sys.executable, "-c", "raise ValueError('bad binding')"], str(log2), "cell")
    quiet = tmp_path / "quiet.log"
    with pytest.raises(runner.CellFailed, match=r"exited with status 3; see .*quiet.log"):
        runner._run([sys.executable, "-c", "import sys; sys.exit(3)"], str(quiet), "cell")
