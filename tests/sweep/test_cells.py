"""Real sweep cells at the micro scale (train + evaluate subprocesses): a sweep end to end and
its resume; the full-span LM row's cells; same seed, same numbers (a cell run beside another on
the same cores from a cold compilation cache vs. run alone from a warm one, killed with -9 and
resumed); and the noise-floor and fine-tune-length benches on the same cells. These are the
suite's most expensive tests, so they live in one module and share one sweep (`swept`):
everything after it reuses its cells."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from t5x_like.runtime import host
from t5x_like.sweep import costs, grid, runner

ROOT = Path(__file__).resolve().parents[2]
T2 = "gin/sweeps/t5_table2_architectures.gin"
ROWS = ("Encoder-decoder | Denoising", "Language model | LM")  # enc-dec; decoder-only, full LM
MICRO = ROOT / "gin" / "sweeps" / "scales" / "micro.gin"
STEPS, BATCH, LOG_EVERY = 20, 8, 5  # pre-training steps, micro's batch


def _sweep(sweep_dir: Path, scale: Path, rows: str, *, seeds: int = 1, parallel: int = 1,
           env: dict[str, str] | None = None, out: Path | None = None,
           archive: Path | None = None) -> str:
    argv = [sys.executable, "-m", "t5x_like.sweep", f"--sweep={T2}", f"--scale={scale}",
            f"--rows={rows}", f"--seeds={seeds}", f"--parallel={parallel}",
            f"--sweep_dir={sweep_dir}", *([f"--out={out}"] if out else []),
            *([f"--archive={archive}"] if archive else [])]
    if env is None:  # the cells' own cache (cold at first), not the test run's shared one
        env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> tuple[Path, Path, str]:
    """(scale file, sweep dir, sweep log): the micro scale with 20 steps and a checkpoint every
    10 (so a run can be killed between checkpoints); both rows x 2 seeds, two cells at a time on
    the two cores, from a cold compilation cache, each finished cell archived in the one file
    `archive.jsonl.gz`."""
    root = tmp_path_factory.mktemp("cells")
    scale = root / "micro_ckpt.gin"
    scale.write_text(f"include '{MICRO}'\n"
                     f"train.num_train_steps = {STEPS}\ntrain.checkpoint_every = 10\n"
                     f"train.keep_checkpoints = 2\ntrain.log_every = {LOG_EVERY}\n"
                     "sweep_scale.name = 'micro_ckpt'\n")
    log = _sweep(root / "sweep", scale, ",".join(ROWS), seeds=2, parallel=2,
                 out=root / "bench" / "t5_tables_micro", archive=root / "archive.jsonl.gz")
    return scale, root / "sweep", log


def _numbers(cell: Path) -> dict:
    """A cell's logged pre-training losses and its downstream results."""
    losses = sorted({r["step"]: r["loss"] for r in runner.read_metrics(str(cell / "pretrain"))
                     if r.get("split") == "train" and "loss" in r}.items())  # resumed: last
    results = json.loads((cell / "results.json").read_text())
    finetune = results["evaluation"]["finetune"]["runs"][0]["final_loss"]
    return {"losses": losses, "tasks": results["tasks"], "finetune_loss": finetune}


