"""argparse value types shared by the commands: a bad value is a usage error (exit 2) naming the flag."""

from __future__ import annotations

import argparse
import math
from typing import Callable

__all__ = ["positive_int", "bounded_float"]


def positive_int(flag: str) -> Callable[[str], int]:
    """An integer > 0."""
    def conv(v: str) -> int:
        try:
            n = int(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} expects an integer, got {v!r}") from None
        if n <= 0:
            raise argparse.ArgumentTypeError(f"{flag} must be > 0, got {n}")
        return n
    return conv


def bounded_float(flag: str, lo: float, hi: float) -> Callable[[str], float]:
    """A finite number in [lo, hi]."""
    def conv(v: str) -> float:
        try:
            f = float(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} expects a number, got {v!r}") from None
        if not math.isfinite(f) or not lo <= f <= hi:
            raise argparse.ArgumentTypeError(f"{flag} {v}: expected a value in [{lo:g}, {hi:g}]")
        return f
    return conv
