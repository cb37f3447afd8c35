"""Numeric flags are range-checked by argparse in every CLI: exit 2, the flag named, at once."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from t5x_like import flags

REPO = Path(__file__).resolve().parents[1]


def test_type_functions_accept_their_range_and_refuse_the_rest() -> None:
    assert flags.positive_int("3") == 3 and flags.non_negative_int("0") == 0
    assert flags.positive_float("0.5") == 0.5 and flags.non_negative_float("0") == 0.0
    assert flags.unit_interval("1") == 1.0 and flags.mesh_shape("2,-1,1") == (2, -1, 1)
    for fn, text in [(flags.positive_int, "0"), (flags.positive_int, "1.5"),
                     (flags.non_negative_int, "-1"), (flags.positive_float, "0"),
                     (flags.positive_float, "nan"), (flags.non_negative_float, "-inf"),
                     (flags.unit_interval, "0"), (flags.unit_interval, "1.01"),
                     (flags.mesh_shape, "2,-1,-1"), (flags.mesh_shape, "2,0,1")]:
        with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
            fn(text)


#: (module, argv): one bad number for each command-line tool not covered by its own tests.
BAD = [
    ("t5x_like.train", ["--num_processes=0"]),
    ("t5x_like.train", ["--process_id=-1"]),
    ("t5x_like.sweep", ["--parallel=0"]),
    ("t5x_like.sweep", ["--seeds=-2"]),
    ("t5x_like.data.preview", ["--num_examples=0"]),
    ("t5x_like.data.clean", ["--max_word_length=0"]),
    ("t5x_like.aot", ["--hbm_gb=-1"]),
    ("t5x_like.aot.roofline", ["x.hlo", "--top=0"]),
]


def _run(module: str, argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})


def test_every_tool_refuses_a_bad_number_before_loading_anything() -> None:
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda case: _run(*case), BAD))
    for (module, argv), done in zip(BAD, results, strict=True):
        flag = argv[-1].split("=")[0]
        assert done.returncode == 2, (module, argv, done.stderr[-2000:])
        assert f"argument {flag}: must be" in done.stderr, (module, done.stderr[-2000:])
        assert "Traceback" not in done.stderr