def test_sweep_end_to_end_and_a_rerun_from_its_archive_skips_finished_cells(swept):
    _, sweep_dir, log = swept
    cells = sorted(os.listdir(sweep_dir / "cells"))
    assert len(cells) == 4 and log.count(": pre-training") == 4
    assert os.listdir(sweep_dir / runner.XLA_CACHE)  # the cells' shared compilation cache
    for cell in cells:
        results = json.loads((sweep_dir / "cells" / cell / "results.json").read_text())
        assert results["pretrain"]["final_step"] == STEPS
        assert results["pretrain"]["input_tokens"] == STEPS * 8 * 16
        assert set(results["tasks"]) == {"downstream_spam"}
        assert 0.0 <= results["suite_average"] <= 100.0 and results["parameters"] > 0
        assert results["code"] == runner.code_version()  # the commit it ran on
        assert results["host"] == host.describe()  # the machine it ran on
    for name in ("table2.md", "table2.json", "table2.png", "loss_curves.png",
                 "t5_tables_micro_ckpt.md", "t5_tables_micro_ckpt.json"):
        assert (sweep_dir / name).stat().st_size > 0, name
    out = sweep_dir.parent / "bench" / "t5_tables_micro"
    for suffix in (".md", ".json", "_table2.png", "_loss_curves.png"):
        assert os.path.getsize(f"{out}{suffix}") > 0, suffix
    table = json.loads((sweep_dir / "t5_tables_micro_ckpt.json").read_text())["tables"]["table2"]
    done = [r for r in table["rows"] if r["num_seeds"]]
    assert [(r["row"], r["num_seeds"]) for r in done] == [(row, 2) for row in ROWS]
    archive = sweep_dir.parent / "archive.jsonl.gz"
    assert [p.name for p in sweep_dir.parent.glob("archive*")] == [archive.name]  # one file
    archived = runner.read_archive(str(archive))
    assert sorted(archived) == cells
    assert set(archived[cells[0]]) == {  # records only: no checkpoints, no logs
        "cell.json", "results.json", "pretrain/metrics.jsonl", "eval/results.json",
        "eval/predictions/downstream_spam.jsonl"}
    kept = archived[cells[0]]["eval/predictions/downstream_spam.jsonl"]
    full = (sweep_dir / "cells" / cells[0] / runner.PREDICTIONS / "downstream_spam.jsonl")
    assert [json.loads(x) for x in kept.splitlines()] == [
        {k: v for k, v in json.loads(x).items() if k != "inputs"}
        for x in full.read_text().splitlines()]  # the test examples' text is not kept
    assert archived[cells[0]]["results.json"] == (
        sweep_dir / "cells" / cells[0] / "results.json").read_text()
    # A fresh checkout's sweep restores the archived cells: nothing runs, the report is the same.
    fresh = sweep_dir.parent / "fresh"
    log = _sweep(fresh, swept[0], ",".join(ROWS), seeds=2, archive=archive)
    assert "4 finished cells restored" in log and log.count("done, skipped") == 4
    assert ": pre-training" not in log
    again = json.loads((fresh / "t5_tables_micro_ckpt.json").read_text())["tables"]["table2"]
    assert again == table


def test_the_full_span_lm_cell_is_decoder_only_with_the_loss_on_every_token(swept):
    """Table 2's "Language model | LM" row: a decoder-only model trained on the whole span of
    a prefix-LM example, as the paper's LM row, with the prefix LM's parameters and FLOPs."""
    _, sweep_dir, _ = swept
    prefix = grid.expand([grid.load_sweep(T2)], grid.load_scale("micro"),
                         rows=["Prefix LM | LM"])[0]
    measured = costs.measure(prefix.gin_files, prefix.bindings, prefix.sequence_length)
    paths = sorted(sweep_dir.glob("cells/*__full_lm__*"))
    assert len(paths) == 2  # two seeds
    for path in paths:
        results = json.loads((path / runner.RESULTS).read_text())
        assert results["control"] is False and results["rows"] == [["table2", ROWS[1]]]
        config = (path / "pretrain" / "config.gin").read_text()
        assert "TransformerConfig.family = 'decoder_only'" in config
        assert "MIXTURE_OR_TASK_NAME = 'c4like_full_lm'" in config
        assert results["sequence_length"] == {"targets": 2 * 16}  # a prefix-LM example's span
        train = [r for r in runner.read_metrics(str(path / "pretrain")) if r["split"] == "train"]
        assert [r["step"] for r in train] == [1, *range(LOG_EVERY, STEPS + 1, LOG_EVERY)]
        assert all(r["num_tokens"] == BATCH * 2 * 16 for r in train)  # packed: all scored
        # P and M: the prefix LM's parameters and FLOPs per sequence
        assert results["parameters"] == measured["parameters"]
        assert results["flops_per_sequence"] == measured["flops_per_sequence"]


