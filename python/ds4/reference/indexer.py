"""The ratio-4 indexer: which compressed rows a query may attend to (docs/model.md §3.6).

Only when there are more compressed rows than ``top_k`` does any indexer math run. Then each
compressed indexer row gets the score ``Σ_h relu(dot(K_c, q_h))·w[h]`` (``q_h`` the RoPE'd,
Hadamard+FP4'd indexer query heads, ``w`` the signed per-head weights scaled by
``1/sqrt(heads·head_dim)``), and the ``top_k`` best rows are allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .fp4 import indexer_qat
from .numerics import NEG, dot_f32, f32
from .rope import RopeParams, rope_tail
from .weights import Tensor, TensorFile

__all__ = ["IndexerWeights", "topk_strict", "indexer_scores", "indexer_mask"]


@dataclass
class IndexerWeights:
    """``indexer.attn_q_b`` (q_lora_rank -> heads·head_dim) and ``indexer.proj`` (n_embd -> heads)."""

    q_b: Tensor
    proj: Tensor

    @classmethod
    def load(cls, tf: TensorFile, il: int) -> "IndexerWeights":
        return cls(tf.get(f"blk.{il}.indexer.attn_q_b.weight"), tf.get(f"blk.{il}.indexer.proj.weight"))


def topk_strict(scores: np.ndarray, k: int) -> np.ndarray:
    """Upstream's selection loop: ``k`` times, scan rows ascending and take the not-yet-chosen row
    with the strictly greatest score (so ties go to the lowest index). Returns a bool mask.

    As upstream, the scan starts from ``best = 0, best_score = NEG``: a round where no remaining
    score exceeds NEG re-marks row 0.
    """
    s = f32(scores)
    allowed = np.zeros(s.size, dtype=bool)
    for _ in range(k):
        cand = np.where(allowed, -np.inf, s)
        best = int(np.argmax(cand))  # first maximal index
        if not cand[best] > NEG:
            best = 0
        allowed[best] = True
    return allowed


def indexer_scores(w: IndexerWeights, a: np.ndarray, qr_norm: np.ndarray, rows: np.ndarray,
                   pos: int, rope: RopeParams, n_heads: int, head_dim: int) -> np.ndarray:
    """Score of every compressed indexer row for the query at ``pos`` (float32[n_rows])."""
    q = w.q_b.matvec(qr_norm)                                   # F16 weight, float activation
    q = rope_tail(q, n_heads, head_dim, rope, pos).reshape(n_heads, head_dim)
    q = indexer_qat(q)                                          # Hadamard-128 + FP4 per head
    hw = w.proj.matvec(a)
    hw = (hw * (np.float32(1.0) / np.sqrt(np.float32(head_dim * n_heads)))).astype(np.float32)
    dots = dot_f32(rows, q.T) if rows.size else np.zeros((0, n_heads), np.float32)  # [n_rows, heads]
    dots = np.maximum(dots, np.float32(0.0))
    score = np.zeros(rows.shape[0], np.float32)
    for h in range(n_heads):  # float sum, h ascending
        score = (score + dots[:, h] * hw[h]).astype(np.float32)
    return score


def indexer_mask(w: IndexerWeights, a: np.ndarray, qr_norm: np.ndarray, rows: np.ndarray,
                 pos: int, rope: RopeParams, n_heads: int, head_dim: int, top_k: int,
                 trace: dict | None = None) -> np.ndarray | None:
    """Allowed-row mask for the compressed attention rows, or ``None`` when all are visible."""
    n_comp = rows.shape[0]
    if n_comp == 0 or n_comp <= top_k:
        return None
    scores = indexer_scores(w, a, qr_norm, rows, pos, rope, n_heads, head_dim)
    allowed = topk_strict(scores, top_k)
    if trace is not None:
        trace["scores"] = scores
        trace["selected"] = np.flatnonzero(allowed)
    return allowed
