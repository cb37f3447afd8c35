"""The two gin configurables a sweep is written in: `sweep` (a paper table) and `sweep_scale`.

A sweep file (`gin/sweeps/t5_table*.gin`) binds `sweep.*`: the table id, title, the base gin
files every cell starts from, and `sweep.rows`, one line per row: `'row name': [gin files and
bindings]` (an entry ending in `.gin` is a file, anything else a binding). A scale file
(`gin/sweeps/scales/*.gin`) is a train config (size, steps, batch, vocabulary) that also binds
`sweep_scale.*` (inputs length, corpus, how to fine-tune and evaluate; the trainer ignores it).
Only gin is imported at import time, so `import t5x_like.sweep.config` in a gin file is cheap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import gin


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """One paper table: `rows` maps the paper's row name -> gin files/bindings over `base`."""

    table: str
    title: str
    rows: Mapping[str, tuple[str, ...]]
    base: tuple[str, ...]
    metric: str
    bookkeeping: Mapping[str, tuple[str, str]]
    path: str = ""


@dataclasses.dataclass(frozen=True)
class ScaleSpec:
    """How big a cell is. `inputs_length` sizes every objective's lengths
    (`objectives.default_sequence_length`); `corpus` replaces the objective files' `c4like`."""

    name: str
    inputs_length: int
    corpus: str
    seeds: int
    evaluate_flags: tuple[str, ...]
    evaluate_gin_files: tuple[str, ...]
    evaluate_bindings: tuple[str, ...]
    train_flags: tuple[str, ...]
    path: str = ""


@gin.configurable("sweep")
def sweep(table: str = gin.REQUIRED, title: str = gin.REQUIRED,
          rows: Mapping[str, Sequence[str]] = gin.REQUIRED,
          base: Sequence[str] = ("gin/runs/pretrain.gin",), metric: str = "suite_average",
          bookkeeping: Mapping[str, Sequence[str]] | None = None) -> SweepSpec:
    """The bound sweep (`bookkeeping`: row -> the paper's (params, cost), e.g. ('2P', 'M'))."""
    if not rows:
        raise ValueError(f"sweep {table!r}: sweep.rows is empty")
    for name, entries in rows.items():
        if isinstance(entries, str):
            raise ValueError(f"sweep {table!r} row {name!r}: give a list of gin files/bindings, "
                             f"not the string {entries!r}")
    return SweepSpec(table, title, {k: tuple(v) for k, v in rows.items()}, tuple(base), metric,
                     {k: tuple(v) for k, v in (bookkeeping or {}).items()})


@gin.configurable("sweep_scale")
def sweep_scale(name: str = gin.REQUIRED, inputs_length: int = gin.REQUIRED,
                corpus: str = "c4like", seeds: int = 1, evaluate_flags: Sequence[str] = (),
                evaluate_gin_files: Sequence[str] = (), evaluate_bindings: Sequence[str] = (),
                train_flags: Sequence[str] = ()) -> ScaleSpec:
    """The bound scale: `evaluate_flags` (e.g. '--multitask') and `train_flags` are passed to
    evaluate and train as they are; `evaluate_bindings` become `--gin.K=V`."""
    from t5x_like.data.tasks import CORPORA  # loaded by then (gin_utils.parse_gin reads scales)

    if corpus not in CORPORA:
        raise ValueError(f"sweep_scale.corpus must be one of {CORPORA}, got {corpus!r}")
    if inputs_length < 4:
        raise ValueError(f"sweep_scale.inputs_length must be >= 4, got {inputs_length}")
    return ScaleSpec(name, int(inputs_length), corpus, int(seeds), tuple(evaluate_flags),
                     tuple(evaluate_gin_files), tuple(evaluate_bindings), tuple(train_flags))