def test_same_numbers_alone_from_a_warm_cache_after_kill_9_and_resume(swept, tmp_path):
    """One of the sweep's cells again, alone, compiling from the sweep's cache, its sweep killed
    (-9, the process group) once pre-training has a checkpoint (or later) and rerun: the cell
    ends with the losses and scores it had beside another cell, uninterrupted and compiling
    anew; and no train step was compiled anew here. (Whichever of the three broke it, the
    numbers would differ.)"""
    scale, sweep_dir, _ = swept
    cache = sweep_dir / runner.XLA_CACHE
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}

    def steps() -> set[str]:
        return {f for f in os.listdir(cache) if f.startswith("jit_step")}

    cached = steps()
    argv = [sys.executable, "-m", "t5x_like.sweep", f"--sweep={T2}", f"--scale={scale}",
            f"--rows={ROWS[0]}", f"--sweep_dir={tmp_path}"]
    run = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True, env=env, cwd=ROOT)
    deadline = time.time() + 300
    while not list(tmp_path.glob("cells/*/pretrain/checkpoints/*10*")) and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    (cell,) = os.listdir(tmp_path / "cells")
    assert not (tmp_path / "cells" / cell / "results.json").exists()  # it was interrupted
    _sweep(tmp_path, scale, ROWS[0], env=env)
    assert cached and steps() == cached  # the train steps came from the cache
    reference = _numbers(sweep_dir / "cells" / cell)
    assert len(reference["losses"]) >= 3 and reference["tasks"]
    assert _numbers(tmp_path / "cells" / cell) == reference


def _noise_floor(scale: Path, sweep_dir: Path, out: Path) -> dict:
    rows = ",".join(f"table2:{row}" for row in ROWS)
    argv = [sys.executable, str(ROOT / "scripts" / "bench_noise_floor.py"), f"--scale={scale}",
            "--seeds=2", f"--rows={rows}", f"--sweep_dir={sweep_dir}", f"--out={out}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.with_suffix(".json").read_text())


def test_noise_floor_bench_reuses_the_cells_and_separates_fine_tuning_seeds(swept, tmp_path):
    scale, sweep_dir, _ = swept
    logs = sorted(sweep_dir.glob("cells/*/*.log"))
    before = {p: p.stat().st_size for p in logs}
    data = _noise_floor(scale, sweep_dir, tmp_path / "noise")
    assert {p: p.stat().st_size for p in logs} == before  # the sweep's cells were reused
    assert data["seeds"] == 2 and list(data["rows"]) == [f"table2:{row}" for row in ROWS]
    for name, row in data["rows"].items():
        sweep, finetune = row["sweep_seeds"], row["finetune_seeds"]
        assert len(sweep["suite"]["values"]) == len(finetune["suite"]["values"]) == 2, name
        # both sets start from the sweep's own seed-0 cell
        assert sweep["suite"]["values"][0] == finetune["suite"]["values"][0]
        a, b = sweep["suite"]["std"], finetune["suite"]["std"]
        assert abs(row["pretrain_seed_std"]["suite"] ** 2 - max(0.0, a * a - b * b)) < 1e-6
        assert row["test_sample_std"]["suite"] > 0
        t = row["seconds_per_cell"]
        assert row["timed_cells"] == 2 and t["pretrain_steps"] > 0 and t["scoring"] > 0
        parts = t["pretrain_steps"] + t["pretrain_rest"] + t["finetune"] + t["scoring"]
        assert abs(parts + t["evaluate_rest"] - t["total"]) < 1.0
        # the extra fine-tune really ran with seed 1 on the seed-0 checkpoint
        cell = sweep_dir / "cells" / row["cells"][0]
        config = (cell / "eval_ft1" / "finetune" / "downstream_spam" / "config.gin").read_text()
        assert "train.seed = 1" in config
        assert str(cell / "pretrain") in config
    d = data["difference"]
    assert d["ci"][0] <= d["ci"][1] and d["rows"] == list(data["rows"])
    md = (tmp_path / "noise.md").read_text()
    assert "std, fine-tuning seeds" in md and data["machine"] in md
    assert "Where a cell's time goes" in md and "cells run one at a time" in md  # the bench's
    # a rerun reuses every finished cell and fine-tune
    logs = sorted(sweep_dir.glob("cells/*/*.log"))  # now with the extra fine-tunes' logs
    assert len(logs) > len(before)
    before = {p: p.stat().st_size for p in logs}
    again = _noise_floor(scale, sweep_dir, tmp_path / "noise")
    assert {p: p.stat().st_size for p in logs} == before
    assert again["rows"] == data["rows"]


def test_finetune_steps_bench_reevaluates_longer_and_reuses(swept, tmp_path):
    """scripts/bench_finetune_steps.py: the scale's own length is the sweep's evaluation, a
    longer one fine-tunes the same checkpoints again (and only that), a rerun reuses it."""
    _, sweep_dir, _ = swept
    out = tmp_path / "ft"
    argv = [sys.executable, str(ROOT / "scripts" / "bench_finetune_steps.py"),
            f"--sweep_dir={sweep_dir}", "--steps=4,8", "--cells=*__s0__*",
            "--tasks=downstream_spam", f"--out={out}",
            f"--compare=table2: {ROWS[0]}::table2: {ROWS[1]}"]

    def bench() -> dict:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False,
                              cwd=ROOT)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return json.loads(out.with_suffix(".json").read_text())

    data = bench()
    assert data["steps"] == [4, 8] and len(data["cells"]) == 2
    for cell_id, cell in data["cells"].items():
        assert cell["4"]["dir"] == "eval" and cell["8"]["dir"] == "eval_steps8"
        ft = sweep_dir / "cells" / cell_id / "eval_steps8" / "finetune" / "downstream_spam"
        assert "train.num_train_steps = 8" in (ft / "config.gin").read_text()
        assert runner.read_metrics(str(ft))[-1]["step"] == 8
        results = json.loads((ft.parents[1] / "results.json").read_text())
        assert list(results["tasks"]) == ["downstream_spam"]
        assert cell["8"]["tasks"]["downstream_spam"]["score"] == results["tasks"][
            "downstream_spam"]["score"]
    spam = data["summary"]["downstream_spam"]
    lo, hi = spam["8"]["ci"]
    assert lo <= spam["8"]["difference"] <= hi
    assert 0 <= spam["8"]["collapsed"] <= 2 and spam["best_constant"] > 0
    assert {r: e["cells"] for r, e in data["rows"].items()} == {f"table2: {r}": 1 for r in ROWS}
    d = data["difference"]
    for n in ("4", "8"):  # one cell per row: the row means are those cells' scores
        scores = [data["rows"][f"table2: {r}"][n]["mean"] for r in ROWS]
        assert abs(d[n]["difference"] - (scores[0] - scores[1])) < 1e-9
        assert d[n]["ci"][0] <= d[n]["difference"] <= d[n]["ci"][1]
    assert "| spam |" in out.with_suffix(".md").read_text()
    logs = sorted(sweep_dir.glob("cells/*/eval_steps8.log"))
    before = {p: p.stat().st_size for p in logs}
    assert len(logs) == 2 and bench()["cells"] == data["cells"]
    assert {p: p.stat().st_size for p in logs} == before


