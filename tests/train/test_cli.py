"""`python -m t5x_like.train` flags and gin errors: bad configs fail fast, naming the binding."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import gin
import pytest

from t5x_like import gin_utils
from t5x_like.train import cli
from tests.train.conftest import REPO, TINY_MODEL_BINDINGS, subprocess_env


def test_split_gin_flags_turns_dotted_flags_into_bindings() -> None:
    rest, bindings = gin_utils.split_gin_flags(
        ["--gin_file=a.gin", "--gin.train.batch_size=64", "--gin.train.task", "'x'", "--model_dir",
         "d"])
    assert rest == ["--gin_file=a.gin", "--model_dir", "d"]
    assert bindings == ["train.batch_size=64", "train.task='x'"]
    with pytest.raises(gin_utils.ConfigError, match="no value"):
        gin_utils.split_gin_flags(["--gin.train.seed"])


@pytest.mark.parametrize(
    ("flag", "expected", "suggestion"),
    [
        ("--gin.train.num_train_stepz=5", "'train' doesn't have a parameter named 'num_train_st",
         "Did you mean 'num_train_steps'?"),
        ("--gin.trian.batch_size=5", "No configurable matching 'trian'", "Did you mean 'train'?"),
        ("--gin.create_optimizer.nmae='adamw'", "parameter named 'nmae'", "Did you mean 'name'?"),
    ],
)
def test_unknown_or_misspelled_binding_fails_before_compute_suggesting_the_closest_name(
        tmp_path, capsys, flag, expected, suggestion) -> None:
    rc = cli.main(["--gin_file=gin/runs/quickstart.gin", f"--model_dir={tmp_path / 'm'}", flag])
    err = capsys.readouterr().err
    assert rc == 2
    assert expected in err
    assert suggestion in err
    assert not (tmp_path / "m").exists()  # nothing ran


def test_missing_required_binding_is_named(tmp_path, capsys) -> None:
    rc = cli.main(["--gin_file=gin/runs/finetune.gin", f"--model_dir={tmp_path / 'm'}"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "init_params_path" in err
    assert not (tmp_path / "m").exists()


def test_every_missing_binding_is_named_at_once(tmp_path, capsys) -> None:
    """Unbound gin.REQUIRED parameters and ones a file binds to %gin.REQUIRED, in one line."""
    config = tmp_path / "partial.gin"
    config.write_text("train.task = 'c4like_span_corruption'\n"
                      "train.num_train_steps = %gin.REQUIRED\n"
                      "train.init_params_path = %gin.REQUIRED\n")
    rc = cli.main([f"--gin_file={config}", f"--model_dir={tmp_path / 'm'}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err == ("error: missing required gin binding: train.model, train.sequence_length, "
                   "train.num_train_steps, train.init_params_path")
    assert not (tmp_path / "m").exists()


def test_missing_gin_file_is_reported(capsys) -> None:
    assert cli.main(["--gin_file=gin/runs/nope.gin"]) == 2
    assert "gin file not found: gin/runs/nope.gin" in capsys.readouterr().err


def test_module_entry_point_help_and_error_exit_codes(tmp_path) -> None:
    env = subprocess_env(1)
    out = subprocess.run([sys.executable, "-m", "t5x_like.train", "--help"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--gin_file" in out.stdout and "--gin.KEY=VALUE" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "t5x_like.train", "--gin_file=gin/runs/quickstart.gin",
         f"--model_dir={tmp_path}", "--gin.train.batchsize=3"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "batchsize" in bad.stderr
    assert not os.listdir(tmp_path)


def test_unquoted_gin_string_says_strings_need_quotes(tmp_path, capsys) -> None:
    rc = cli.main(["--gin_file=gin/runs/quickstart.gin", f"--model_dir={tmp_path / 'm'}",
                   "--gin.train.task=c4like_prefix_lm"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.splitlines()[0] == (
        "error: invalid gin binding train.task=c4like_prefix_lm: gin strings need quotes: "
        "--gin.train.task=\"'c4like_prefix_lm'\" on the command line, "
        "train.task = 'c4like_prefix_lm' in a gin file")
    assert "ast.Name" not in err
    assert not (tmp_path / "m").exists()


def test_unquoted_string_in_a_gin_file_gets_a_hint(tmp_path) -> None:
    bad = tmp_path / "bad.gin"
    bad.write_text("train.task = c4like_prefix_lm\n", encoding="utf-8")
    with pytest.raises(gin_utils.ConfigError, match="gin strings need quotes: 'c4like_prefix_lm'"):
        gin_utils.parse_gin(["gin/runs/quickstart.gin", str(bad)], [])


def test_commands_work_outside_the_repository(tmp_path) -> None:
    """`make install` installs the package (editable): `python -m t5x_like.*` needs no cwd or
    PYTHONPATH, as the sweep's printed cluster commands assume."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "t5x_like.train", "--help"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--gin_file" in done.stdout


