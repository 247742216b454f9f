"""Hadamard-128 rotation and FP4 (E2M1) round trip of indexer rows (docs/model.md §4.5)."""

from __future__ import annotations

import numpy as np

from .fp8 import pow2_scale
from .numerics import f32

__all__ = ["E2M1_VALUES", "HADAMARD_SCALE", "hadamard128", "e2m1_round", "fp4_roundtrip", "indexer_qat"]

E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
HADAMARD_SCALE = np.float32(0.08838834764831845)  # 1/sqrt(128)


def hadamard128(x: np.ndarray) -> np.ndarray:
    """Unnormalised Walsh-Hadamard butterfly (Sylvester order) on the last axis, then ×1/√128."""
    y = f32(x).copy()
    if y.shape[-1] != 128:
        raise ValueError(f"Hadamard-128 needs rows of 128, got {y.shape[-1]}")
    lead = y.shape[:-1]
    stride = 1
    while stride < 128:
        v = y.reshape(*lead, 128 // (2 * stride), 2, stride)
        a, b = v[..., 0, :].copy(), v[..., 1, :].copy()
        v[..., 0, :] = a + b
        v[..., 1, :] = a - b
        stride *= 2
    return (y * HADAMARD_SCALE).astype(np.float32)


def e2m1_round(v: np.ndarray) -> np.ndarray:
    """``sign(v) * nearest E2M1 value of |v|`` (|v| clamped to 6); ties go to the even code."""
    v = f32(v)
    sign = np.where(v < 0, np.float32(-1.0), np.float32(1.0))
    ax = np.minimum(np.abs(v), np.float32(6.0))
    best = np.zeros(ax.shape, dtype=np.int64)
    best_diff = np.abs(ax - E2M1_VALUES[0])
    for i in range(1, 8):  # upstream's scan: strictly better, or equal and moving odd -> even
        diff = np.abs(ax - E2M1_VALUES[i])
        take = (diff < best_diff) | ((diff == best_diff) & (i % 2 == 0) & (best % 2 == 1))
        best = np.where(take, i, best)
        best_diff = np.where(take, diff, best_diff)
    return (sign * E2M1_VALUES[best]).astype(np.float32)


def fp4_roundtrip(x: np.ndarray) -> np.ndarray:
    """FP4 round trip over blocks of 32 along the flattened input (scale 2^ceil(log2(amax/6)))."""
    x = f32(x)
    blocks = x.reshape(-1, 32)
    amax = np.maximum(np.abs(blocks).max(axis=1), np.float32(7.052966104933725e-38))
    scale = pow2_scale(amax, 6.0)
    v = np.clip(blocks / scale[:, None], np.float32(-6.0), np.float32(6.0)).astype(np.float32)
    return (e2m1_round(v) * scale[:, None]).astype(np.float32).reshape(x.shape)


def indexer_qat(rows: np.ndarray) -> np.ndarray:
    """Hadamard-128 then FP4 on each 128-wide row (indexer Q heads and indexer cache rows)."""
    return fp4_roundtrip(hadamard128(rows))