def test_finetune_steps_bench_adds_a_task_the_scale_left_out(swept, tmp_path):
    """At the scale's own length, a suite task the sweep did not evaluate (word order) is
    fine-tuned anew from the same checkpoint (one cell's); a task outside the suite is
    refused."""
    _, sweep_dir, _ = swept
    out = tmp_path / "wo"
    argv = [sys.executable, str(ROOT / "scripts" / "bench_finetune_steps.py"),
            f"--sweep_dir={sweep_dir}", "--steps=4", "--cells=*__full_lm__s0__*", f"--out={out}"]
    proc = subprocess.run([*argv, "--tasks=downstream_word_order"], capture_output=True,
                          text=True, timeout=600, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.with_suffix(".json").read_text())
    assert len(data["cells"]) == 1
    for cell_id, cell in data["cells"].items():
        assert cell["4"]["dir"] == "eval_steps4_word_order"
        results = json.loads((sweep_dir / "cells" / cell_id / "eval_steps4_word_order"
                              / "results.json").read_text())
        assert list(results["tasks"]) == ["downstream_word_order"]
        assert 0 <= cell["4"]["tasks"]["downstream_word_order"]["score"] <= 100
    bad = subprocess.run([*argv, "--tasks=downstream_wordorder"], capture_output=True,
                         text=True, timeout=600, check=False, cwd=ROOT)
    assert bad.returncode != 0 and "not in the downstream suite" in bad.stderr


def test_a_pretraining_stopped_by_a_signal_is_not_evaluated(tmp_path):
    """The trainer exits 0 after saving on SIGTERM; the runner must not take that checkpoint
    for the cell's model (it checks the last step against the run's own config.gin)."""
    model_dir = tmp_path / "pretrain"
    (model_dir / "checkpoints" / "40").mkdir(parents=True)
    (model_dir / "config.gin").write_text("train.num_train_steps = 100\n")
    with pytest.raises(runner.CellFailed, match="stopped at step 40 of 100"):
        runner._check_finished(str(model_dir), "cell")
    (model_dir / "checkpoints" / "100").mkdir()
    runner._check_finished(str(model_dir), "cell")  # finished: no error
