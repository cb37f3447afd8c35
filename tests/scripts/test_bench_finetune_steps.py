"""scripts/bench_finetune_steps.py without running a cell: the evaluate overrides it builds from a
cell's scale, its output names, and its bad-input errors. The real re-evaluation of micro cells
is tested in tests/sweep/test_cells.py."""

from __future__ import annotations

import pytest

from tests.scripts import load_script

TASKS = ["downstream_spam", "downstream_brown_genre"]


def _bench():
    return load_script("bench_finetune_steps")


def _spec(bindings: list[str]) -> dict:
    return {"cell_id": "c", "scale": {"evaluate_flags": [f"--tasks={','.join(TASKS)}",
                                                        "--finetune_steps=80"],
                                      "evaluate_bindings": bindings}}


def test_overrides_stretch_the_schedule_and_name_the_output() -> None:
    bench = _bench()
    spec = _spec(["train.batch_size = 16", "warmup_linear_schedule.total_steps = 80"])
    assert bench.scale_steps(spec) == 80 and bench.scale_tasks(spec) == TASKS
    assert bench.overrides(spec, 240, TASKS[:1]) == [
        "--finetune_steps=240", "--tasks=downstream_spam",
        "warmup_linear_schedule.total_steps = 240"]
    # no schedule length bound by the scale: only the steps and tasks change
    assert bench.overrides(_spec([]), 8, TASKS) == [
        "--finetune_steps=8", f"--tasks={','.join(TASKS)}"]
    assert bench.out_name(240, TASKS, TASKS) == "eval_steps240"
    assert bench.out_name(240, TASKS[:1], TASKS) == "eval_steps240_spam"


@pytest.mark.parametrize("argv, message", [
    (["--steps=8x"], "--steps must be positive integers"),
    (["--steps=0,8"], "--steps must be positive integers"),
    (["--steps=8", "--sweep_dir={tmp}/nope"], "no sweep cells in"),
    (["--steps=8", "--cells=zzz*"], "no finished cell"),
])
def test_bad_input_names_the_problem(tmp_path, argv, message) -> None:
    (tmp_path / "cells").mkdir()
    argv = [a.format(tmp=tmp_path) for a in argv]
    if not any(a.startswith("--sweep_dir") for a in argv):
        argv.append(f"--sweep_dir={tmp_path}")
    with pytest.raises(SystemExit, match=message):
        _bench().main([*argv, f"--out={tmp_path / 'out'}"])
