"""Range-checked `type=` functions for the numeric flags of the command-line tools.

    p.add_argument("--batch_size", type=flags.positive_int, default=32)

A bad value is refused by argparse before anything is loaded: one usage line and
`error: argument --batch_size: must be an integer >= 1, got '0'`, exit status 2. Floats must be
finite (no `nan` / `inf`). Depends on argparse only, so every CLI can import it first.
"""

from __future__ import annotations

import argparse
import math

__all__ = ["mesh_shape", "non_negative_float", "non_negative_int", "positive_float",
           "positive_int", "unit_interval"]


def _int(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < least:
        raise argparse.ArgumentTypeError(f"must be an integer >= {least}, got {text!r}")
    return value


def _float(text: str, what: str, ok: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and ok(value)):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (counts, sizes, lengths)."""
    return _int(text, 1)


def non_negative_int(text: str) -> int:
    """An integer >= 0 (steps, seeds, `0 = off` settings)."""
    return _int(text, 0)


def positive_float(text: str) -> float:
    """A finite number > 0 (memory sizes)."""
    return _float(text, "a number > 0", lambda v: v > 0)


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (temperatures, penalties)."""
    return _float(text, "a number >= 0", lambda v: v >= 0)


def unit_interval(text: str) -> float:
    """A number in (0, 1] (probabilities such as top-p)."""
    return _float(text, "a number in (0, 1]", lambda v: 0 < v <= 1)


def mesh_shape(text: str) -> tuple[int, ...]:
    """`data,fsdp,model`: three integers >= 1, or -1 for one of them (all remaining devices)."""
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 3 or any(s < 1 and s != -1 for s in shape) or shape.count(-1) > 1:
        raise argparse.ArgumentTypeError(
            f"must be data,fsdp,model: three integers >= 1 (one may be -1), got {text!r}")
    return shape
