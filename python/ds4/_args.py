"""Argument checks shared by the public API: exact integers and finite floats in a stated range.

Every public entry point that takes a count, size or knob checks it here first, so a wrong value
raises :class:`~ds4.errors.InvalidArgumentError` naming the argument instead of a ``TypeError``
from a binding, an overflow, or a silently truncated ``int(1.9)``::

    >>> check_int(5, "threads", 1)
    5
    >>> check_int(1.9, "token")
    Traceback (most recent call last):
    ...
    ds4.errors.InvalidArgumentError: token must be an integer, got 1.9
"""

from __future__ import annotations

import math
import operator
from typing import Any

from .errors import InvalidArgumentError

__all__ = ["MAX_CTX", "MAX_THREADS", "check_int", "check_float"]

# Session positions, token counts and payload header fields are 32-bit in the core and in the DSV4
# format (docs/robustness.md), so no context can exceed this.
MAX_CTX = 2**31 - 1
# More worker threads than this is a typo, not a machine (each one gets a stack and a slice of work).
MAX_THREADS = 4096


def check_int(value: Any, name: str, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as an int if it is an exact integer (bool excluded) within [lo, hi]."""
    if isinstance(value, bool) or isinstance(value, float):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{name} must be an integer, got {type(value).__name__} {value!r}") from None
    if lo is not None and v < lo:
        raise InvalidArgumentError(f"{name} must be at least {lo}, got {v}")
    if hi is not None and v > hi:
        raise InvalidArgumentError(f"{name} must be at most {hi}, got {v}")
    return v


def check_float(value: Any, name: str, lo: float | None = None, hi: float | None = None, *,
                lo_open: bool = False) -> float:
    """``value`` as a finite float within [lo, hi] (``(lo, hi]`` with ``lo_open``)."""
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be a number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{name} must be a number, got {type(value).__name__} {value!r}") from None
    if not math.isfinite(v):
        raise InvalidArgumentError(f"{name} must be finite, got {v}")
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise InvalidArgumentError(f"{name} must be {'above' if lo_open else 'at least'} {lo}, got {v}")
    if hi is not None and v > hi:
        raise InvalidArgumentError(f"{name} must be at most {hi}, got {v}")
    return v
