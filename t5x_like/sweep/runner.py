"""Run cells: `python -m t5x_like.train` then `python -m t5x_like.evaluate` as subprocesses.

A cell dir, `<sweep_dir>/cells/<cell_id>/`, holds `cell.json` (what to run, written first),
`pretrain/` + `pretrain.log` (the trainer's model dir), `eval/` + `eval.log` (evaluate's out dir)
and `results.json`, written last (atomically): the cell is done and a rerun skips it; an
interrupted one resumes from its last checkpoint and finished fine-tunes. A control cell
(`Cell.control`) is initialised (`init_model`), not pre-trained. Each cell first runs
`data.prepare` (a no-op when current). Cells run in `run_order`, sharing one XLA compilation
cache, `<sweep_dir>/xla_cache`.

An archive (`--archive`) keeps finished cells' `RECORDS` (no checkpoints), restored before a sweep
runs and added to as each cell finishes, so a sweep spread over sessions runs each cell once: an
`ARCHIVE_SUFFIX` file (byte-stable gzip'd JSON Lines `{"cell_id", "files": {path: text}}`) or a
directory of `cells/<cell_id>/` (the earlier layout; see `pack`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fcntl
import gzip
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from t5x_like.data import assets
from t5x_like.data import prepare as data_prepare
from t5x_like.runtime import host, hugepages
from t5x_like.sweep import costs, grid
from t5x_like.sweep.config import ScaleSpec
from t5x_like.sweep.grid import Cell

RESULTS = "results.json"
CELL_SPEC = "cell.json"
XLA_CACHE = "xla_cache"
# What a finished cell is to the report (results last: copied, it marks the copy done).
PREDICTIONS = os.path.join("eval", "predictions")
RECORDS = (CELL_SPEC, os.path.join("pretrain", "metrics.jsonl"),
           os.path.join("eval", "results.json"), PREDICTIONS, RESULTS)
#: The fields of a test prediction an archive keeps (the report's bootstrap reads the first two;
#: the input text, ~95% of the bytes, is the test split's, in the same order).
PREDICTION_FIELDS = ("targets", "output", "score")
#: An `--archive` path ending in this is one file; any other is a directory (`cells/<id>/`).
ARCHIVE_SUFFIX = ".jsonl.gz"
_PRINT_LOCK = threading.Lock()
_ARCHIVE_LOCK = threading.Lock()


class CellFailed(RuntimeError):
    """A cell's train or evaluate subprocess exited non-zero (the message names its log)."""


def cell_dir(sweep_dir: str, cell: Cell) -> str:
    """`<sweep_dir>/cells/<cell_id>`."""
    return os.path.join(sweep_dir, "cells", cell.cell_id)


def is_done(path: str) -> bool:
    """A cell dir holding results.json is finished."""
    return os.path.exists(os.path.join(path, RESULTS))


def _slim_predictions(source: str) -> str:
    """A predictions .jsonl's text keeping `PREDICTION_FIELDS` of each line."""
    with open(source, encoding="utf-8") as f:
        return "".join(json.dumps({k: row[k] for k in PREDICTION_FIELDS if k in row}) + "\n"
                       for row in map(json.loads, filter(str.strip, f)))


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def _write_atomic(path: str, data: bytes) -> None:
    """Write `path` through a temporary file and a rename: readers never see half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def cell_records(path: str, slim: bool = True) -> dict[str, str]:
    """A cell dir's `RECORDS` as {'/'-separated path: text}; `slim`: only `PREDICTION_FIELDS`."""
    records = {}
    for rel in RECORDS:
        source, key = os.path.join(path, rel), rel.replace(os.sep, "/")
        if rel == PREDICTIONS and os.path.isdir(source):
            for name in sorted(os.listdir(source)):
                file = os.path.join(source, name)
                records[f"{key}/{name}"] = _slim_predictions(file) if slim else _read_text(file)
        elif os.path.isfile(source):
            records[key] = _read_text(source)
    return records


