"""RoPE / YaRN on the trailing ``n_rot`` dims of each head (docs/model.md §3.4).

Pairs are adjacent elements of the tail (interleaved, GPT-J style). The per-pair angle is built by
repeated float32 multiplication (``theta *= theta_scale``), not ``powf`` per pair. Compressed
layers use the compressed-layer base and YaRN frequency blending without magnitude scaling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..shape import ModelShape
from .numerics import cosf, f32, logf, sinf

__all__ = ["RopeParams", "rope_params", "yarn_corr_dims", "rope_angles", "rope_tail"]


@dataclass(frozen=True)
class RopeParams:
    """RoPE parameters of one layer (upstream ``rope_tail_layer_inplace``)."""

    n_rot: int
    freq_base: float
    freq_scale: float = 1.0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    n_ctx_orig: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0


def rope_params(shape: ModelShape, ratio: int) -> RopeParams:
    """Dense layers (ratio 0): plain RoPE on ``rope_freq_base``; compressed layers: YaRN."""
    if ratio == 0:
        return RopeParams(shape.n_rot, float(np.float32(shape.rope_freq_base)))
    freq_scale = 1.0
    if shape.rope_scale_factor > 0:
        freq_scale = float(np.float32(1.0) / np.float32(shape.rope_scale_factor))
    ext = 1.0 if shape.rope_scale_factor > 1.0 else 0.0
    attn = np.float32(1.0)
    if ext != 0.0 and freq_scale > 0.0:
        # Upstream pre-divides by YaRN's magnitude factor so that it cancels (DS4 has no mscale).
        attn = np.float32(attn / (np.float32(1.0) + np.float32(0.1) * logf(np.float32(1.0) / np.float32(freq_scale))))
    base = shape.compress_rope_freq_base if shape.compress_rope_freq_base > 0 else shape.rope_freq_base
    return RopeParams(shape.n_rot, float(np.float32(base)), freq_scale, ext, float(attn),
                      int(shape.rope_orig_ctx), shape.yarn_beta_fast, shape.yarn_beta_slow)


def yarn_corr_dims(p: RopeParams) -> tuple[np.float32, np.float32]:
    """(low, high) pair indices of the YaRN ramp, as float32 like upstream."""

    def corr(beta: float) -> np.float32:
        num = logf(np.float32(np.float32(p.n_ctx_orig) / (np.float32(beta) * np.float32(2.0) * np.float32(math.pi))))
        return np.float32(np.float32(p.n_rot) * num / (np.float32(2.0) * logf(np.float32(p.freq_base))))

    low = max(np.float32(0.0), np.float32(math.floor(corr(p.beta_fast))))
    high = min(np.float32(p.n_rot - 1), np.float32(math.ceil(corr(p.beta_slow))))
    return np.float32(low), np.float32(high)


def rope_angles(p: RopeParams, pos: int) -> tuple[np.ndarray, np.ndarray]:
    """``(c, s)`` per pair for position ``pos`` (forward sign), float32[n_rot/2] each."""
    n_pairs = p.n_rot // 2
    # powf(base, -2/n_rot): evaluate in double from the float32 operands, round once
    theta_scale = np.float32(np.power(np.float64(np.float32(p.freq_base)), np.float64(np.float32(-2.0 / p.n_rot))))
    extrap = np.empty(n_pairs, dtype=np.float32)
    t = np.float32(pos)
    for k in range(n_pairs):
        extrap[k] = t
        t = np.float32(t * theta_scale)
    fs = np.float32(p.freq_scale)
    interp = (fs * extrap).astype(np.float32)
    mscale = np.float32(p.attn_factor)
    if p.ext_factor != 0.0:
        low, high = yarn_corr_dims(p)
        k = np.arange(n_pairs, dtype=np.float32)
        y = ((k - low) / np.maximum(np.float32(0.001), np.float32(high - low))).astype(np.float32)
        ramp = (np.float32(1.0) - np.minimum(np.float32(1.0), np.maximum(np.float32(0.0), y))).astype(np.float32)
        ramp = (ramp * np.float32(p.ext_factor)).astype(np.float32)
        theta = (interp * (np.float32(1.0) - ramp) + extrap * ramp).astype(np.float32)
        mscale = np.float32(mscale * (np.float32(1.0) + np.float32(0.1) * logf(np.float32(1.0) / fs)))
    else:
        theta = interp
    c = (cosf(theta) * mscale).astype(np.float32)
    s = (sinf(theta) * mscale).astype(np.float32)
    return c, s


def rope_tail(x: np.ndarray, n_head: int, head_dim: int, p: RopeParams, pos: int,
              inverse: bool = False) -> np.ndarray:
    """Rotate the last ``n_rot`` dims of each of ``n_head`` heads (a copy); ``inverse`` undoes it."""
    out = f32(x).reshape(n_head, head_dim).copy()
    c, s = rope_angles(p, pos)
    if inverse:
        s = (-s).astype(np.float32)
    tail = out[:, head_dim - p.n_rot:]
    x0 = tail[:, 0::2].copy()
    x1 = tail[:, 1::2].copy()
    tail[:, 0::2] = x0 * c - x1 * s
    tail[:, 1::2] = x0 * s + x1 * c
    return out.reshape(np.shape(x))
