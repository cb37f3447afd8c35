"""How t5x_like loads TensorFlow, which it uses only for tf.data input pipelines (SeqIO).

`install()` (run by `import t5x_like`) arranges that, when TensorFlow is first imported:
- TensorFlow sees no GPU, so it never takes accelerator memory that JAX needs;
- the start-up lines a user reads as failures (`NOISE`: without CUDA an absl "before
  InitializeLog" banner and "Could not find cuda drivers", with AVX-512 "oneDNN custom operations
  are on", which TF_CPP_MIN_LOG_LEVEL does not silence, and "failed call to cuInit" from hiding
  the GPUs) are dropped; anything else it writes to stderr meanwhile passes through;
- C++ warnings are off (`TF_CPP_MIN_LOG_LEVEL=2` unless set): e.g. "did not fully read the
  dataset being cached", which every run that stops inside a cached epoch triggers, by design.
- Keras, which TensorFlow and TF Text import eagerly but tf.data never uses, is not imported
  (`DEFERRED`): with it came scikit-learn, scipy.stats and matplotlib, ~2.5 s of every
  process's start-up (each CLI, each sweep cell, each test subprocess). A later `import keras`
  or `tf.keras` still gets the real Keras. Likewise PyGlove, which SeqIO imports for one
  mixture class t5x_like never builds (~0.5 s).

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


#: Per package: the modules its ``__init__`` imports that tf.data never uses, which stand
#: deferred while it loads (TensorFlow: Keras' optimizers, to register them for SavedModel;
#: TF Text: its Keras layers; SeqIO: PyGlove, for `PyGloveTunableMixture` alone).
DEFERRED = {"tensorflow": ("keras.src.optimizers",),
            "tensorflow_text": ("tensorflow_text.python.keras",),
            "seqio": ("pyglove",)}


class _Deferred(ModuleType):
    """Stands in ``sys.modules`` for a module while a package's ``__init__`` imports it; once
    the package is loaded it is taken out again, and its first attribute read imports the real
    module (``tensorflow_text.keras.layers`` still works)."""

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        if sys.modules.get(self.__name__) is self:  # read while the package is still loading
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), name)


@contextlib.contextmanager
def _deferred(names: tuple[str, ...]) -> Iterator[None]:
    placed = [n for n in names if n not in sys.modules]
    for name in placed:
        sys.modules[name] = _Deferred(name)
    try:
        yield
    finally:
        for name in placed:
            if isinstance(sys.modules.get(name), _Deferred):
                del sys.modules[name]


class _QuietLoader(importlib.abc.Loader):
    """Runs the package's own loader with TensorFlow's noise dropped and its `DEFERRED`
    modules deferred, then (TensorFlow) hides the GPUs from it."""

    def __init__(self, loader: importlib.abc.Loader, name: str) -> None:
        self._loader, self._name = loader, name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with drop_stderr_lines(NOISE), _deferred(DEFERRED[self._name]):
            self._loader.exec_module(module)
            if self._name == "tensorflow":
                module.config.set_visible_devices([], "GPU")
        if all(n in sys.modules for n in DEFERRED):
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TensorFlowFinder)]


class _TensorFlowFinder(importlib.abc.MetaPathFinder):
    """Wraps the loaders of the top-level packages in `DEFERRED` (a mere
    ``find_spec('tensorflow')``, e.g. a library checking what is installed, leaves them in
    place), until all are loaded."""

    def __init__(self) -> None:
        self._finding = False

    def find_spec(self, name: str, path: object, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if name not in DEFERRED or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding = False
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader, name)
        return spec


def install() -> None:
    """Apply the settings above to this process's first ``import tensorflow`` (and
    ``tensorflow_text``, ``seqio``)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if all(n in sys.modules for n in DEFERRED) or any(isinstance(f, _TensorFlowFinder)
                                                      for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _TensorFlowFinder())