def write_records(records: Mapping[str, str], dst: str) -> None:
    """Write `cell_records` into cell dir `dst`, each file atomically and results.json last."""
    for rel in sorted(records, key=lambda r: r == RESULTS):
        parts = rel.split("/")
        if ".." in parts or "" in parts:  # ('' also: an absolute path)
            raise ValueError(f"archived file {rel!r} is not a relative path inside its cell")
        target = os.path.join(dst, *parts)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _write_atomic(target, records[rel].encode())


def is_archive_file(archive: str) -> bool:
    """An `--archive` path names one file (`ARCHIVE_SUFFIX`), not a directory of cell dirs."""
    return archive.endswith(ARCHIVE_SUFFIX)


def read_archive(archive: str) -> dict[str, dict[str, str]]:
    """cell_id -> {relative path: text} of an archive's finished cells ({} when it is missing)."""
    if not is_archive_file(archive):
        root = os.path.join(archive, "cells")
        names = sorted(os.listdir(root)) if os.path.isdir(root) else []
        return {n: cell_records(os.path.join(root, n), slim=False) for n in names
                if is_done(os.path.join(root, n))}
    if not os.path.exists(archive):
        return {}
    cells = {}
    with gzip.open(archive, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                cell_id, files = entry["cell_id"], entry["files"]
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{archive}:{number}: not an archived cell ({err})") from err
            if not isinstance(files, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
                raise ValueError(f"{archive}:{number}: 'files' must map paths to text")
            if RESULTS in files:  # finished
                cells[cell_id] = files
    return cells


def write_archive(archive: str, cells: Mapping[str, Mapping[str, str]]) -> None:
    """Write an archive file atomically, byte-stable: sorted JSON lines, gzip with no name/time."""
    lines = "".join(json.dumps({"cell_id": cell_id, "files": dict(files)}, sort_keys=True) + "\n"
                    for cell_id, files in sorted(cells.items()))
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=9, mtime=0) as out:
        out.write(lines.encode())
    os.makedirs(os.path.dirname(os.path.abspath(archive)), exist_ok=True)
    _write_atomic(archive, buffer.getvalue())


def _merge_into(archive: str, cells: Mapping[str, Mapping[str, str]]) -> int:
    """Add `cells` to the archive file (replacing earlier copies) under this process's lock and
    an flock on its directory (two sweeps sharing it keep each other's cells); returns its count."""
    folder = os.path.dirname(os.path.abspath(archive))
    os.makedirs(folder, exist_ok=True)
    with _ARCHIVE_LOCK:
        fd = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            merged = {**read_archive(archive), **cells}
            write_archive(archive, merged)
        finally:
            os.close(fd)
    return len(merged)


def archive_cell(archive: str, path: str) -> None:
    """Add finished cell dir `path` to `archive` (replacing an earlier copy), predictions slim."""
    cell_id, records = os.path.basename(os.path.normpath(path)), cell_records(path)
    if is_archive_file(archive):
        _merge_into(archive, {cell_id: records})
    else:
        write_records(records, os.path.join(archive, "cells", cell_id))


def pack(directory: str, archive: str) -> int:
    """Add the finished cells of an archive directory to the archive file; returns its count."""
    return _merge_into(archive, read_archive(directory))


def unpack(archive: str, directory: str, cell_ids: Sequence[str] | None = None) -> list[str]:
    """Write archived cells (`cell_ids`, default all) as `<directory>/cells/<id>/`; their ids."""
    cells = read_archive(archive)
    chosen = sorted(cells) if cell_ids is None else [c for c in cell_ids if c in cells]
    for cell_id in chosen:
        write_records(cells[cell_id], os.path.join(directory, "cells", cell_id))
    return chosen


def restore(cells: Sequence[Cell], archive: str, sweep_dir: str) -> int:
    """Copy every cell finished in `archive` but not in `sweep_dir` there, as archived; count."""
    todo = [c.cell_id for c in cells if not is_done(cell_dir(sweep_dir, c))]
    return len(unpack(archive, sweep_dir, todo))


def code_version() -> str | None:
    """The commit of this checkout (`+dirty` when tracked files differ from it), or None outside
    git: a sweep's cells may run over days and checkouts, so each records the code it ran."""
    try:
        head, dirty = (subprocess.run(["git", "-C", grid.REPO_ROOT, *argv], capture_output=True,
                                      text=True, check=True, timeout=60).stdout.strip()
                       for argv in (["rev-parse", "--short=12", "HEAD"],
                                    ["status", "--porcelain", "--untracked-files=no"]))
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def train_command(spec: Mapping[str, Any], path: str) -> list[str]:
    """The `python -m t5x_like.train` argv of a cell spec (a cell.json: `prepare`)."""
    return [sys.executable, "-m", "t5x_like.train", *[f"--gin_file={f}" for f in spec["gin_files"]],
            *[f"--gin_bindings={b}" for b in spec["bindings"]],
            f"--model_dir={os.path.join(path, 'pretrain')}", *spec["scale"]["train_flags"]]


def evaluate_command(spec: Mapping[str, Any], path: str, out: str = "eval",
                     finetune_seed: int | None = None, extra: Sequence[str] = ()) -> list[str]:
    """The `python -m t5x_like.evaluate` argv of a cell spec, writing to `path/out`. The
    fine-tuning seed is `finetune_seed` when given, else `gin/runs/finetune.gin`'s 0 for every
    cell (a cell's `seed` varies only its pre-training or initialisation). `extra`: flags
    (`--...`) and gin bindings appended last, so they win over the scale's."""
    scale = spec["scale"]
    seed = [] if finetune_seed is None else [f"train.seed = {int(finetune_seed)}"]
    flags = [e for e in extra if e.startswith("--")]
    bindings = [e for e in extra if not e.startswith("--")]
    return [sys.executable, "-m", "t5x_like.evaluate",
            f"--checkpoint={os.path.join(path, 'pretrain')}",
            f"--out_dir={os.path.join(path, out)}", *scale["evaluate_flags"], *flags,
            *[f"--gin_file={f}" for f in scale["evaluate_gin_files"]],
            *[f"--gin_bindings={b}" for b in [*scale["evaluate_bindings"], *seed, *bindings]]]


def write_json(path: str, data: Any) -> None:
    """Write JSON (indent 1, a final newline) atomically: readers never see half a file."""
    _write_atomic(path, (json.dumps(data, indent=1) + "\n").encode())


def prepare(cell: Cell, scale: ScaleSpec, sweep_dir: str) -> str:
    """Write the cell dir's cell.json, all `cell` needs to run (rows merged with an existing
    one's; `control` only when true, as archived cell.json files have it); returns the dir."""
    path = cell_dir(sweep_dir, cell)
    os.makedirs(path, exist_ok=True)
    spec = {k: v for k, v in dataclasses.asdict(cell).items() if k != "control" or v}
    spec["rows"] = [list(r) for r in cell.rows]
    spec["scale"] = dataclasses.asdict(scale)
    spec_path = os.path.join(path, CELL_SPEC)
    if os.path.exists(spec_path):
        old_rows = json.loads(_read_text(spec_path)).get("rows", [])
        spec["rows"] = [*spec["rows"], *[r for r in old_rows if r not in spec["rows"]]]
    write_json(spec_path, spec)
    return path


def child_env(cache_dir: str | None = None) -> dict[str, str]:
    """A cell subprocess's environment: ours without XLA's fake host devices (a test setting),
    unbuffered, JAX's compilation cache in `cache_dir` (unless set), huge pages (no re-exec)."""
    env = hugepages.hugepage_env(os.environ)
    if cache_dir and "JAX_COMPILATION_CACHE_DIR" not in env:
        env["JAX_COMPILATION_CACHE_DIR"] = cache_dir
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.pop("XLA_FLAGS", ""))
    if flags.strip():
        env["XLA_FLAGS"] = flags.strip()
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _cache_dir(path: str) -> str:
    """The sweep's shared compilation cache, from a cell dir `<sweep_dir>/cells/<id>`."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(path))), XLA_CACHE)


def run_evaluation(path: str, out: str, finetune_seed: int | None = None,
                   extra: Sequence[str] = ()) -> dict[str, Any]:
    """Evaluate a cell again into `path/out` (as `evaluate_command`) unless done; its results."""
    results = os.path.join(path, out, RESULTS)
    if not os.path.exists(results):
        spec = json.loads(_read_text(os.path.join(path, CELL_SPEC)))
        _run(evaluate_command(spec, path, out, finetune_seed, extra),
             os.path.join(path, f"{out}.log"),
             f"{os.path.basename(path)}: python -m t5x_like.evaluate ({out})", _cache_dir(path))
    return json.loads(_read_text(results))


def _last_error(log_path: str) -> str | None:
    """The last `error: ...` line of a log (what our CLIs print before a non-zero exit), else
    the last line of a Python traceback; None when there is neither."""
    with open(log_path, encoding="utf-8", errors="replace") as f:
        lines = [line.strip() for line in f.readlines()[-200:] if line.strip()]
    errors = [line.removeprefix("error:").strip() for line in lines if line.startswith("error:")]
    traceback = any(line.startswith("Traceback") for line in lines)
    return errors[-1] if errors else (lines[-1] if traceback else None)


def _run(argv: Sequence[str], log_path: str, what: str,
         cache_dir: str | None = None) -> tuple[float, float]:
    """Run one subprocess, appending its output to log_path; returns (wall, CPU) seconds (CPU
    = user + system, from wait4: on a shared machine it depends much less on the other load)."""
    start = time.time()
    with open(log_path, "a", encoding="utf-8") as log:
        print(f"$ {shlex.join(argv)}", file=log, flush=True)
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                env=child_env(cache_dir))
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        reason = _last_error(log_path)
        raise CellFailed(f"{what} exited with status {rc}{': ' + reason if reason else ''}; "
                         f"see {log_path}")
    return time.time() - start, usage.ru_utime + usage.ru_stime


def _check_finished(model_dir: str, name: str) -> None:
    """CellFailed unless the pre-training reached its last step: a trainer stopped by a signal
    exits 0 after saving, and its checkpoint must not be evaluated as the cell's model."""
    found = re.search(r"^train\.num_train_steps = (\d+)$",
                      _read_text(os.path.join(model_dir, "config.gin")), re.M)
    root = os.path.join(model_dir, "checkpoints")
    names = os.listdir(root) if os.path.isdir(root) else []
    step = max((int(n) for n in names if n.isdigit()), default=0)
    if found and step < int(found.group(1)):
        raise CellFailed(f"{name}: pre-training stopped at step {step} of {found.group(1)} "
                         "(interrupted: it saved a checkpoint); run the sweep again to resume")


