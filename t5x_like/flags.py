"""Range-checked `type=` functions for the numeric flags of the command-line tools.

    p.add_argument("--batch_size", type=flags.positive_int, default=32)

A bad value is refused by argparse before anything is loaded: one usage line and
`error: argument --batch_size: must be an integer >= 1, got '0'`, exit status 2. Floats must be
finite (no `nan` / `inf`). Standard library only, so every CLI can import it first.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

__all__ = ["mesh_shape", "non_negative_float", "non_negative_int", "positive_float",
           "positive_int", "unit_interval"]


def _checked(text: str, parse: Callable[[str], Any], ok: Callable[[Any], bool], what: str) -> Any:
    """`parse(text)` if it parses and is `ok`, else the argparse error "must be {what}"."""
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (counts, sizes, lengths)."""
    return _checked(text, int, lambda v: v >= 1, "an integer >= 1")


def non_negative_int(text: str) -> int:
    """An integer >= 0 (steps, seeds, `0 = off` settings)."""
    return _checked(text, int, lambda v: v >= 0, "an integer >= 0")


def positive_float(text: str) -> float:
    """A finite number > 0 (memory sizes)."""
    return _checked(text, float, lambda v: math.isfinite(v) and v > 0, "a number > 0")


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (temperatures, penalties)."""
    return _checked(text, float, lambda v: math.isfinite(v) and v >= 0, "a number >= 0")


def unit_interval(text: str) -> float:
    """A number in (0, 1] (probabilities such as top-p)."""
    return _checked(text, float, lambda v: 0 < v <= 1, "a number in (0, 1]")


def mesh_shape(text: str) -> tuple[int, ...]:
    """`data,fsdp,model`: three integers >= 1, or -1 for one of them (all remaining devices)."""
    return _checked(text, lambda t: tuple(int(x) for x in t.split(",")),
                    lambda s: len(s) == 3 and all(x >= 1 or x == -1 for x in s) and s.count(-1) < 2,
                    "data,fsdp,model: three integers >= 1 (one may be -1)")
