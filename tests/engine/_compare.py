"""Logit comparison statistics between the engine and ds4.reference (docs/validation.md conventions).

Rows are centred on their mean before comparing (logits are shift-invariant), KL is
KL(reference || engine) of the softmaxes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LogitStats", "compare_rows", "row_means", "decisive_rows", "rows_ok", "TOL_MEAN_ABS", "TOL_P99_ABS",
           "TOL_ARGMAX", "TOL_MEAN_KL", "NEAR_TIE", "ROW_MEDIAN", "ROW_TYPICAL", "ROW_SPIKE"]

# Tolerances. The reference accumulates quantised dots in float64 while the engine follows
# upstream's float32 orders, so the two differ like two upstream builds do (docs/validation.md:
# upstream's strict vs fast-math build on the 4-layer tiny model, 150/600 tokens: mean 0.033,
# p99 0.24-0.25, argmax 96 %, KL 0.0018-0.0021).
# Measured here (tiny-q2, tiny-q4, tiny-pro-q2; model seed 1; 160 teacher-forced tokens; scalar
# and AVX-512 VNNI paths), engine vs reference:
#     mean 0.037-0.045, p99 0.35-0.57, max 1.75-2.37, argmax 93.1-96.9 %, KL 0.0035-0.0056
# and the same rows perturbed as a real bug would (tests/engine/test_compare_bounds.py checks
# each bound below catches both):
#     + N(0, 0.4) noise: mean 0.33, p99 1.07-1.09, argmax 57-64 %, KL 0.082-0.085
#     x 1.3 scaling:     mean 0.36-0.37, p99 1.19-1.23, argmax unchanged, KL 0.092-0.095
# The spikes are isolated rows (about 1 in 20, no drift: the next row is back at ~0.025) where an
# FP8 block scale or a Q8_0 rounding tie flips between float orders (docs/validation.md). So each
# limit sits just above the measured worst case and far below the perturbed values.
TOL_MEAN_ABS = 0.05    # measured <= 0.045; noise/scale 0.33-0.37
TOL_P99_ABS = 0.6      # measured <= 0.57 (a spike row's tail); noise/scale >= 1.07
TOL_ARGMAX = 0.90      # measured >= 0.93; noise <= 0.64 (scale-invariant: KL and mean catch scaling)
TOL_MEAN_KL = 0.0075   # measured <= 0.0056; noise/scale >= 0.082

# A reference row whose top-1/top-2 margin exceeds this must give the same argmax. Measured: the
# largest change of a top-1/top-2 margin between engine and reference over the 960 rows above is
# 0.995, and the widest margin that flipped is 0.754; 1.2 leaves 20 % headroom. About 5-10 % of
# the rows are that decisive (the 90th margin percentile is 0.85-1.05).
NEAR_TIE = 1.2

# One row on its own (the last row of a prefill): a spike row reaches a mean |dlogit| of 0.64
# (the worst of the 960 rows above) while a typical row is ~0.027, so a single row is judged with
# the others of its test: median row <= ROW_MEDIAN, at most one row in four above ROW_TYPICAL,
# every row <= ROW_SPIKE. N(0, 0.4) noise puts every row at ~0.33, x1.3 at ~0.37.
ROW_MEDIAN = 0.07
ROW_TYPICAL = 0.1
ROW_SPIKE = 0.75


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


def decisive_rows(ref: np.ndarray) -> np.ndarray:
    """Mask of the reference rows whose top-1/top-2 margin exceeds NEAR_TIE."""
    srt = np.sort(np.atleast_2d(ref), axis=1)
    return (srt[:, -1] - srt[:, -2]) > NEAR_TIE


def rows_ok(rows: np.ndarray) -> bool:
    """Row means (from row_means) judged one by one: no drift, spikes rare and bounded."""
    rows = np.asarray(rows)
    return bool(np.median(rows) <= ROW_MEDIAN and (rows > ROW_TYPICAL).mean() <= 0.25
                and rows.max() <= ROW_SPIKE)
