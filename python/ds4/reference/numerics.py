"""Scalar float32 building blocks shared by every part of the reference (docs/model.md §4.3-§4.4).

Upstream computes in float32 with libm's ``expf``/``sinf``/... (correctly rounded in nearly every
case on glibc). The reference evaluates those functions in float64 and rounds once to float32,
which reproduces a correctly rounded libm. Norms accumulate the sum of squares in float64 exactly
as upstream does.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "F32",
    "NEG",
    "NEG_SKIP",
    "f32",
    "expf",
    "logf",
    "log1pf",
    "sqrtf",
    "sinf",
    "cosf",
    "f16_round",
    "rms_scale",
    "rms_norm",
    "rms_norm_no_weight",
    "head_rms_norm",
    "sigmoid",
    "silu",
    "softplus",
    "dot_f32",
]

F32 = np.float32
NEG = np.float32(-1.0e30)          # DS4_NEG_INF: a finite "minus infinity"
NEG_SKIP = np.float32(-1.0e30 * 0.5)  # scores <= this are treated as masked / empty


def f32(x) -> np.ndarray:
    """``x`` as a float32 array (no copy when it already is one)."""
    return np.asarray(x, dtype=np.float32)


def _libm(fn, x) -> np.ndarray:
    return fn(f32(x).astype(np.float64)).astype(np.float32)


def expf(x) -> np.ndarray:
    with np.errstate(over="ignore", under="ignore"):
        return _libm(np.exp, x)


def logf(x) -> np.ndarray:
    return _libm(np.log, x)


def log1pf(x) -> np.ndarray:
    return _libm(np.log1p, x)


def sqrtf(x) -> np.ndarray:
    return _libm(np.sqrt, x)


def sinf(x) -> np.ndarray:
    return _libm(np.sin, x)


def cosf(x) -> np.ndarray:
    return _libm(np.cos, x)


def f16_round(x) -> np.ndarray:
    """The f32 -> f16 -> f32 round trip (IEEE round-to-nearest-even, overflow to inf)."""
    with np.errstate(over="ignore"):
        return f32(x).astype(np.float16).astype(np.float32)


def rms_scale(x: np.ndarray, eps: float) -> np.float32:
    """``1/sqrtf((float)(Σ(double)x² / n) + eps)`` over all of ``x`` (docs/model.md §4.3)."""
    xd = f32(x).astype(np.float64).reshape(-1)
    ss = float(np.dot(xd, xd))
    mean = np.float32(ss / xd.size)
    return np.float32(np.float32(1.0) / sqrtf(mean + np.float32(eps)))


def rms_norm_no_weight(x: np.ndarray, eps: float) -> np.ndarray:
    return (f32(x) * rms_scale(x, eps)).astype(np.float32)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """``(x*s)*w``, left to right, in float32."""
    return ((f32(x) * rms_scale(x, eps)).astype(np.float32) * f32(w)).astype(np.float32)


def head_rms_norm(x: np.ndarray, n_head: int, head_dim: int, eps: float) -> np.ndarray:
    """Per-head RMSNorm without weight over ``n_head`` consecutive ``head_dim`` slices."""
    h = f32(x).reshape(n_head, head_dim)
    hd = h.astype(np.float64)
    ss = np.einsum("ij,ij->i", hd, hd)
    mean = (ss / head_dim).astype(np.float32)
    s = (np.float32(1.0) / sqrtf(mean + np.float32(eps))).astype(np.float32)
    return (h * s[:, None]).astype(np.float32).reshape(-1)


def sigmoid(x) -> np.ndarray:
    """Upstream ``sigmoid_stable``: ``1/(1+e^-x)`` for x >= 0, ``e^x/(1+e^x)`` otherwise."""
    x = f32(x)
    pos = x >= 0
    e = expf(np.where(pos, -x, x))
    one = np.float32(1.0)
    return np.where(pos, one / (one + e), e / (one + e)).astype(np.float32)


def silu(x) -> np.ndarray:
    x = f32(x)
    return (x * sigmoid(x)).astype(np.float32)


def softplus(x) -> np.ndarray:
    """Upstream ``softplus_stable``: x above 20, ``expf(x)`` below -20, else ``log1pf(expf(x))``."""
    x = f32(x)
    mid = log1pf(expf(np.clip(x, -20, 20)))
    return np.where(x > 20, x, np.where(x < -20, expf(x), mid)).astype(np.float32)


def dot_f32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Float dot products (attention, indexer) accumulated in float64, rounded to float32.

    ``a`` may be a matrix of rows; the result has one value per row.
    """
    return (f32(a).astype(np.float64) @ f32(b).astype(np.float64)).astype(np.float32)