def test_includes_resolve_from_any_directory_without_error_lines(tmp_path, monkeypatch,
                                                                  caplog) -> None:
    """quickstart.gin includes gin/runs/pretrain.gin and gin/models/tiny.gin: from another
    directory gin resolves them through the repo root, without its "Path not found" ERRORs for
    the prefixes it tried first; an include found nowhere is still an error naming it."""
    monkeypatch.chdir(tmp_path)
    gin_utils.parse_gin([str(REPO / "gin" / "runs" / "quickstart.gin")], [])
    assert gin.query_parameter("TransformerConfig.num_encoder_layers") == 2  # from tiny.gin
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
    (tmp_path / "bad.gin").write_text("include 'gin/models/no_such_model.gin'\n")
    with pytest.raises(gin_utils.ConfigError, match="no_such_model.gin"):
        gin_utils.parse_gin([str(tmp_path / "bad.gin")], [])


@pytest.mark.parametrize(
    ("bindings", "expected"),
    [
        (["train.num_train_steps=-5"], "train.num_train_steps=-5 must be >= 0"),
        (["train.batch_size=0"], "train.batch_size=0 must be >= 1"),
        (["train.batch_size=12"], "train.batch_size=12 not divisible by the 8 batch shards"),
        (["train.task='c4like_span_corruptoin'"], "Did you mean: c4like_span_corruption"),
        # the eval recipe (gin/runs/eval.gin) pointed at a directory without a checkpoint
        (["train.num_train_steps=0", "train.eval_every=1"], "has no checkpoint to evaluate"),
        # c4like_8k has 8000 pieces + 100 sentinel ids
        (["TransformerConfig.vocab_size=4096"],
         "has 8100 ids (with sentinels) but the model's embedding has "
         "TransformerConfig.vocab_size=4096 rows"),
        # a value the model or optimizer does not know
        (["TransformerConfig.flash_backend='bogus'"],
         "TransformerConfig.flash_backend='bogus'; expected one of ('auto', 'triton'"),
        (["TransformerConfig.attention_impl='flash'"], "attention_impl='flash'; expected one of"),
        (["create_optimizer.name='sgdd'"], "create_optimizer.name='sgdd'; choose one of"),
    ],
)
def test_bad_run_settings_fail_before_compute(tmp_path, capsys, bindings, expected) -> None:
    flags = [f"--gin.{b}" for b in bindings]
    rc = cli.main(["--gin_file=gin/runs/quickstart.gin", f"--model_dir={tmp_path / 'm'}", *flags])
    err = capsys.readouterr().err
    assert rc == 2
    assert expected in err
    assert "Traceback" not in err
    assert not (tmp_path / "m").exists()  # nothing was written


@pytest.mark.parametrize(
    ("bindings", "expected"),
    [
        (["train.batch_size='16'"], "train.batch_size='16' has type str, expected int"),
        (["train.num_train_steps=5.0"], "train.num_train_steps=5.0 has type float, expected int"),
        (["TransformerConfig.emb_dim='a'"],
         "TransformerConfig.emb_dim='a' has type str, expected int"),
        (["train.sequence_length={'inputs': 32, 'targets': 8.5}"],
         "expected a mapping of str to int"),
        (["MIXTURE_OR_TASK_NAME=3"], "train.task=3 has type int, expected str"),  # via a macro
        (["train.keep_checkpoints='3'"], "expected int or None"),
    ],
)
def test_bindings_of_the_wrong_type_fail_before_anything_is_written(
        tmp_path, capsys, bindings, expected) -> None:
    rc = cli.main(["--gin_file=gin/runs/quickstart.gin", f"--model_dir={tmp_path / 'm'}",
                   *[f"--gin.{b}" for b in bindings]])
    err = capsys.readouterr().err
    assert rc == 2 and expected in err and "Traceback" not in err, err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    ("bindings", "expected"),
    [
        (["train.checkpoint_every=0"], "train.checkpoint_every=0 must be >= 1"),
        (["train.log_every=-1"], "train.log_every=-1 must be >= 1"),
        (["train.keep_checkpoints=0"], "train.keep_checkpoints=0 must be >= 1"),
        (["train.eval_every=-1"], "train.eval_every=-1 must be >= 0 (0 = never)"),
        (["train.num_microbatches=3"],
         "train.batch_size=32 is not divisible by train.num_microbatches=3"),
        (["train.sequence_length={'inputs': 0, 'targets': 8}"], "needs a length >= 1"),
    ],
)
def test_counts_out_of_range_fail_before_anything_is_written(
        tmp_path, capsys, bindings, expected) -> None:
    rc = cli.main(["--gin_file=gin/runs/quickstart.gin", f"--model_dir={tmp_path / 'm'}",
                   *[f"--gin.{b}" for b in bindings]])
    err = capsys.readouterr().err
    assert rc == 2 and expected in err and "Traceback" not in err, err
    assert not (tmp_path / "m").exists()