def read_metrics(model_dir: str) -> list[dict[str, Any]]:
    """The trainer's metrics.jsonl records (empty when missing)."""
    path = os.path.join(model_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def init_model(path: str) -> str:
    """Write a control cell's `path/pretrain` as a converted model dir: the trainer's step-0 params
    for its `train.seed` (bitwise on one device), then `config.gin`; skipped when done."""
    import flax.linen as nn
    import gin
    import jax

    from t5x_like.convert.cli import write_tree
    from t5x_like.models import TransformerConfig, make_model
    from t5x_like.train.checkpoints import CONVERTED_PARAMS_SUBDIR

    spec = json.loads(_read_text(os.path.join(path, CELL_SPEC)))
    model_dir = os.path.abspath(os.path.join(path, "pretrain"))
    config_path = os.path.join(model_dir, "config.gin")
    if os.path.isfile(config_path):
        return model_dir
    with grid.parsed(spec["gin_files"], spec["bindings"]):
        text = gin.config_str()
        model = make_model(TransformerConfig())
        seed, pack = int(gin.query_parameter("train.seed")), bool(gin.query_parameter("train.pack"))
    batch = model.example_batch(1, dict(spec["sequence_length"]), packed=pack)
    # jitted as the trainer's (eager rounds the initialisers' scaling differently in the last bit)
    init = jax.jit(lambda rng: nn.unbox(model.init_variables(rng, batch)["params"]))
    params = jax.device_get(init(jax.random.key(seed)))
    shutil.rmtree(model_dir, ignore_errors=True)
    os.makedirs(model_dir)
    write_tree(params, os.path.join(model_dir, CONVERTED_PARAMS_SUBDIR))
    note = (f"# No pre-training (a control cell): {CONVERTED_PARAMS_SUBDIR}/ holds the fresh "
            f"initialisation (train.seed = {seed}).")
    _write_atomic(config_path, f"{text}\n{note}\ntrain.model_dir = {model_dir!r}\n".encode())
    count = sum(int(leaf.size) for leaf in jax.tree.leaves(params))
    print(f"[t5x_like.sweep] {spec['cell_id']}: no pre-training; initialised {count:,} "
          f"parameters (seed {seed}) in {model_dir}", flush=True)
    return model_dir


def exploratory_tasks(tasks: Sequence[str]) -> dict[str, bool]:
    """task -> whether it is exploratory (designed after seeing results, not pre-registered)."""
    from t5x_like.data import downstream

    return {t: bool(downstream.get_spec(t).exploratory) for t in tasks}


def _results(spec: Mapping[str, Any], path: str, evaluation: Mapping[str, Any],
             wall: tuple[float, float], cpu: tuple[float, float]) -> dict[str, Any]:
    """A finished cell's results.json (wall/cpu: (pre-training, evaluation) seconds; the final
    pre-training step and loss are its last train record's: a resumed run's later ones win)."""
    measured = costs.measure(spec["gin_files"], spec["bindings"], spec["sequence_length"])
    batch, control = measured.pop("batch_size"), bool(spec.get("control"))
    records = [r for r in read_metrics(os.path.join(path, "pretrain")) if "loss" in r]
    train = {r["step"]: r for r in records if r.get("split") == "train"}
    evals = [r for r in records if r.get("split") == "eval"]
    last = train[max(train)] if train else {}
    step = 0 if control else last.get("step")
    tasks = evaluation.get("tasks", {})
    return {"cell_id": spec["cell_id"], "seed": spec["seed"], "rows": spec["rows"],
            "scale": spec["scale"]["name"], "task": spec["task"], "control": control,
            "code": code_version(), "host": host.describe(),
            "sequence_length": spec["sequence_length"], "config_hash": spec["config_hash"],
            **measured,
            "pretrain": {"final_step": step, "final_loss": last.get("loss"),
                         "eval_loss": evals[-1]["loss"] if evals else None, "batch_size": batch,
                         "input_tokens": (step or 0) * batch * spec["scale"]["inputs_length"]},
            "suite_average": evaluation.get("suite_average"),
            "baseline_average": evaluation.get("baseline_average"),
            "tasks": {t: r.get("score") for t, r in tasks.items()},
            "exploratory": exploratory_tasks(list(tasks)), "evaluation": evaluation,
            **{key: {"pretrain": round(t[0], 1), "evaluate": round(t[1], 1),
                     "total": round(sum(t), 1)}
               for key, t in (("seconds", wall), ("cpu_seconds", cpu))}}


def run_cell_dir(path: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run (or resume) the cell described by `path/cell.json`; returns its results."""
    results_path, name = os.path.join(path, RESULTS), os.path.basename(os.path.normpath(path))
    if os.path.exists(results_path):
        log(f"[sweep] {name}: done, skipped")
        return json.loads(_read_text(results_path))
    spec = json.loads(_read_text(os.path.join(path, CELL_SPEC)))
    try:
        data_prepare.prepare(log=log)
    except (assets.AssetError, data_prepare.PrepareError) as err:
        raise CellFailed(f"{name}: preparing the data directory: {err}") from err
    cache_dir, pretrain_log = _cache_dir(path), os.path.join(path, "pretrain.log")
    if spec.get("control"):  # not pre-trained: initialised
        log(f"[sweep] {name}: control, no pre-training: initialising")
        pretrain_s, pretrain_cpu = _run(
            [sys.executable, "-m", "t5x_like.sweep", f"--init_cell={path}"], pretrain_log,
            f"{name}: python -m t5x_like.sweep --init_cell", cache_dir)
    else:
        log(f"[sweep] {name}: pre-training")
        pretrain_s, pretrain_cpu = _run(train_command(spec, path), pretrain_log,
                                        f"{name}: python -m t5x_like.train", cache_dir)
        _check_finished(os.path.join(path, "pretrain"), name)
    log(f"[sweep] {name}: pre-trained in {pretrain_s:.0f}s; evaluating")
    evaluate_s, evaluate_cpu = _run(evaluate_command(spec, path), os.path.join(path, "eval.log"),
                                    f"{name}: python -m t5x_like.evaluate", cache_dir)
    if not os.path.exists(os.path.join(path, "eval", RESULTS)):
        raise CellFailed(f"{name}: python -m t5x_like.evaluate stopped before writing its results "
                         "(interrupted: it saved its fine-tune); run the sweep again to resume")
    evaluation = json.loads(_read_text(os.path.join(path, "eval", RESULTS)))
    results = _results(spec, path, evaluation, (pretrain_s, evaluate_s),
                       (pretrain_cpu, evaluate_cpu))
    write_json(results_path, results)
    log(f"[sweep] {name}: done in {pretrain_s + evaluate_s:.0f}s "
        f"({pretrain_cpu + evaluate_cpu:.0f}s CPU; suite average {results['suite_average']})")
    return results


def _locked_print(message: str) -> None:
    with _PRINT_LOCK:
        print(message, flush=True)


def run_order(cells: Sequence[Cell]) -> list[Cell]:
    """Seed-major (a sweep spread over hosts splits each row's seeds across them, the host not
    confounded with the row), then most training FLOPs first (none trails at the end)."""
    measured = [costs.measure(c.gin_files, c.bindings, c.sequence_length) for c in cells]
    flops = [m["flops_per_sequence"] * m["batch_size"] * m["num_train_steps"] for m in measured]
    return [c for c, _ in sorted(zip(cells, flops, strict=True), key=lambda p: (p[0].seed, -p[1]))]


def run_cells(cells: Sequence[Cell], scale: ScaleSpec, sweep_dir: str, *,
              parallel: int = 1, archive: str | None = None) -> list[str]:
    """Run every cell (`parallel` at once, in `run_order`; finished ones skipped), each
    archived when it finishes if `archive` is given; returns failure messages."""
    paths = [prepare(c, scale, sweep_dir) for c in run_order(cells)]

    def one(path: str) -> str | None:
        try:
            run_cell_dir(path, _locked_print)
            if archive:
                archive_cell(archive, path)
        except (CellFailed, OSError, ValueError, KeyError) as err:
            _locked_print(f"[sweep] FAILED {err}")
            return str(err)

    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        return [failure for failure in pool.map(one, paths) if failure is not None]


def print_commands(cells: Sequence[Cell], scale: ScaleSpec, sweep_dir: str) -> list[str]:
    """Write every cell.json and return, for a cluster scheduler, one shell line per unfinished
    cell (in `run_order`) running that cell alone (`python -m t5x_like.sweep --run_cell=DIR`)."""
    paths = [prepare(c, scale, sweep_dir) for c in run_order(cells)]
    return [shlex.join([sys.executable, "-m", "t5x_like.sweep", f"--run_cell={path}"])
            for path in paths if not is_done(path)]
