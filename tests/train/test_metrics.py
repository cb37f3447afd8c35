"""Peak-FLOP table, MFU, metric writers, and the step-level analytic FLOP count vs XLA."""

from __future__ import annotations

import io
import json

import jax
import numpy as np
import pytest
import tensorflow as tf

from t5x_like.models import make_model
from t5x_like.train import metrics, train_step
from t5x_like.train.optimizers import create_optimizer
from tests.train.conftest import sharded_plan, tiny_config


@pytest.mark.parametrize(
    ("kind", "peak"),
    [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H200", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12),
     ("TPU v4", 275e12), ("TPU v5 lite", 197e12), ("TPU v5", 459e12), ("TPU v5p", 459e12),
     ("cpu", None)],
)
def test_peak_flops_lookup(kind, peak) -> None:
    assert metrics.peak_flops_per_device(kind) == peak


def test_mfu_is_none_on_cpu_and_a_ratio_on_known_devices() -> None:
    assert metrics.mfu(1e12, 8, "cpu") is None
    assert metrics.mfu(989e12 * 4 * 0.4, 4, "NVIDIA H100 80GB HBM3") == pytest.approx(0.4)


def test_writer_writes_jsonl_tensorboard_and_progress_line(tmp_path) -> None:
    out = io.StringIO()
    w = metrics.MetricsWriter(str(tmp_path), stream=out)
    w.write(10, "train", {"loss": 2.5, "mfu": None})
    w.progress(10, 100, {"loss": 2.5, "learning_rate": 0.01, "examples_per_second": 12.0,
                         "tokens_per_second": 3.2e4, "model_flops_per_second": 5e11, "mfu": None})
    w.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 10 and rows[0]["loss"] == 2.5 and rows[0]["mfu"] is None
    line = out.getvalue()
    assert "step 10/100" in line and "loss 2.5" in line and "32.00k tok/s" in line
    assert "500.00GFLOP/s" in line and "MFU n/a" in line
    (events,) = tmp_path.glob("events.out.tfevents*")
    scalars = [(e.step, v.tag, v.simple_value)
               for e in tf.compat.v1.train.summary_iterator(str(events)) for v in e.summary.value]
    assert scalars == [(10, "train/loss", 2.5)]  # None (mfu) is not written


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_only"])
def test_step_flops_match_xla_cost_analysis(family) -> None:
    """The trainer's FLOPs per step (model.flops_per_sequence x batch) vs XLA's count, within 5%."""
    cfg = tiny_config(vocab_size=2048, emb_dim=256, num_heads=4, head_dim=64, mlp_dim=1024,
                      num_encoder_layers=2, num_decoder_layers=2, family=family)
    model = make_model(cfg)
    seq = {"inputs": 64, "targets": 32} if family == "encoder_decoder" else {"targets": 96}
    opt = create_optimizer("adafactor")
    batch = model.example_batch(4, seq)
    mesh, rules, plan = sharded_plan(model, opt, batch, (1, 1, 1), "data_parallel")
    step = train_step.jit_train_step(train_step.make_train_step(model, opt), plan, mesh, rules)
    batch = {k: np.ones(v.shape, np.int32) for k, v in batch.items()}
    # The lowered (pre-optimisation) HLO's cost analysis: same FLOPs, no compile needed.
    cost = step.lower(plan.abstract, batch, jax.random.key(0)).cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    analytic = model.flops_per_sequence(seq) * 4
    assert cost["flops"] == pytest.approx(analytic, rel=0.05)
