"""Sweep files x scale x seeds -> cells: the gin files and bindings each cell trains with.

A cell's train config: the sweep's `base` files, the scale file, the row's files and bindings,
then `MIXTURE_OR_TASK_NAME` (the objective's task on the scale's corpus), `TASK_FEATURE_LENGTHS`
(`sequence_length`) and `train.seed`, so every cell trains on steps x batch x inputs_length input
tokens. Its id is `<architecture>__<objective>__s<seed>__<hash>`, hash = sha256 of gin's parsed
config, so rows with the same effective config (Table 2 "Encoder-decoder | LM", Table 3 "Prefix
LM") are one cell, run once. A row binding `train.num_train_steps = 0` is a *control*
(`Cell.control`, `no_pretraining` for its objective): fine-tuned from a fresh initialisation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence

import gin

from t5x_like.sweep.config import ScaleSpec, SweepSpec, sweep, sweep_scale

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCALES_DIR = os.path.join("gin", "sweeps", "scales")


class SweepError(ValueError):
    """A sweep file, scale or row selection is invalid (the message names it)."""


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (config, seed) to pre-train and evaluate; `rows` = the (table, row) pairs it serves."""

    cell_id: str
    seed: int
    gin_files: tuple[str, ...]
    bindings: tuple[str, ...]
    task: str
    sequence_length: Mapping[str, int]
    config_hash: str
    rows: tuple[tuple[str, str], ...]
    control: bool = False  # no pre-training: fine-tuned from a fresh initialisation


def resolve(path: str) -> str:
    """A gin file path as given if it exists, else relative to the repository root."""
    for candidate in (path, os.path.join(REPO_ROOT, path)):
        if os.path.exists(candidate):
            return candidate
    raise SweepError(f"gin file not found: {path}")


def _parse(files: Sequence[str], bindings: Sequence[str] = ()) -> None:
    """Parse train gin (every configurable registered) into a cleared gin state."""
    from t5x_like import gin_utils

    gin.clear_config()
    try:
        gin_utils.parse_gin([resolve(f) for f in files], list(bindings))
    except gin_utils.ConfigError as err:
        raise SweepError(str(err)) from err


@contextlib.contextmanager
def parsed(files: Sequence[str], bindings: Sequence[str] = ()) -> Iterator[None]:
    """`_parse` for the `with` block; gin's config is cleared after it."""
    try:
        _parse(files, bindings)
        yield
    finally:
        gin.clear_config()


def load_sweep(path: str) -> SweepSpec:
    """Read one sweep file (clears gin's global config before and after)."""
    gin.clear_config()
    try:
        gin.parse_config_file(resolve(path))
        spec = sweep()
    except (ValueError, KeyError, TypeError, RuntimeError, ImportError, OSError) as err:
        raise SweepError(f"invalid sweep file {path}: {err}") from err
    finally:
        gin.clear_config()
    if commas := [row for row in spec.rows if "," in row]:
        raise SweepError(f"{path}: row name {commas[0]!r} contains ',' (--rows splits on it)")
    return dataclasses.replace(spec, path=path)


def scale_path(scale: str) -> str:
    """`tiny` -> gin/sweeps/scales/tiny.gin; a path to a .gin file is kept."""
    if scale.endswith(".gin"):
        return scale
    path = os.path.join(SCALES_DIR, f"{scale}.gin")
    if not os.path.exists(os.path.join(REPO_ROOT, path)) and not os.path.exists(path):
        known = sorted(f[:-4] for f in os.listdir(os.path.join(REPO_ROOT, SCALES_DIR)))
        raise SweepError(f"unknown scale {scale!r}; known: {', '.join(known)}")
    return path


def load_scale(scale: str) -> ScaleSpec:
    """Read a scale file (a train config that also binds `sweep_scale.*`)."""
    path = scale_path(scale)
    try:
        with parsed([path]):
            spec = sweep_scale()
    except (ValueError, RuntimeError) as err:
        raise SweepError(f"invalid scale file {path}: {err}") from err
    return dataclasses.replace(spec, path=path)


def corpus_task(task: str, corpus: str) -> str:
    """Move a task onto `corpus`: c4like_prefix_lm -> c4_prefix_lm (the longest corpus wins)."""
    from t5x_like.data import tasks

    for known in sorted(tasks.CORPORA, key=len, reverse=True):
        if task.startswith(known + "_"):
            return f"{corpus}_{task[len(known) + 1:]}"
    return task