def test_fewer_steps_than_the_run_has_done_is_refused_and_config_kept(tmp_path, capsys) -> None:
    """A run already at step 200 asked for 50 steps: nothing to do, and config.gin still
    describes the run that trained (a step directory is all the check reads)."""
    (tmp_path / "m" / "checkpoints" / "200").mkdir(parents=True)
    (tmp_path / "m" / "config.gin").write_text("train.num_train_steps = 200\n")
    rc = cli.main(["--gin_file=gin/runs/quickstart.gin", f"--model_dir={tmp_path / 'm'}",
                   "--gin.train.num_train_steps=50"])
    err = capsys.readouterr().err
    assert rc == 2 and "train.num_train_steps=50 but the run resumes at step 200" in err, err
    assert (tmp_path / "m" / "config.gin").read_text() == "train.num_train_steps = 200\n"


def test_a_model_dir_another_run_holds_is_refused_naming_it(tmp_path, capsys) -> None:
    from t5x_like.train.model_dir_lock import ModelDirLock

    with ModelDirLock(str(tmp_path / "m")):  # this process plays the other run
        rc = cli.main(["--gin_file=gin/runs/quickstart.gin", f"--model_dir={tmp_path / 'm'}"])
    err = capsys.readouterr().err
    assert rc == 2 and f"is in use by another run: pid {os.getpid()} on host" in err, err
    assert sorted(os.listdir(tmp_path / "m")) == [".lock"]  # the second run wrote nothing


def test_model_dir_below_a_file_fails_before_compute(tmp_path, capsys) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    rc = cli.main(["--gin_file=gin/runs/quickstart.gin", f"--model_dir={blocker / 'run'}"])
    err = capsys.readouterr().err
    assert rc == 2 and f"{blocker} is a file, not a directory" in err and "Traceback" not in err
    assert blocker.read_text() == "not a directory"


def _read_only_directory(tmp_path: Path) -> Path | None:
    """A directory this process cannot write: chmod 0555 (not for root, who writes anywhere), else
    a read-only mount from /proc/mounts, else None."""
    if os.geteuid() != 0:
        ro = tmp_path / "read_only"
        ro.mkdir(mode=0o555)
        return ro
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 3 and "ro" in fields[3].split(",") and os.path.isdir(fields[1]):
            return Path(fields[1])
    return None


