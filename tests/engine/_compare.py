"""Logit comparison statistics between the engine and ds4.reference (MODEL.md §9 conventions).

Rows are centred on their mean before comparing (logits are shift-invariant), KL is
KL(reference || engine) of the softmaxes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LogitStats", "compare_rows", "row_means", "TOL_MEAN_ABS", "TOL_P99_ABS", "TOL_ARGMAX", "TOL_MEAN_KL"]

# Tolerances. The reference accumulates quantised dots in float64 while the engine follows
# upstream's float32 orders, so the two differ like two upstream builds do (MODEL.md §9: upstream's
# strict vs default build, 4-layer tiny model: 0.027-0.034 mean |dlogit|, 97-100% argmax).
# Calibration measured here (tiny, tiny-q4, tiny-pro; model seed 1; 160 teacher-forced tokens):
# the engine's OWN scalar and AVX-512 kernel paths differ from each other by
#     mean 0.031-0.039, p99 0.13-0.54, max 1.27-2.35, argmax 93.1-96.3%, KL 0.0013-0.0061
# and the engine vs the reference by
#     mean 0.037-0.045, p99 0.35-0.57, max 1.69-2.37, argmax 92.5-96.9%, KL 0.0032-0.0056.
# The spikes are isolated rows (about 1 in 20, no drift: the next row is back at ~0.025) where an
# FP8 block scale or a Q8_0 rounding tie flips between float orders (MODEL.md §4.6). So the
# limits sit just above the engine's own build-to-build noise; a real bug moves every later row
# (mean well above 0.1) or flips decisive argmaxes (checked separately in the tests).
TOL_MEAN_ABS = 0.05
TOL_P99_ABS = 0.6
TOL_ARGMAX = 0.90
TOL_MEAN_KL = 0.0075


@dataclass(frozen=True)
class LogitStats:
    rows: int
    max_abs: float
    p99_abs: float
    mean_abs: float
    argmax_agree: float
    mean_kl: float

    def ok(self, argmax: float = TOL_ARGMAX) -> bool:
        return (self.mean_abs <= TOL_MEAN_ABS and self.p99_abs <= TOL_P99_ABS and self.argmax_agree >= argmax
                and self.mean_kl <= TOL_MEAN_KL)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def compare_rows(ours: np.ndarray, ref: np.ndarray) -> LogitStats:
    ours = np.atleast_2d(np.asarray(ours, np.float64))
    ref = np.atleast_2d(np.asarray(ref, np.float64))
    d = np.abs((ours - ours.mean(axis=1, keepdims=True)) - (ref - ref.mean(axis=1, keepdims=True)))
    lp, lq = _log_softmax(ref), _log_softmax(ours)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=1)
    return LogitStats(rows=ours.shape[0], max_abs=float(d.max()), p99_abs=float(np.percentile(d, 99)),
                      mean_abs=float(d.mean()), argmax_agree=float((ours.argmax(1) == ref.argmax(1)).mean()),
                      mean_kl=float(kl.mean()))


def row_means(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Mean |dlogit| of each row (rows centred): a discrete flip shows as one isolated high row."""
    ours = np.atleast_2d(np.asarray(ours, np.float64))
    ref = np.atleast_2d(np.asarray(ref, np.float64))
    return np.abs((ours - ours.mean(axis=1, keepdims=True)) - (ref - ref.mean(axis=1, keepdims=True))).mean(axis=1)
