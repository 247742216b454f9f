"""The learned KV compressor of ratio-4 and ratio-128 layers (docs/model.md §3.7).

Every token writes its kv projection and its gate score (+ APE) into one frontier slot. When
``p+1`` crosses a ratio boundary the window is pooled with a per-dimension softmax over the slot
scores, RMS-normalised, RoPE'd at ``p+1-ratio`` and quantised (FP8 for attention-width rows,
Hadamard+FP4 for indexer rows). Ratio-4 compressors keep two overlapping lanes: the emitted row
pools the previous window through the first half of each slot and the current window through the
second half; after emitting, the current window becomes the previous one (the shift).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .fp4 import indexer_qat
from .fp8 import fp8_kv_roundtrip
from .numerics import NEG_SKIP, expf, rms_norm
from .rope import RopeParams, rope_tail
from .state import CompressorState
from .weights import Tensor, TensorFile

__all__ = ["CompressorWeights", "compressor_write", "compressor_pool", "compressor_step"]


@dataclass
class CompressorWeights:
    """Dequantised tensors of one compressor lane (``attn_compressor_*`` or ``indexer_compressor_*``)."""

    kv: Tensor     # ggml [n_embd, coff·head_dim]
    gate: Tensor   # ggml [n_embd, coff·head_dim]
    ape: Tensor    # ggml [coff·head_dim, ratio]: values[pos % ratio] is one slot's APE
    norm: Tensor   # [head_dim]

    @classmethod
    def load(cls, tf: TensorFile, prefix: str) -> "CompressorWeights":
        """``prefix`` is e.g. ``blk.2.attn_compressor`` or ``blk.2.indexer_compressor``."""
        return cls(tf.get(f"{prefix}_kv.weight"), tf.get(f"{prefix}_gate.weight"),
                   tf.get(f"{prefix}_ape.weight"), tf.get(f"{prefix}_norm.weight"))


def compressor_write(st: CompressorState, w: CompressorWeights, a: np.ndarray, pos: int) -> None:
    """Steps 1-3: project ``a`` and store kv / score(+APE) in the slot of ``pos``."""
    ratio = st.ratio
    pos_mod = pos % ratio
    kv = w.kv.matvec(a)      # F16 weights: float activation (docs/model.md §4.2)
    sc = w.gate.matvec(a)
    sc = (sc + w.ape.values[pos_mod]).astype(np.float32)
    row = ratio + pos_mod if ratio == 4 else pos_mod
    st.kv[row] = kv
    st.score[row] = sc


def compressor_pool(st: CompressorState) -> np.ndarray:
    """Step 5: per-dimension softmax pooling of the frontier (float32, r ascending).

    Returns float32[head_dim]. A dimension whose best score is <= -5e29 (nothing written) is 0.
    """
    ratio, hd = st.ratio, st.head_dim
    if ratio == 4:
        # candidate order per r: (previous window, first half), (current window, second half)
        s_prev, s_cur = st.score[:ratio, :hd], st.score[ratio:, hd:2 * hd]
        k_prev, k_cur = st.kv[:ratio, :hd], st.kv[ratio:, hd:2 * hd]
        mx = np.maximum(s_prev.max(axis=0), s_cur.max(axis=0))
    else:
        s_all, k_all = st.score[:, :hd], st.kv[:, :hd]
        mx = s_all.max(axis=0)
    denom = np.zeros(hd, np.float32)
    acc = np.zeros(hd, np.float32)
    for r in range(ratio):
        if ratio == 4:
            wp, wc = expf(s_prev[r] - mx), expf(s_cur[r] - mx)
            denom = (denom + (wp + wc).astype(np.float32)).astype(np.float32)
            acc = (acc + wp * k_prev[r]).astype(np.float32)
            acc = (acc + wc * k_cur[r]).astype(np.float32)
        else:
            w = expf(s_all[r] - mx)
            denom = (denom + w).astype(np.float32)
            acc = (acc + w * k_all[r]).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        pooled = np.where(denom > 0, acc / denom, np.float32(0.0)).astype(np.float32)
    return np.where(mx <= NEG_SKIP, np.float32(0.0), pooled).astype(np.float32)


def _shift(st: CompressorState) -> None:
    """Step 9 (ratio 4): the current window's slots become the previous window's."""
    r = st.ratio
    st.kv[:r] = st.kv[r:]
    st.score[:r] = st.score[r:]


def compressor_step(st: CompressorState, w: CompressorWeights, a: np.ndarray, pos: int,
                    rope: RopeParams, attn_head_dim: int, rms_eps: float,
                    trace: dict | None = None) -> np.ndarray | None:
    """One token through a compressor; returns the emitted row (before the cache's F16 round trip)."""
    compressor_write(st, w, a, pos)
    if (pos + 1) % st.ratio:
        return None
    pooled = compressor_pool(st)
    y = rms_norm(pooled, w.norm.values, rms_eps)
    y = rope_tail(y, 1, st.head_dim, rope, pos + 1 - st.ratio)
    if trace is not None:
        trace["pooled"] = pooled
    # Attention-width rows get FP8 on the non-RoPE dims; the (128-wide) indexer rows Hadamard+FP4.
    y = fp8_kv_roundtrip(y, rope.n_rot) if st.head_dim == attn_head_dim else indexer_qat(y[None, :])[0]
    if st.ratio == 4:
        _shift(st)
    return y
