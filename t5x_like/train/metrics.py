"""Training metrics: peak FLOP/s per device kind, MFU, and writers (console, JSONL, TensorBoard).

Only process 0 writes files. ``metrics.jsonl`` holds one JSON object per line:
``{"step": int, "split": "train"|"eval", "time": unix seconds, <metric>: float, ...}``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

#: Dense bf16 peak FLOP/s per chip, matched by substring of ``jax.Device.device_kind`` (lowercase).
#: Order matters: more specific names first.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("h200", 989e12), ("h100", 989e12), ("gh200", 989e12), ("a100", 312e12),
    ("tpu v5 lite", 197e12), ("tpu v5e", 197e12),  # v5e reports "TPU v5 lite"
    ("tpu v5p", 459e12), ("tpu v5", 459e12),  # v5p reports "TPU v5"
    ("tpu v6 lite", 918e12), ("tpu v4", 275e12),  # v6e (Trillium) reports "TPU v6 lite"
)


def peak_flops_per_device(device_kind: str) -> float | None:
    """Peak dense bf16 FLOP/s for a device kind, or None when unknown (e.g. CPU)."""
    kind = device_kind.lower()
    return next((flops for key, flops in PEAK_BF16_FLOPS if key in kind), None)


def mfu(model_flops_per_second: float, num_devices: int, device_kind: str) -> float | None:
    """Model FLOP utilisation over all devices; None when the device's peak is unknown."""
    peak = peak_flops_per_device(device_kind)
    if peak is None or num_devices <= 0:
        return None
    return model_flops_per_second / (peak * num_devices)


def throughput(*, steps: int, seconds: float, batch_size: int, tokens_per_seq: int,
               flops_per_step: float, devices: int, device_kind: str) -> dict[str, float | None]:
    """Rates over ``steps`` steps that took ``seconds`` of wall time (None when not measurable).

    The trainer times the interval between two metric reads; each read waits for its step to
    finish on the device, so the rate is the device's step rate even though the host reads the
    metrics one step late. Keys: steps/examples/tokens/model-FLOPs per second and ``mfu``.
    """
    rate = steps / seconds if steps and seconds > 0 else float("nan")
    flops_s = flops_per_step * rate
    rates = {
        "steps_per_second": rate,
        "examples_per_second": rate * batch_size,
        "tokens_per_second": rate * batch_size * tokens_per_seq,
        "model_flops_per_second": flops_s,
        "mfu": mfu(flops_s, devices, device_kind),
    }
    return rates if math.isfinite(rate) else dict.fromkeys(rates)


def _fmt(value: float) -> str:
    if value == 0 or not math.isfinite(value):
        return f"{value}"
    if abs(value) >= 1e4 or abs(value) < 1e-3:
        return f"{value:.3e}"
    return f"{value:.4g}"


def _si(value: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.1f}"


class MetricsWriter:
    """Writes metric dicts to the console, ``metrics.jsonl`` and TensorBoard (process 0 only)."""

    def __init__(self, model_dir: str, *, enabled: bool = True, tensorboard: bool = True,
                 stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self._jsonl: TextIO | None = None
        self._tb: Any = None
        if not enabled:
            return
        os.makedirs(model_dir, exist_ok=True)
        self._jsonl = open(os.path.join(model_dir, "metrics.jsonl"), "a", encoding="utf-8")
        if tensorboard:  # TensorFlow's event writer: loaded for tf.data anyway (tensorboardX
            import tensorflow as tf  # cost 3 s per process: it imports torch where installed)

            self._tb = tf.summary.create_file_writer(model_dir, flush_millis=10_000)

    def write(self, step: int, split: str, metrics: Mapping[str, float | None]) -> None:
        """Record ``metrics`` at ``step`` (None values go to JSONL as null, skipped elsewhere)."""
        if not self.enabled:
            return
        clean = {k: (None if v is None else float(v)) for k, v in metrics.items()}
        assert self._jsonl is not None
        row = {"step": int(step), "split": split, "time": time.time(), **clean}
        try:
            self._jsonl.write(json.dumps(row) + "\n")
            self._jsonl.flush()
        except OSError as err:  # a full disk: name the file (Python's own error does not)
            raise OSError(err.errno, err.strerror, self._jsonl.name) from err
        if self._tb is not None:  # TensorBoard's classic scalars (simple_value)
            import tensorflow as tf

            values = [tf.compat.v1.Summary.Value(tag=f"{split}/{key}", simple_value=value)
                      for key, value in clean.items() if value is not None and math.isfinite(value)]
            with self._tb.as_default():
                tf.summary.experimental.write_raw_pb(
                    tf.compat.v1.Summary(value=values).SerializeToString(), step=int(step))

    def rewind(self, step: int) -> int:
        """Drop ``metrics.jsonl`` rows after ``step``: a run resumed from that checkpoint logs
        those steps again. A partial last line (killed mid-write) goes too. Returns the count."""
        if not self.enabled or self._jsonl is None:
            return 0
        path = self._jsonl.name
        self._jsonl.close()
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        keep = []
        for line in lines:
            try:
                if int(json.loads(line)["step"]) <= step:
                    keep.append(line)
            except (ValueError, KeyError, TypeError):
                pass
        if len(keep) != len(lines):
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in keep))
            os.replace(path + ".tmp", path)
        self._jsonl = open(path, "a", encoding="utf-8")
        return len(lines) - len(keep)

    def console(self, line: str) -> None:
        """Print one progress/status line (process 0 only)."""
        if self.enabled:
            print(line, file=self.stream, flush=True)

    def progress(self, step: int, total: int, metrics: Mapping[str, float | None]) -> None:
        """The console progress line: loss, lr, examples/s, tokens/s, FLOP/s and MFU."""
        m = dict(metrics)
        parts = [f"step {step}/{total}"]
        parts += [f"{key} {_fmt(m[key])}" for key in ("loss", "accuracy", "learning_rate",
                                                       "grad_norm") if m.get(key) is not None]
        if m.get("examples_per_second") is not None:
            parts.append(f"{m['examples_per_second']:.1f} ex/s")
        if m.get("tokens_per_second") is not None:
            parts.append(f"{_si(m['tokens_per_second'])} tok/s")
        if m.get("model_flops_per_second") is not None:
            parts.append(f"{_si(m['model_flops_per_second'])}FLOP/s")
        parts.append("MFU n/a" if m.get("mfu") is None else f"MFU {100 * m['mfu']:.1f}%")
        self.console(" | ".join(parts))

    def close(self) -> None:
        """Flush and close files."""
        if self._jsonl is not None:
            jsonl, self._jsonl = self._jsonl, None
            try:
                jsonl.close()
            except OSError as err:
                raise OSError(err.errno, err.strerror, jsonl.name) from err
        if self._tb is not None:
            self._tb.close()
            self._tb = None