def test_read_only_model_dir_fails_before_compute(tmp_path, capsys) -> None:
    read_only = _read_only_directory(tmp_path)
    if read_only is None:
        pytest.skip("running as root and no read-only mount to try: root writes anywhere")
    before = sorted(os.listdir(read_only))
    rc = cli.main(["--gin_file=gin/runs/quickstart.gin", f"--model_dir={read_only / 'run' / 'a'}"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"(its ancestor {read_only}) is not writable" in err and "Traceback" not in err
    assert sorted(os.listdir(read_only)) == before


def test_saved_config_names_the_model_dir_absolutely(tmp_path, monkeypatch) -> None:
    """The eval recipe reads <run>/config.gin from any working directory."""
    monkeypatch.chdir(tmp_path)
    # A long path: gin wraps long values onto a continuation line.
    rel = "rel_run_" + "x" * 80
    rc = cli.main(["--gin_file=gin/runs/quickstart.gin", f"--gin.train.model_dir='{rel}'",
                   "--gin.train.num_train_steps=1", "--gin.train.batch_size=8",
                   "--gin.train.sequence_length={'inputs': 32, 'targets': 8}",
                   "--gin.train.checkpoint_every=1", "--gin.train.tensorboard=False",
                   *[f"--gin_bindings={b}" for b in TINY_MODEL_BINDINGS]])
    assert rc == 0
    text = (tmp_path / rel / "config.gin").read_text(encoding="utf-8")
    assert f"train.model_dir = {str(tmp_path / rel)!r}" in text
    gin.clear_config()  # the saved config parses, naming the run's directory
    gin_utils.parse_gin([str(tmp_path / rel / "config.gin")], [])
    assert gin.query_parameter("train.model_dir") == str(tmp_path / rel)
    # ... also in a fresh process, where only the CLI's own imports have registered the
    # configurables (the data layer's Objective / denoise bindings are in every saved config).
    assert "denoise." in text
    code = ("import sys; from t5x_like import gin_utils; "
            "gin_utils.parse_gin([sys.argv[1]], []); print('parsed')")
    fresh = subprocess.run([sys.executable, "-c", code, str(tmp_path / rel / "config.gin")],
                           capture_output=True, text=True, env=subprocess_env(1), cwd=REPO)
    assert fresh.stdout.strip() == "parsed", fresh.stderr[-2000:]


# The "bad inputs" table of docs/training.md, checked against the CLI: each row's flags are run
# and every literal piece of its backticked messages (split at `...`, `DIR`, `N` and `<...>`
# placeholders) must be in what the user sees. Rows about corrupt checkpoints need a trained run;
# their messages are asserted by tests/train/test_corrupt_checkpoints.py, so here they must appear
# in that file.
_TABLE_ROWS = {
    "`--gin.train.batchsize=8`": [["--gin.train.batchsize=8"], ["--gin.trian.task='x'"]],
    "`--gin.train.task=c4like_prefix_lm`": [["--gin.train.task=c4like_prefix_lm"]],
    "a missing gin file": [["--gin_file=gin/runs/nope.gin"],
                           ["--gin_file=gin/runs/finetune.gin"]],
    "`train.num_train_steps=-5`": [["--gin.train.num_train_steps=-5"],
                                   ["--gin.train.batch_size=0"], ["--gin.train.batch_size=12"]],
    "`gin/runs/eval.gin`": [["--gin_file=gin/runs/eval.gin"]],
    "an unknown task": [["--gin.train.task='c4like_span_corruptoin'"]],
    "a model dir that cannot be written": ["read_only", "below_a_file"],
    "a model or optimizer setting it does not know": [
        ["--gin.TransformerConfig.flash_backend='bogus'"], ["--gin.create_optimizer.name='sgdd'"]],
    "a vocabulary larger than the embedding": [["--gin_file=gin/models/tiny.gin",
                                                "--gin_file=gin/runs/pretrain.gin",
                                                "--gin.train.task='c4like_span_corruption'"]],
    "`--gin.train.batch_size=\"'16'\"`": [["--gin.train.batch_size='16'"],
                                          ["--gin.train.num_train_steps=5.0"]],
    "`train.checkpoint_every=0`": [["--gin.train.checkpoint_every=0"],
                                   ["--gin.train.num_microbatches=3"]],
    "`--gin.train.num_train_steps=50` on a run": ["at_step_200"],
    "a model dir another run is using": ["locked"],
}
#: Rows whose messages need a trained run or a full disk: asserted by these test files.
_ROWS_TESTED_ELSEWHERE = {"the newest checkpoint unreadable": "test_corrupt_checkpoints.py",
                          "`train.restore_step=N`": "test_corrupt_checkpoints.py",
                          "a full disk": "test_write_failures.py"}


def _bad_inputs_table() -> list[tuple[str, list[str]]]:
    lines = (REPO / "docs" / "training.md").read_text().splitlines()
    start = lines.index("| input | what you see |") + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        what, seen = line.strip("|").split(" | ", 1)
        pieces = [p.strip() for span in seen.split("`")[1::2]
                  for p in re.split(r"\.\.\.|\bDIR\b|\bN\b|<[^>]+>", span)]
        rows.append((what.strip(), [p for p in pieces if len(p) > 1]))
    return rows


def test_docs_bad_inputs_table_matches_the_cli(tmp_path, capsys) -> None:
    from t5x_like.train.model_dir_lock import ModelDirLock

    rows = _bad_inputs_table()
    assert len(rows) == len(_TABLE_ROWS) + len(_ROWS_TESTED_ELSEWHERE)
    for i, (what, pieces) in enumerate(rows):
        elsewhere = [f for key, f in _ROWS_TESTED_ELSEWHERE.items() if what.startswith(key)]
        if elsewhere:
            text = (REPO / "tests" / "train" / elsewhere[0]).read_text()
            assert all(p in text for p in pieces), (what, pieces)
            continue
        [runs] = [r for key, r in _TABLE_ROWS.items() if what.startswith(key)]
        seen = ""
        for j, run in enumerate(runs):
            model_dir = tmp_path / f"m{i}_{j}"
            lock = ModelDirLock(str(model_dir))
            if run == "at_step_200":
                (model_dir / "checkpoints" / "200").mkdir(parents=True)
                run = ["--gin.train.num_train_steps=50"]
            elif run == "locked":
                lock.acquire()
                run = []
            elif run == "read_only":
                read_only = _read_only_directory(tmp_path)
                if read_only is None:
                    pytest.skip("running as root and no read-only mount to try")
                model_dir, run = read_only / "run", []
            elif run == "below_a_file":
                (tmp_path / "a_file").write_text("")
                model_dir, run = tmp_path / "a_file" / "run", []
            gin.clear_config()
            try:
                assert cli.main(["--gin_file=gin/runs/quickstart.gin",
                                 f"--model_dir={model_dir}", *run]) == 2, (what, run)
            finally:
                lock.release()
            seen += capsys.readouterr().err
        missing = [p for p in pieces if p not in seen]
        assert not missing, f"docs/training.md row {what!r}: {missing} not in:\n{seen}"
