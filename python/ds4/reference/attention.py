"""The attention sublayer of one layer and one token (docs/model.md §3.2-§3.9).

Low-rank Q with its norms, the single shared K=V head, RoPE on the tails, the FP8 KV round trip,
the raw sliding window, the compressors and the indexer, sink-aware softmax over raw and visible
compressed rows, inverse RoPE, and the grouped low-rank output projection.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..shape import ModelShape
from .compressor import CompressorWeights, compressor_step
from .fp8 import fp8_kv_roundtrip
from .indexer import IndexerWeights, indexer_mask
from .numerics import NEG, NEG_SKIP, dot_f32, expf, f32, head_rms_norm, rms_norm
from .rope import RopeParams, rope_tail
from .state import LayerState
from .weights import Tensor, TensorFile

__all__ = ["AttentionWeights", "q_projection", "kv_projection", "attend", "grouped_output",
           "attention_core"]


@dataclass
class AttentionWeights:
    """Attention tensors of one layer (``blk.N.*`` or ``mtp.0.*``)."""

    norm: Tensor
    q_a: Tensor
    q_a_norm: Tensor
    q_b: Tensor
    kv: Tensor
    kv_norm: Tensor
    sinks: Tensor
    out_a: Tensor
    out_b: Tensor
    compressor: CompressorWeights | None = None
    indexer: IndexerWeights | None = None
    indexer_compressor: CompressorWeights | None = None

    @classmethod
    def load(cls, tf: TensorFile, prefix: str, ratio: int, il: int | None = None) -> "AttentionWeights":
        g = lambda n: tf.get(f"{prefix}.{n}.weight")  # noqa: E731
        w = cls(g("attn_norm"), g("attn_q_a"), g("attn_q_a_norm"), g("attn_q_b"), g("attn_kv"),
                g("attn_kv_a_norm"), g("attn_sinks"), g("attn_output_a"), g("attn_output_b"))
        if ratio:
            w.compressor = CompressorWeights.load(tf, f"{prefix}.attn_compressor")
        if ratio == 4:
            w.indexer = IndexerWeights.load(tf, il)
            w.indexer_compressor = CompressorWeights.load(tf, f"{prefix}.indexer_compressor")
        return w


def q_projection(w: AttentionWeights, a: np.ndarray, s: ModelShape) -> tuple[np.ndarray, np.ndarray]:
    """``qr_norm = RMSNorm(q_a·a)``, ``q = per-head-RMSNorm(q_b·qr_norm)`` (Q8_0 activations)."""
    qr = w.q_a.matvec(a)
    qr_norm = rms_norm(qr, w.q_a_norm.values, s.rms_eps)
    q = w.q_b.matvec(qr_norm)
    return head_rms_norm(q, s.n_head, s.head_dim, s.rms_eps), qr_norm


def kv_projection(w: AttentionWeights, a: np.ndarray, s: ModelShape) -> np.ndarray:
    return rms_norm(w.kv.matvec(a), w.kv_norm.values, s.rms_eps)


def attend(q: np.ndarray, raw: np.ndarray, comp: np.ndarray, allowed: np.ndarray | None,
           sinks: np.ndarray, n_head: int, head_dim: int) -> np.ndarray:
    """Sink-aware softmax attention of every head over raw rows then visible compressed rows.

    Masked compressed rows get the score NEG and are skipped, as is any compressed row scoring
    <= -5e29; raw rows are never skipped. ``mx`` starts at the head's sink, the sink adds
    ``expf(sink - mx)`` to the denominator only, and the output is multiplied by ``1/denom``.
    """
    qh = f32(q).reshape(n_head, head_dim)
    n_raw = raw.shape[0]
    rows = np.concatenate([raw, comp], axis=0) if comp.shape[0] else raw
    kq_scale = np.float32(np.float32(1.0) / np.sqrt(np.float32(head_dim)))
    scores = (dot_f32(qh, rows.T) * kq_scale).astype(np.float32)        # [heads, rows]
    if allowed is not None:
        scores[:, n_raw:][:, ~allowed] = NEG
    skip = np.zeros(scores.shape, dtype=bool)
    skip[:, n_raw:] = scores[:, n_raw:] <= NEG_SKIP
    sinks = f32(sinks)
    mx = np.maximum(sinks, np.where(skip, NEG, scores).max(axis=1, initial=NEG)).astype(np.float32)
    wts = np.where(skip, np.float32(0.0), expf(scores - mx[:, None])).astype(np.float32)
    denom = expf(sinks - mx)
    for r in range(rows.shape[0]):  # float32, rows in order (skipped rows add exactly 0)
        denom = (denom + wts[:, r]).astype(np.float32)
    # Σ_r w_r·row_r accumulated in float64, rounded once to float32
    acc = (wts.astype(np.float64) @ rows.astype(np.float64)).astype(np.float32)
    return (acc * (np.float32(1.0) / denom)[:, None]).astype(np.float32).reshape(-1)


def grouped_output(w: AttentionWeights, heads: np.ndarray, s: ModelShape) -> np.ndarray:
    """Grouped low-rank output: each group of heads through its own rows of ``attn_output_a``
    (Q8_0 activation per group), then ``attn_output_b``."""
    low = np.empty(s.out_low_dim, np.float32)
    for g in range(s.n_out_group):
        x = heads[g * s.group_dim:(g + 1) * s.group_dim]
        low[g * s.o_lora_rank:(g + 1) * s.o_lora_rank] = w.out_a.matvec_rows(x, g * s.o_lora_rank, s.o_lora_rank)
    return w.out_b.matvec(low)


def attention_core(w: AttentionWeights, a: np.ndarray, ls: LayerState, pos: int, s: ModelShape,
                   rope: RopeParams, trace: dict | None = None) -> np.ndarray:
    """From the normed input ``a`` to the attention output (before HC post); updates ``ls``."""
    q, qr_norm = q_projection(w, a, s)
    kv = kv_projection(w, a, s)
    q = rope_tail(q, s.n_head, s.head_dim, rope, pos)
    kv = rope_tail(kv, 1, s.head_dim, rope, pos)
    kv = fp8_kv_roundtrip(kv, s.n_rot)
    ls.push_raw(kv)
    allowed = None
    comp_row = index_row = None
    if ls.ratio:
        ctrace = {} if trace is not None else None
        comp_row = compressor_step(ls.attn, w.compressor, a, pos, rope, s.head_dim, s.rms_eps, ctrace)
        if comp_row is not None:
            ls.push_comp(comp_row)
        if trace is not None:
            trace["comp_pooled"] = ctrace.get("pooled")
        if ls.ratio == 4:
            index_row = compressor_step(ls.index, w.indexer_compressor, a, pos, rope, s.head_dim, s.rms_eps)
            if index_row is not None:
                ls.push_index(index_row)
            itrace = {} if trace is not None else None
            allowed = indexer_mask(w.indexer, a, qr_norm, ls.index_rows, pos, rope, s.indexer_heads,
                                   s.indexer_head_dim, s.indexer_top_k, itrace)
            if trace is not None:
                trace["indexer_scores"] = itrace.get("scores")
                trace["indexer_selected"] = itrace.get("selected")
    heads = attend(q, ls.raw_rows, ls.comp_rows, allowed, w.sinks.values, s.n_head, s.head_dim)
    heads = rope_tail(heads, s.n_head, s.head_dim, rope, pos, inverse=True)
    out = grouped_output(w, heads, s)
    if trace is not None:
        trace.update(q=q, qr_norm=qr_norm, kv=kv, comp_row=comp_row, index_row=index_row,
                     allowed=allowed, heads=heads, attn_out=out)
    return out
