"""The FFN sublayer: routed mixture of experts plus the shared expert (docs/model.md §3.10).

Router probabilities are ``sqrt(softplus(gate_inp·n))``. Hash layers (those with a
``ffn_gate_tid2eid`` table) take their experts from the table row of the input token; the others
take the top ``n_expert_used`` of ``prob + exp_probs_b`` (the bias is for selection only). The
selected probabilities are normalised (sum floored at 2^-14) and scaled. Each expert runs
SwiGLU with clamped gate/up on the Q8_K-quantised input, the routing weight multiplies ``mid``
before the down projection, and ``mid`` is Q8_K-quantised again for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ModelFormatError
from ..shape import ModelShape
from .numerics import f32, silu, softplus, sqrtf
from .weights import Tensor, TensorFile

__all__ = ["FfnWeights", "router_probs", "topk_desc", "select_experts", "expert_weights", "swiglu",
           "routed_moe", "shared_expert", "ffn_core"]

WEIGHT_SUM_FLOOR = np.float32(6.103515625e-5)  # 2^-14


@dataclass
class FfnWeights:
    """FFN tensors of one layer (``blk.N.*`` or ``mtp.0.*``)."""

    norm: Tensor
    gate_inp: Tensor
    gate_exps: Tensor
    up_exps: Tensor
    down_exps: Tensor
    gate_shexp: Tensor
    up_shexp: Tensor
    down_shexp: Tensor
    probs_bias: Tensor | None = None
    tid2eid: Tensor | None = None

    @classmethod
    def load(cls, tf: TensorFile, prefix: str) -> "FfnWeights":
        g = lambda n: tf.get(f"{prefix}.{n}.weight")  # noqa: E731
        return cls(g("ffn_norm"), g("ffn_gate_inp"), g("ffn_gate_exps"), g("ffn_up_exps"),
                   g("ffn_down_exps"), g("ffn_gate_shexp"), g("ffn_up_shexp"), g("ffn_down_shexp"),
                   tf.opt(f"{prefix}.exp_probs_b.bias"), tf.opt(f"{prefix}.ffn_gate_tid2eid.weight"))


def router_probs(w: FfnWeights, n: np.ndarray) -> np.ndarray:
    """``sqrtf(softplus(gate_inp·n))`` (F16 weight, float activation), float32[n_expert]."""
    return sqrtf(softplus(w.gate_inp.matvec(n)))


def topk_desc(score: np.ndarray, k: int) -> list[int]:
    """Upstream ``topk_desc``: insert each candidate (ascending id) before the first slot holding a
    strictly smaller score. Ties keep the lower id first; output by descending score."""
    idx: list[int] = []
    s = f32(score)
    for i in range(s.size):
        for j in range(k):
            if j >= len(idx) or s[i] > s[idx[j]]:
                idx.insert(j, i)
                del idx[k:]
                break
    return idx


def select_experts(w: FfnWeights, probs: np.ndarray, token: int, k: int) -> list[int]:
    """Expert ids of the ``k`` slots: the hash table row of ``token``, or biased top-k."""
    if w.tid2eid is not None:
        table = w.tid2eid.values  # int32[n_vocab, k]
        if not 0 <= token < table.shape[0]:
            raise ModelFormatError(f"{w.tid2eid.name}: token id {token} outside the table ({table.shape[0]} rows)")
        sel = [int(e) for e in table[token, :k]]
        if any(e < 0 or e >= probs.size for e in sel):
            raise ModelFormatError(f"{w.tid2eid.name}: row {token} names expert ids {sel} outside "
                                   f"0..{probs.size - 1}")
        return sel
    selection = probs if w.probs_bias is None else (probs + w.probs_bias.values).astype(np.float32)
    return topk_desc(selection, k)


def expert_weights(probs: np.ndarray, sel: list[int], scale: float) -> np.ndarray:
    """``w_i = prob[sel_i] / max(Σ prob[sel], 2^-14) · scale`` (unbiased probs, float32)."""
    wts = f32(probs)[sel]
    total = np.float32(0.0)
    for v in wts:  # float, slot order
        total = np.float32(total + v)
    total = max(total, WEIGHT_SUM_FLOOR)
    return ((wts / total).astype(np.float32) * np.float32(scale)).astype(np.float32)


def swiglu(g: np.ndarray, u: np.ndarray, clamp: float) -> np.ndarray:
    """``silu(min(g, c))·clamp(u, -c, c)``; no clamp when c <= 1e-6."""
    g, u = f32(g), f32(u)
    if clamp > 1.0e-6:
        c = np.float32(clamp)
        g = np.minimum(g, c)
        u = np.clip(u, -c, c)
    return (silu(g) * u).astype(np.float32)


def routed_moe(w: FfnWeights, n: np.ndarray, token: int, s: ModelShape, clamp: float,
               trace: dict | None = None) -> np.ndarray:
    """Σ over slots of ``down[e]·Q8K(silu(g)·u·w_i)``, slots in order, accumulated in float32."""
    probs = router_probs(w, n)
    sel = select_experts(w, probs, token, s.n_expert_used)
    wts = expert_weights(probs, sel, s.expert_weights_scale)
    out = np.zeros(s.n_embd, np.float32)
    mids = []
    for i, e in enumerate(sel):
        g = w.gate_exps.matvec(n, expert=e)   # routed type: Q8_K activation
        u = w.up_exps.matvec(n, expert=e)
        mid = (swiglu(g, u, clamp) * wts[i]).astype(np.float32)  # routing weight before down
        mids.append(mid)
        out = (out + w.down_exps.matvec(mid, expert=e)).astype(np.float32)
    if trace is not None:
        trace.update(router_probs=probs, experts=np.array(sel), expert_weights=wts,
                     expert_mid=np.stack(mids), moe_out=out)
    return out


def shared_expert(w: FfnWeights, n: np.ndarray, clamp: float) -> np.ndarray:
    """The always-on Q8_0 SwiGLU MLP (Q8_0 activations for gate/up and for down)."""
    mid = swiglu(w.gate_shexp.matvec(n), w.up_shexp.matvec(n), clamp)
    return w.down_shexp.matvec(mid)


def ffn_core(w: FfnWeights, n: np.ndarray, token: int, s: ModelShape, clamp: float,
             trace: dict | None = None) -> np.ndarray:
    """``routed_moe + shared`` for the normed FFN input ``n``."""
    moe = routed_moe(w, n, token, s, clamp, trace)
    shared = shared_expert(w, n, clamp)
    if trace is not None:
        trace["shared_out"] = shared
    return (moe + shared).astype(np.float32)
