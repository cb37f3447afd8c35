"""Metrics read one step late (the default) log, stop, skip and save exactly as reading them
every step does (``train.synchronous_metrics = True``): same metrics.jsonl rows and values, same
checkpoint steps, bitwise the same checkpointed state; a non-finite step found late is named and
the step already dispatched after it is dropped."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from t5x_like.train import metrics
from tests.train.conftest import run_train

pytestmark = pytest.mark.slow

COMMON = (
    "train.sequence_length = {'inputs': 32, 'targets': 8}",
    "train.batch_size = 8",
    "train.eval_every = 0",
    "train.keep_checkpoints = None",
)
#: Wall-clock dependent keys: everything else in a row must match exactly.
TIMING = {"time", "steps_per_second", "examples_per_second", "tokens_per_second",
          "model_flops_per_second", "mfu"}


def _rows(model_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (model_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _checkpoints(model_dir: Path) -> dict[str, np.ndarray]:
    """Every checkpointed array, keyed ``'<step><tree path>'`` (restored as saved)."""
    out = {}
    for step_dir in sorted((model_dir / "checkpoints").iterdir()):
        if step_dir.name.isdigit():
            tree = ocp.PyTreeCheckpointer().restore(str(step_dir / "state"))
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
                out[step_dir.name + jax.tree_util.keystr(path)] = np.asarray(leaf)
    return out


def _assert_bitwise_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    different = [k for k in got if got[k].tobytes() != want[k].tobytes()]
    assert not different, different[:5]


def _pair(tmp_path: Path, cache: str, *bindings: str, code: int = 0):
    outs = {}
    for sync in (True, False):
        model_dir = tmp_path / ("sync" if sync else "lagged")
        out = run_train(model_dir, *COMMON, *bindings,
                        f"train.synchronous_metrics = {sync}", compile_cache=cache)
        assert out.returncode == code, out.stderr[-3000:]
        outs[sync] = (model_dir, out)
    return outs[True], outs[False]


def test_lagged_metrics_match_synchronous_run_bitwise(tmp_path, compile_cache) -> None:
    # Saves at 4 and 7 (the end); log_every 2 logs steps 1, 2, 4, 6, 7: a mix of lagged and
    # immediately read steps.
    (sync_dir, _), (lag_dir, _) = _pair(tmp_path, compile_cache, "train.num_train_steps = 7",
                                        "train.checkpoint_every = 4", "train.log_every = 2")
    rows = _rows(lag_dir)
    assert [r["step"] for r in rows] == [1, 2, 4, 6, 7]
    assert rows == _rows(sync_dir)
    arrays = _checkpoints(lag_dir)
    assert {k.split("[")[0] for k in arrays} == {"4", "7"}
    _assert_bitwise_equal(arrays, _checkpoints(sync_dir))


def test_lagged_nonfinite_step_is_named_and_the_next_step_dropped(tmp_path, compile_cache) -> None:
    # Step 2 is the first non-finite one and no checkpoint is due, so it is read only after
    # step 3 was dispatched: step 3 must not appear anywhere.
    (sync_dir, sync_out), (lag_dir, lag_out) = _pair(
        tmp_path, compile_cache, "train.num_train_steps = 6", "train.checkpoint_every = 100",
        "train.log_every = 1", "rsqrt_schedule.base_learning_rate = 1e36", code=3)
    for out in (sync_out, lag_out):
        assert "non-finite loss at step 2" in out.stderr
        assert "Last good checkpoint: none" in out.stderr
    rows = _rows(lag_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows == _rows(sync_dir)
    assert not (lag_dir / "checkpoints").exists() or not any(
        p.name.isdigit() for p in (lag_dir / "checkpoints").iterdir())


def test_skip_policy_with_lagged_metrics_matches_synchronous_run(tmp_path, compile_cache) -> None:
    (sync_dir, sync_out), (lag_dir, lag_out) = _pair(
        tmp_path, compile_cache, "train.num_train_steps = 5", "train.checkpoint_every = 5",
        "train.log_every = 1", "train.on_nonfinite = 'skip'",
        "rsqrt_schedule.base_learning_rate = 1e36")
    skipped = [line for line in lag_out.stdout.splitlines() if "update skipped" in line]
    assert skipped and skipped == [line for line in sync_out.stdout.splitlines()
                                   if "update skipped" in line]
    assert _rows(lag_dir) == _rows(sync_dir)
    _assert_bitwise_equal(_checkpoints(lag_dir), _checkpoints(sync_dir))


def test_throughput_rates_and_unmeasurable_interval() -> None:
    got = metrics.throughput(steps=4, seconds=2.0, batch_size=8, tokens_per_seq=40,
                             flops_per_step=1e12, devices=2, device_kind="NVIDIA H100 80GB HBM3")
    assert got["steps_per_second"] == 2.0
    assert got["examples_per_second"] == 16.0 and got["tokens_per_second"] == 640.0
    assert got["mfu"] == pytest.approx(2e12 / (2 * 989e12))
    none = metrics.throughput(steps=0, seconds=1.0, batch_size=8, tokens_per_seq=40,
                              flops_per_step=1e12, devices=1, device_kind="cpu")
    assert set(none) == set(got) and all(v is None for v in none.values())
