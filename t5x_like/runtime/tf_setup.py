"""How t5x_like loads TensorFlow, which it uses only for tf.data input pipelines (SeqIO).

`install()` (run by `import t5x_like`) arranges that, when TensorFlow is first imported:
- TensorFlow sees no GPU, so it never takes accelerator memory that JAX needs;
- the start-up lines a user reads as failures (`NOISE`: without CUDA an absl "before
  InitializeLog" banner and "Could not find cuda drivers", with AVX-512 "oneDNN custom operations
  are on", which TF_CPP_MIN_LOG_LEVEL does not silence, and "failed call to cuInit" from hiding
  the GPUs) are dropped; anything else it writes to stderr meanwhile passes through;
- C++ warnings are off (`TF_CPP_MIN_LOG_LEVEL=2` unless set): e.g. "did not fully read the
  dataset being cached", which every run that stops inside a cached epoch triggers, by design.

`no_autograph()` builds input pipelines with their functions traced as written.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType

#: stderr lines of TensorFlow's import and GPU probe that report nothing wrong.
NOISE = re.compile(
    rb"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|\S+ +\S+ +\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine.*"
    rb"|\S+ +\S+ +\d+ cuda_platform\.cc:\d+\] failed call to cuInit: .*"
    rb"|\S+ +\S+ +\d+ port\.cc:\d+\] oneDNN custom operations are on\. .*)$")


@contextlib.contextmanager
def drop_stderr_lines(pattern: re.Pattern[bytes]) -> Iterator[None]:
    """Hold what native code and Python write to fd 2; replay the lines not matching."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().splitlines(keepends=True)
                    if not pattern.match(line.rstrip(b"\n"))]
            if kept:
                os.write(2, b"".join(kept))


@contextlib.contextmanager
def no_autograph() -> Iterator[None]:
    """Trace the tf.data functions made inside as written, without AutoGraph: t5x_like's use
    `tf.while_loop` / `tf.cond` where they branch, and SeqIO's need no conversion either, while
    converting them (about 40 functions, source rewritten to files under /tmp) cost each
    training process ~5 s. A function that relies on conversion fails loudly when traced."""
    from tensorflow.python.autograph.core import ag_ctx  # TF's switch; no public equivalent

    with ag_ctx.ControlStatusCtx(status=ag_ctx.Status.DISABLED):
        yield


class _QuietLoader(importlib.abc.Loader):
    """Runs TensorFlow's own loader with its noise dropped, then hides the GPUs from it."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TensorFlowFinder)]
        with drop_stderr_lines(NOISE):
            self._loader.exec_module(module)
            module.config.set_visible_devices([], "GPU")


class _TensorFlowFinder(importlib.abc.MetaPathFinder):
    """Wraps the loader of the top-level ``tensorflow`` package until it is executed (a mere
    ``find_spec('tensorflow')``, e.g. a library checking what is installed, leaves it in place)."""

    def __init__(self) -> None:
        self._finding = False

    def find_spec(self, name: str, path: object, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if name != "tensorflow" or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding = False
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


def install() -> None:
    """Apply the settings above to the first ``import tensorflow`` of this process."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "tensorflow" in sys.modules or any(isinstance(f, _TensorFlowFinder)
                                          for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _TensorFlowFinder())
