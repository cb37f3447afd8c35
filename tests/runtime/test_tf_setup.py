"""t5x_like.runtime.tf_setup: TensorFlow's start-up chatter is dropped, and nothing else is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from t5x_like.runtime import tf_setup

REPO = Path(__file__).resolve().parents[2]

# Lines as TensorFlow 2.x prints them on import (the oneDNN one on CPUs with AVX-512).
START_UP = [
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    b"I0000 00:00:1795549858.121524    6705 cudart_stub.cc:31] Could not find cuda drivers on "
    b"your machine, GPU will not be used.",
    b"E0000 00:00:1795549858.121524    6705 cuda_platform.cc:51] failed call to cuInit: "
    b"INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    b"I0000 00:00:1795549858.121524    6705 port.cc:153] oneDNN custom operations are on. You may "
    b"see slightly different numerical results due to floating-point round-off errors from "
    b"different computation orders. To turn them off, set the environment variable "
    b"`TF_ENABLE_ONEDNN_OPTS=0`.",
]
# What must still reach the user.
KEPT = [
    b"W0000 00:00:1795549858.121524    6705 port.cc:153] something else went wrong",
    b"Traceback (most recent call last):",
    b"oneDNN custom operations are on.",  # not in TensorFlow's log-line format
]


def test_noise_matches_start_up_lines_only() -> None:
    assert all(tf_setup.NOISE.match(line) for line in START_UP)
    assert not any(tf_setup.NOISE.match(line) for line in KEPT)


def test_importing_tensorflow_through_t5x_like_prints_nothing() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL",
                                                             "TF_ENABLE_ONEDNN_OPTS")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    code = ("import t5x_like, tensorflow as tf, seqio, sys\n"
            "print('after', file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True)
    assert out.stderr.decode() == "after\n"  # what is written outside the import still shows


def test_keras_and_pyglove_are_not_imported_with_tensorflow_but_still_work_after() -> None:
    """TensorFlow and TF Text import Keras (and with it scikit-learn, scipy.stats, matplotlib)
    at import, SeqIO PyGlove; through t5x_like they do not, and a later use of either gets the
    real module."""
    code = ("import sys, t5x_like, seqio, tensorflow as tf, tensorflow_text as tft\n"
            "heavy = ('keras', 'sklearn', 'matplotlib', 'scipy.stats', 'pyglove')\n"
            "print(sorted({m.split('.')[0] for m in sys.modules if m.startswith(heavy)}))\n"
            "print(tft.keras.layers.ToDense.__module__, tf.keras.optimizers.Adam.__module__)\n"
            "import keras.src.optimizers as o; print(o.SGD.__name__, type(o).__name__)\n"
            "print(seqio.dataset_providers.pg.hyper.HyperPrimitive.__module__)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["[]", "tensorflow_text.python.keras.layers.todense keras.src.optimizers.adam",
                   "SGD module", "pyglove.core.hyper.base"]


def test_no_autograph_traces_dataset_functions_as_written() -> None:
    import tensorflow as tf

    def absolute(x):
        if x < 0:  # a Python branch on a tensor: only AutoGraph turns it into a tf.cond
            return -x
        return x

    ds = tf.data.Dataset.from_tensor_slices([-2, 3])
    assert list(ds.map(absolute).as_numpy_iterator()) == [2, 3]
    with tf_setup.no_autograph(), pytest.raises(TypeError, match="tf.Tensor"):
        ds.map(absolute)
    assert list(ds.map(absolute).as_numpy_iterator()) == [2, 3]  # switched back on after