#: The objective whose example split a targets-only objective's span covers (`sequence_length`).
SPAN_OBJECTIVE = "prefix_lm"
#: The cell-id part of a control cell (no pre-training), where an objective would be.
NO_PRETRAINING = "no_pretraining"


def sequence_length(task: str, inputs_length: int) -> dict[str, int]:
    """A cell's task lengths: the objective's own for `inputs_length`; a targets-only objective
    (the full-span LM) predicts the whole span a prefix-LM example splits (the paper's cost M)."""
    from t5x_like.data import objectives, tasks

    objective = tasks.task_objective(task)
    if objective.has_inputs:
        return objectives.default_sequence_length(objective, inputs_length)
    span = objectives.default_sequence_length(tasks.OBJECTIVES[SPAN_OBJECTIVE], inputs_length)
    return {"targets": sum(span.values())}


def build_cell(sweep_spec: SweepSpec, scale: ScaleSpec, row: str, seed: int) -> Cell:
    """Resolve one (row, seed): parse its gin, compute task/lengths/seed bindings and its id."""
    from t5x_like.models import TransformerConfig

    entries = sweep_spec.rows[row]  # an entry ending in '.gin' is a file, others bindings
    row_files = [e for e in entries if e.strip().endswith(".gin")]
    row_bindings = [e for e in entries if not e.strip().endswith(".gin")]
    files = [*sweep_spec.base, scale.path, *row_files]
    try:
        with parsed(files, row_bindings):
            task = corpus_task(gin.query_parameter("%MIXTURE_OR_TASK_NAME"), scale.corpus)
            lengths = sequence_length(task, scale.inputs_length)
            extra = [f"MIXTURE_OR_TASK_NAME = {task!r}",
                     f"TASK_FEATURE_LENGTHS = {dict(sorted(lengths.items()))!r}",
                     f"train.seed = {int(seed)}"]
            gin.parse_config(extra)  # on top of the parsed files + row bindings (later wins)
            config_hash = hashlib.sha256(gin.config_str().encode()).hexdigest()[:8]
            arch = TransformerConfig().slug
            control = int(gin.query_parameter("train.num_train_steps")) == 0
    except (ValueError, KeyError, RuntimeError) as err:  # (a SweepError is a ValueError)
        raise SweepError(f"{sweep_spec.path} row {row!r}: {err}") from err
    objective = NO_PRETRAINING if control else task.split("_", 1)[1]
    return Cell(cell_id=f"{arch}__{objective}__s{seed}__{config_hash}", seed=int(seed),
                gin_files=tuple(files), bindings=(*row_bindings, *extra), task=task,
                sequence_length=lengths, config_hash=config_hash,
                rows=((sweep_spec.table, row),), control=control)


def select_rows(specs: Sequence[SweepSpec], rows: Sequence[str] | None) -> list[tuple[int, str]]:
    """(sweep index, row) pairs in table order; `rows` filters by exact name or 'table:row'."""
    pairs = [(i, r) for i, s in enumerate(specs) for r in s.rows]
    if not rows:
        return pairs
    wanted = [r.strip() for r in rows if r.strip()]
    chosen = [(i, r) for i, r in pairs if r in wanted or f"{specs[i].table}:{r}" in wanted]
    names = {r for _, r in pairs} | {f"{specs[i].table}:{r}" for i, r in pairs}
    if unknown := [w for w in wanted if w not in names]:
        raise SweepError(f"unknown row(s) {unknown}; rows: {sorted({r for _, r in pairs})}")
    return chosen


def expand(specs: Sequence[SweepSpec], scale: ScaleSpec, *, seeds: int | None = None,
           rows: Sequence[str] | None = None) -> list[Cell]:
    """Every (row, seed) cell of the sweeps, identical configs merged (their `rows` joined)."""
    num_seeds = scale.seeds if seeds is None else int(seeds)
    if num_seeds < 1:
        raise SweepError(f"--seeds must be >= 1, got {num_seeds}")
    cells: dict[str, Cell] = {}
    for index, row in select_rows(specs, rows):
        for seed in range(num_seeds):
            cell = build_cell(specs[index], scale, row, seed)
            old = cells.get(cell.config_hash)
            cells[cell.config_hash] = (dataclasses.replace(old, rows=(*old.rows, *cell.rows))
                                       if old else cell)
    return list(cells.values())


def cells_of(cells: Sequence[Cell], table: str) -> Iterator[tuple[str, Cell]]:
    """(row, cell) for every cell serving `table`."""
    return ((row, cell) for cell in cells for t, row in cell.rows if t == table)
