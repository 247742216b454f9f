"""Hyper-connections: the ``n_hc`` residual streams around every sublayer (docs/model.md §3.1, §3.9, §3.11).

* :func:`hc_pre` mixes the streams into one sublayer input and produces the post gates and the
  Sinkhorn-normalised ``n_hc × n_hc`` combine matrix;
* :func:`hc_post` writes a sublayer output back into the streams;
* :func:`hc_collapse` is the output head's final reduction (sigmoid weights, no Sinkhorn).

The combine matrix is stored flat as ``comb[n_hc*a + b]``: ``a`` is the source stream read from
the residual, ``b`` the destination stream written by HC post.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .numerics import expf, f32, rms_norm_no_weight, sigmoid
from .quant import FLOAT_ACT, matvec_weights

__all__ = ["HcSplit", "sinkhorn", "hc_split", "hc_weighted_sum", "hc_pre", "hc_post", "hc_collapse"]

_ONE = np.float32(1.0)


@dataclass
class HcSplit:
    """Result of the HC pre mixer: stream weights, post gates and the combine matrix."""

    pre: np.ndarray    # float32[n_hc], sigmoid + eps
    post: np.ndarray   # float32[n_hc], 2·sigmoid
    comb: np.ndarray   # float32[n_hc, n_hc], comb[a, b] (a = source, b = destination)


def sinkhorn(logits: np.ndarray, iters: int, eps: float) -> np.ndarray:
    """Sinkhorn normalisation with upstream's exact iteration structure (docs/model.md §3.1 step 4).

    Row softmax (+eps), then a column normalisation, then ``iters-1`` rounds of row then column
    normalisation. Every normalisation multiplies by a precomputed reciprocal ``1/(sum+eps)``.
    Row sums run over ``b`` (axis 1), column sums over ``a`` (axis 0), in ascending index order.
    """
    m = f32(logits).copy()
    n = m.shape[0]
    e = np.float32(eps)

    def row_sums(x):
        s = np.zeros(n, np.float32)
        for b in range(n):
            s = (s + x[:, b]).astype(np.float32)
        return s

    def col_sums(x):
        s = np.zeros(n, np.float32)
        for a in range(n):
            s = (s + x[a, :]).astype(np.float32)
        return s

    mx = m.max(axis=1)
    m = expf(m - mx[:, None])
    inv = (_ONE / row_sums(m)).astype(np.float32)
    m = (m * inv[:, None] + e).astype(np.float32)
    m = (m * (_ONE / (col_sums(m) + e))[None, :]).astype(np.float32)
    for _ in range(1, iters):
        m = (m * (_ONE / (row_sums(m) + e))[:, None]).astype(np.float32)
        m = (m * (_ONE / (col_sums(m) + e))[None, :]).astype(np.float32)
    return m


def hc_split(mix: np.ndarray, scale: np.ndarray, base: np.ndarray, n_hc: int, iters: int,
             eps: float) -> HcSplit:
    """Turn the ``2·n_hc + n_hc²`` control values into pre weights, post gates and comb."""
    mix, scale, base = f32(mix), f32(scale), f32(base)
    z_pre = (mix[:n_hc] * scale[0] + base[:n_hc]).astype(np.float32)
    pre = (_ONE / (_ONE + expf(-z_pre)) + np.float32(eps)).astype(np.float32)
    z_post = (mix[n_hc:2 * n_hc] * scale[1] + base[n_hc:2 * n_hc]).astype(np.float32)
    post = (np.float32(2.0) / (_ONE + expf(-z_post))).astype(np.float32)
    z_comb = (mix[2 * n_hc:] * scale[2] + base[2 * n_hc:]).astype(np.float32).reshape(n_hc, n_hc)
    return HcSplit(pre, post, sinkhorn(z_comb, iters, eps))


def hc_weighted_sum(streams: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``Σ_h streams[h]·w[h]`` in float32, h ascending, starting from 0."""
    acc = np.zeros(streams.shape[1], np.float32)
    for h in range(streams.shape[0]):
        acc = (acc + streams[h] * np.float32(w[h])).astype(np.float32)
    return acc


def hc_pre(streams: np.ndarray, fn: np.ndarray, scale: np.ndarray, base: np.ndarray,
           iters: int, rms_eps: float, hc_eps: float) -> tuple[np.ndarray, HcSplit]:
    """HC pre: RMSNorm-no-weight over all streams, F16 projection, Sinkhorn split, weighted sum.

    ``streams`` is float32[n_hc, n_embd]; ``fn`` the dequantised ``hc_*_fn`` [hc_mix, hc_dim].
    Returns the sublayer input (float32[n_embd]) and the split.
    """
    n_hc = streams.shape[0]
    flat = rms_norm_no_weight(streams.reshape(-1), rms_eps)
    mix = matvec_weights(fn, flat, FLOAT_ACT)  # F16/F32 weight: float activation
    split = hc_split(mix, scale, base, n_hc, iters, hc_eps)
    return hc_weighted_sum(streams, split.pre), split


def hc_post(out: np.ndarray, residual: np.ndarray, split: HcSplit) -> np.ndarray:
    """``H'[b] = out·post[b] + Σ_a comb[a, b]·R[a]`` in float32, a ascending."""
    n_hc = residual.shape[0]
    new = np.empty_like(residual)
    for b in range(n_hc):
        acc = (f32(out) * split.post[b]).astype(np.float32)
        for a in range(n_hc):
            acc = (acc + split.comb[a, b] * residual[a]).astype(np.float32)
        new[b] = acc
    return new


def hc_collapse(streams: np.ndarray, fn: np.ndarray, scale: np.ndarray, base: np.ndarray,
                rms_eps: float, hc_eps: float) -> np.ndarray:
    """Output-head collapse: ``w = sigmoid(fn·norm(H)·scale + base) + eps``, ``y = Σ_h H[h]·w[h]``."""
    flat = rms_norm_no_weight(streams.reshape(-1), rms_eps)
    pre = matvec_weights(fn, flat, FLOAT_ACT)
    w = (sigmoid((pre * f32(scale)[0] + f32(base)).astype(np.float32)) + np.float32(hc_eps)).astype(np.float32)
    return hc_weighted_sum(streams, w)
