"""`python -m t5x_like.sweep`: --print_commands, argument errors, and a real two-cell micro
sweep (train + evaluate subprocesses) that resumes without re-running finished cells."""

import json
import os
import shlex
import subprocess
import sys

from t5x_like.sweep import costs, runner
from t5x_like.sweep.__main__ import main

T2 = "gin/sweeps/t5_table2_architectures.gin"
T3 = "gin/sweeps/t5_table3_objectives.gin"
ROWS = "Encoder-decoder | Denoising,Language model | LM"


def test_print_commands_one_line_per_cell(tmp_path, capsys):
    assert main([f"--sweep={T2},{T3}", "--scale=micro", f"--sweep_dir={tmp_path}",
                 "--print_commands"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 12  # 10 + 3 rows, Table 3's prefix LM = Table 2's enc-dec LM
    for line in lines:
        argv = shlex.split(line)
        assert argv[1:3] == ["-m", "t5x_like.sweep"] and argv[3].startswith("--run_cell=")
        spec = json.loads(open(os.path.join(argv[3].split("=", 1)[1], "cell.json")).read())
        assert "gin/sweeps/scales/micro.gin" in spec["gin_files"]
        train = runner.train_command(spec, "/x")
        assert train[1:3] == ["-m", "t5x_like.train"] and "--model_dir=/x/pretrain" in train
        evaluate = runner.evaluate_command(spec, "/x")
        assert "--checkpoint=/x/pretrain" in evaluate and "--out_dir=/x/eval" in evaluate
    shared = [json.loads(open(os.path.join(shlex.split(x)[3][11:], "cell.json")).read())
              for x in lines]
    assert sum(len(s["rows"]) == 2 for s in shared) == 1
    flops = [costs.measure(s["gin_files"], s["bindings"], s["sequence_length"])
             ["flops_per_sequence"] for s in shared]
    assert flops == sorted(flops, reverse=True) and flops[0] > flops[-1]  # longest first


def test_bad_arguments_exit_2(tmp_path, capsys):
    assert main(["--scale=micro"]) == 2
    assert main([f"--sweep={T2}", "--scale=nope", f"--sweep_dir={tmp_path}"]) == 2
    assert main([f"--sweep={T2}", "--scale=micro", "--rows=Encoder", "--print_commands",
                 f"--sweep_dir={tmp_path}"]) == 2
    assert main([f"--sweep={T2},{T2}", "--scale=micro", "--print_commands"]) == 2
    err = capsys.readouterr().err
    assert "unknown scale 'nope'" in err and "unknown row" in err and "same table" in err


def _sweep(sweep_dir, out):
    argv = [sys.executable, "-m", "t5x_like.sweep", f"--sweep={T2}", "--scale=micro",
            f"--rows={ROWS}", "--parallel=2", f"--sweep_dir={sweep_dir}", f"--out={out}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_two_cell_micro_sweep_end_to_end_and_resume(tmp_path):
    sweep_dir, out = tmp_path / "sweep", tmp_path / "bench" / "t5_tables_micro"
    log = _sweep(sweep_dir, out)
    cells = sorted(os.listdir(sweep_dir / "cells"))
    assert len(cells) == 2 and log.count(": pre-training") == 2
    assert os.listdir(sweep_dir / runner.XLA_CACHE)  # the cells' shared compilation cache
    for cell in cells:
        results = json.loads((sweep_dir / "cells" / cell / "results.json").read_text())
        assert results["pretrain"]["final_step"] == 6
        assert results["pretrain"]["input_tokens"] == 6 * 8 * 16
        assert set(results["tasks"]) == {"downstream_spam"}
        assert 0.0 <= results["suite_average"] <= 100.0 and results["parameters"] > 0
    for name in ("table2.md", "table2.json", "table2.png", "loss_curves.png",
                 "t5_tables_micro.md", "t5_tables_micro.json"):
        assert (sweep_dir / name).stat().st_size > 0, name
    for suffix in (".md", ".json", "_table2.png", "_loss_curves.png"):
        assert os.path.getsize(f"{out}{suffix}") > 0, suffix
    table = json.loads((sweep_dir / "t5_tables_micro.json").read_text())["tables"]["table2"]
    done = [r for r in table["rows"] if r["num_seeds"]]
    assert [r["row"] for r in done] == ["Encoder-decoder | Denoising", "Language model | LM"]
    stamps = {c: os.path.getmtime(sweep_dir / "cells" / c / "results.json") for c in cells}
    logs = {c: (sweep_dir / "cells" / c / "pretrain.log").stat().st_size for c in cells}
    log = _sweep(sweep_dir, out)  # resume: both cells done -> skipped, reports regenerated
    assert log.count("done, skipped") == 2 and ": pre-training" not in log
    for c in cells:
        assert os.path.getmtime(sweep_dir / "cells" / c / "results.json") == stamps[c]
        assert (sweep_dir / "cells" / c / "pretrain.log").stat().st_size == logs[c]
