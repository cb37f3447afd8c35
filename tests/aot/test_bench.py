"""scripts/bench_aot.py bookkeeping: one cached result per config id, skipped on a rerun."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_aot", REPO / "scripts" / "bench_aot.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_aot"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_config_ids_are_unique_and_name_model_sharding_target() -> None:
    b = _bench()
    ids = [c.id for c in b.CONFIGS]
    assert len(set(ids)) == len(ids)
    for c in b.CONFIGS:
        assert c.model in c.id and c.sharding in c.id and c.target in c.id
        assert (REPO / "gin" / "models" / f"{c.model}.gin").exists()
        assert (REPO / "gin" / "sharding" / f"{c.sharding}.gin").exists()


def test_cached_configs_are_skipped_and_rendered(tmp_path) -> None:
    b = _bench()
    # a TPU config no other id contains (`--only` matches substrings)
    cfg = next(c for c in b.CONFIGS if c.target == "v5e-16"
               and sum(c.id in o.id for o in b.CONFIGS) == 1)
    report = {"target": {"name": cfg.target, "num_devices": 16, "device_kind": "TPU v5 lite",
                         "hbm_bytes": 16 * 2**30, "platform": "tpu"},
              "config": {"mesh": {"data": 16, "fsdp": 1, "model": 1}, "batch_size": 128,
                         "remat": "none"},
              "steps": {"train": {"compiled": True, "compile_s": 1.0, "fits": True,
                                  "bytes_per_device": {"argument": 2**30, "temp": 2**31,
                                                       "peak": 3 * 2**30}}},
              "plan_over_compiler": {"state": 1.0, "temp": 1.15, "total": 1.1, "flops": 0.98}}
    cache, md = tmp_path / "aot.json", tmp_path / "aot.md"
    replanned = {"accelerator": {"temp": 2.2 * 2**30, "total": 3.3 * 2**30},
                 "cpu": {"temp": 5 * 2**30, "total": 6 * 2**30}}
    cache.write_text(json.dumps({cfg.id: {"returncode": 0, "wall_s": 1, "report": report,
                                          "replan": replanned}}))
    # A missing interpreter would fail any compile it tried: the cached config is not rerun.
    assert b.main(["--json", str(cache), "--md", str(md), "--only", cfg.id,
                   "--python", str(tmp_path / "no-python"), "--lock", ""]) == 0
    text = md.read_text()
    # planner / XLA peak for the fused and the every-residual activation models
    assert cfg.model in text and "**1.1**" in text and "3.30" in text and "| 2.0 |" in text
    assert json.loads(cache.read_text()).keys() == {cfg.id}
