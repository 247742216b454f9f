"""FP8 E4M3FN round trip of KV rows (docs/model.md §3.5).

Dims ``0 .. n_nope-1`` of a row are quantised in blocks of 64 with a power-of-two scale; the RoPE
tail is left alone. The nearest E4M3 code wins and an exact tie goes to the even code.
"""

from __future__ import annotations

import numpy as np

from .numerics import f32

__all__ = ["E4M3_VALUES", "e4m3_round", "pow2_scale", "fp8_kv_roundtrip"]


def _e4m3_value(i: int) -> float:
    e, m = i >> 3, i & 7
    return m * 2.0**-9 if e == 0 else (1.0 + m / 8.0) * 2.0 ** (e - 7)


# The 127 finite non-negative E4M3FN values, code 0 .. 126 (126 = 448).
E4M3_VALUES = np.array([_e4m3_value(i) for i in range(127)], dtype=np.float32)


def e4m3_round(v: np.ndarray) -> np.ndarray:
    """``sign(v) * nearest E4M3 value of |v|`` (|v| clamped to 448); ties to the even code."""
    v = f32(v)
    sign = np.where(v < 0, np.float32(-1.0), np.float32(1.0))
    ax = np.minimum(np.abs(v), np.float32(448.0))
    lo = np.searchsorted(E4M3_VALUES, ax, side="right") - 1  # largest code <= ax
    hi = np.minimum(lo + 1, 126)
    best_diff = np.abs(ax - E4M3_VALUES[lo])
    next_diff = np.abs(ax - E4M3_VALUES[hi])
    up = (lo < 126) & ((next_diff < best_diff) | ((next_diff == best_diff) & (hi % 2 == 0) & (lo % 2 == 1)))
    code = np.where(up, hi, lo)
    return (sign * E4M3_VALUES[code]).astype(np.float32)


def pow2_scale(amax: np.ndarray, qmax: float) -> np.ndarray:
    """``ldexpf(1, ceilf(log2f(amax/qmax)))`` with log2f rounded to float32 like libm."""
    ratio = (f32(amax) / np.float32(qmax)).astype(np.float32)
    lg = np.log2(ratio.astype(np.float64)).astype(np.float32)
    return np.ldexp(np.float32(1.0), np.ceil(lg).astype(np.int32)).astype(np.float32)


def fp8_kv_roundtrip(row: np.ndarray, n_rot: int) -> np.ndarray:
    """E4M3 round trip of dims ``0 .. len-n_rot-1`` in blocks of 64 (a copy; the tail is kept)."""
    out = f32(row).copy()
    n_nope = out.size - n_rot
    if n_nope % 64:
        raise ValueError(f"FP8 KV round trip needs head_dim - n_rot ({n_nope}) to be a multiple of 64")
    blocks = out[:n_nope].reshape(-1, 64)
    amax = np.maximum(np.abs(blocks).max(axis=1), np.float32(1.0e-4))
    scale = pow2_scale(amax, 448.0)
    v = np.clip(blocks / scale[:, None], np.float32(-448.0), np.float32(448.0)).astype(np.float32)
    out[:n_nope] = (e4m3_round(v) * scale[:, None]).astype(np.float32).reshape(-1)
    return out
