"""Comparing an implementation with the reference: logit agreement and field-by-field state diffs.

    >>> from ds4.reference.compare import logit_agreement
    >>> import numpy as np
    >>> a = np.array([[0.0, 1.0, 2.0]], np.float32)
    >>> logit_agreement(a, a + 5).mean_abs            # logits are compared after centring
    0.0

:func:`payload_fields` splits a DSV4 session payload (the engine's ``save`` bytes or
:meth:`ReferenceState.to_payload`) into named arrays (``ds4.payload`` section names), and
:func:`state_differences` reports, per field, the largest difference and whether the NEG
sentinels (-1e30, not yet written) sit in the same places.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..payload import payload_sections, read_payload_info

__all__ = ["LogitAgreement", "logit_agreement", "payload_fields", "FieldDiff", "state_differences"]


@dataclass(frozen=True)
class LogitAgreement:
    """docs/model.md §9's measures over a batch of logit rows (each row centred on its mean first)."""

    max_abs: float
    p99_abs: float
    mean_abs: float
    argmax_agree: float   # fraction of rows with the same argmax
    mean_kl: float        # KL(a || b), natural log, averaged over rows


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def logit_agreement(a: np.ndarray, b: np.ndarray) -> LogitAgreement:
    """Agreement of logit rows ``a`` (the reference side of the KL) and ``b``; 1-D inputs are one row."""
    a = np.atleast_2d(np.asarray(a, dtype=np.float64))
    b = np.atleast_2d(np.asarray(b, dtype=np.float64))
    if a.shape != b.shape:
        raise ValueError(f"logit shapes differ: {a.shape} vs {b.shape}")
    d = np.abs((a - a.mean(axis=1, keepdims=True)) - (b - b.mean(axis=1, keepdims=True)))
    la, lb = _log_softmax(a), _log_softmax(b)
    kl = (np.exp(la) * (la - lb)).sum(axis=1)
    return LogitAgreement(float(d.max()), float(np.percentile(d, 99)), float(d.mean()),
                          float((a.argmax(axis=1) == b.argmax(axis=1)).mean()), float(kl.mean()))


def payload_fields(blob: bytes, ratios: Sequence[int]) -> dict[str, np.ndarray]:
    """Every section of a DSV4 payload as a numpy array (u32 for tokens and counts, else f32)."""
    info = read_payload_info(blob, ratios)
    out: dict[str, np.ndarray] = {}
    for name, off, n in payload_sections(info):
        dt = "<u4" if name in ("header", "tokens", "n_comp", "n_index_comp") else "<f4"
        out[name] = np.frombuffer(blob, dt, n // 4, off)
    return out


@dataclass(frozen=True)
class FieldDiff:
    """Difference of one payload field between two states."""

    name: str
    same_shape: bool
    same_sentinels: bool   # entries <= -5e29 (unwritten frontier slots) in the same places
    max_abs: float         # over entries that are not sentinels in either (inf if shapes differ)
    n_diff: int            # number of entries that differ at all


def state_differences(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[FieldDiff]:
    """Field-by-field comparison of two :func:`payload_fields` results (same field names)."""
    out = []
    for name in a:
        x, y = a[name], b.get(name)
        if y is None or x.shape != y.shape:
            out.append(FieldDiff(name, False, False, float("inf"), -1))
            continue
        if x.dtype.kind == "u":
            n = int((x != y).sum())
            out.append(FieldDiff(name, True, True, float(np.abs(x.astype(np.int64) - y).max(initial=0)), n))
            continue
        sx, sy = x <= -5e29, y <= -5e29
        live = ~(sx | sy)
        md = float(np.abs(x[live].astype(np.float64) - y[live]).max(initial=0.0))
        out.append(FieldDiff(name, True, bool(np.array_equal(sx, sy)), md, int((x != y).sum())))
    return out
