"""`python -m t5x_like.aot` end to end, as a user runs it: a real subprocess compiling the real
train step for an 8-device CPU mesh (`--target cpu:8`, no compiler package needed), and its
errors for targets whose compiler is not installed in this environment."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from t5x_like.aot.step import format_report
from tests.conftest import FAST_COMPILE

REPO = Path(__file__).resolve().parents[2]
#: quickstart.gin shrunk so a compile takes seconds: 1+1 layers, short sequences.
TINY = ("--gin_file=gin/runs/quickstart.gin", "--gin_file=gin/sharding/fsdp.gin",
        "--gin.TransformerConfig.num_encoder_layers=1",
        "--gin.TransformerConfig.num_decoder_layers=1",
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}", "--gin.train.batch_size=16")


def run_aot(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["XLA_FLAGS"] = FAST_COMPILE  # the CLI adds the host devices a cpu:N target needs
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "t5x_like.aot", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def fits(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path_factory.mktemp("aot") / "report.json"
    proc = run_aot("--target=cpu:8", "--hbm_gb=4", f"--json_out={out}", "--step=both", *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def test_compiles_train_and_eval_for_an_8_device_mesh_and_fits(fits) -> None:
    proc, report = fits
    assert report["target"]["num_devices"] == 8 and report["target"]["platform"] == "cpu"
    assert report["config"]["mesh"] == {"data": 1, "fsdp": 8, "model": 1}
    assert report["compiled"] and report["fits"] is True
    for step in ("train", "eval"):
        s = report["steps"][step]
        b = s["bytes_per_device"]
        assert s["compiled"] and s["fits"] is True
        assert b["argument"] > 0 and b["temp"] > 0 and 0 < b["peak"] <= 4 * 2**30
        assert b["peak"] == b["argument"] + b["output"] - b["alias"] + b["temp"]
        assert s["xla_flops"] > 0
    # the train step donates its state: XLA aliases it with the new state
    assert report["steps"]["train"]["bytes_per_device"]["alias"] > 0
    assert report["steps"]["train"]["xla_flops"] > report["steps"]["eval"]["xla_flops"]
    # the planner beside the compiler: parameters + optimizer state are exact
    plan = report["plan"]["bytes_per_device"]
    assert plan["params"] > 0 and plan["total"] > plan["params"]
    assert report["plan_over_compiler"]["state"] == pytest.approx(1.0, abs=0.02)
    assert 0.5 < report["plan_over_compiler"]["flops"] < 2
    # progress went to stderr, the table to stdout
    assert "compiling for 8 x cpu" in proc.stderr and "train: compiled in" in proc.stdout
    assert "fits" in proc.stdout and "planner" in proc.stdout


def test_a_budget_that_needs_remat_gets_a_suggestion(fits, tmp_path) -> None:
    """Between the activations-free minimum and the measured peak, a remat / microbatch
    change fits: the CLI names its gin bindings."""
    peak = fits[1]["steps"]["train"]["bytes_per_device"]["peak"]
    out = tmp_path / "report.json"
    proc = run_aot("--target=cpu:8", f"--hbm_gb={0.98 * peak / 2**30:.6f}",
                   f"--json_out={out}", *TINY)
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    sug = report["suggestion"]
    assert sug is not None, proc.stdout
    assert sug["remat"] != "none" or sug["num_microbatches"] > 1 or sug["sharding"] != "fsdp"
    assert any("remat_policy" in b for b in sug["bindings"])
    assert report["fits"] is False and report["steps"]["train"]["fits"] is False
    assert "does NOT fit" in proc.stdout and "would fit" in proc.stdout
    assert sug["expected_compiler_bytes"] <= 0.98 * peak
    # When the planner finds nothing (a budget below the parameters alone), it says so rather
    # than printing bindings that would not fit either.
    text = format_report({**report, "suggestion": None})
    assert "nothing the planner tried fits" in text and "--gin" not in text
    assert "attention xla," in text
    hopper = {**report, "config": {**report["config"], "attention_impl": "pallas",
                                   "flash_backend": "mosaic_gpu"}}
    assert "attention pallas (mosaic_gpu)," in format_report(hopper)


@pytest.mark.parametrize("target,package", [("h100", "jax_plugins.xla_cuda12"),
                                            ("8xa100", "jax_plugins.xla_cuda12"),
                                            ("v5e-16", "libtpu")])
def test_missing_compiler_exits_2_naming_make_install_aot(target, package) -> None:
    if _installed(package):
        pytest.skip(f"{package} is installed in this environment: no missing-plugin error")
    proc = run_aot(f"--target={target}", *TINY, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "make install-aot" in lines[0]


@pytest.mark.parametrize("target,words", [("z80", "unknown target 'z80'"),
                                          ("v5e-3", "not a power of two"),
                                          ("v9-8", "unknown generation")])
def test_bad_targets_exit_2_with_one_line(target, words) -> None:
    proc = run_aot(f"--target={target}", *TINY, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and words in lines[0], proc.stderr


@pytest.mark.parametrize("target,flags,words", [
    ("cpu:3", (), "not divisible by the 3 batch shards"),  # fsdp over 3 devices, batch 16
    ("cpu:8", ("--gin.train.batch_sise=3",), "batch_size"),
    ("cpu:8", ("--xla_option=xla_gpu_enable_triton_gemm",), "expected KEY=VALUE"),
])
def test_an_unsplittable_batch_a_bad_binding_or_xla_option_exits_2(target, flags, words) -> None:
    proc = run_aot(f"--target={target}", *TINY, *flags, timeout=120)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def test_xla_option_values_are_typed() -> None:
    from t5x_like.aot.__main__ import _option_value

    assert _option_value("false") is False and _option_value("True") is True
    assert _option_value("0") == 0 and _option_value("0.5") == 0.5
    assert _option_value("/tmp/dump") == "/tmp/dump"


def test_startup_noise_is_the_plugins_probe_lines_only() -> None:
    """What the CUDA plugin and libtpu print while loading on a host without accelerators (as
    seen in .venv-aot) is dropped; errors and our own lines are not."""
    from t5x_like.aot.__main__ import STARTUP_NOISE

    noise = [
        b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        b"I0000 00:00:1795554434.240661   30559 cudart_stub.cc:31] Could not find cuda drivers "
        b"on your machine, GPU will not be used.",
        b"Failed to find host bounds for accelerator type: WARNING: could not determine TPU "
        b"accelerator type, please set env var `TPU_ACCELERATOR_TYPE` manually, otherwise "
        b"libtpu.so may not properly initialize.",
        b"WARNING: Logging before InitGoogle() is written to STDERR",
        b"E0000 00:00:1795554435.727543   30559 common_lib.cc:554] INVALID_ARGUMENT: Error: "
        b"unexpected worker hostname 'WARNING: could not determine TPU worker hostnames or IP "
        b"addresses' from env var TPU_WORKER_HOSTNAMES.",
        b"=== Source Location Trace: ===",
        b"learning/45eac/tfrc/runtime/libtpu_init_utils.cc:327",
    ]
    kept = [
        b"error: TPU target 'v9z-3': unknown generation 'v9z'",
        b"[aot] target v5e-8: v5e:2x4 (8 x TPU v5 lite, default)",
        b"E0000 00:00:1795554435.727543   30559 common_lib.cc:554] INVALID_ARGUMENT: bad shape",
        b"Traceback (most recent call last):",
    ]
    assert all(STARTUP_NOISE.match(line) for line in noise)
    assert not any(STARTUP_NOISE.match(line) for line in kept)
