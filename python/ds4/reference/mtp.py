"""The MTP (multi-token prediction) draft block (docs/model.md §3.12).

One step takes a token ``t``, a position ``pos`` and the previous HC state ``Hprev``:
``e' = e_proj·RMSNorm(embd[t]; enorm)`` is added to ``h_proj·RMSNorm(Hprev[s]; hnorm)`` of each
stream, one decoder layer with the ``mtp.0.*`` weights runs as a dense (ratio 0) layer with its own
raw window, and the logits come from the block's own HC head and norm with the base model's
``output.weight``. Upstream runs this on GPU only (its matmuls there do not quantise activations);
the reference uses the same activation rules as every other product here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .head import HeadWeights, output_logits
from .model import LayerWeights, layer_forward, _record
from .numerics import rms_norm
from .rope import rope_params
from .numerics import f16_round
from .state import LayerState, ReferenceState  # noqa: F401
from .weights import Tensor, TensorFile

if TYPE_CHECKING:
    from .model import ReferenceModel

__all__ = ["MtpWeights", "MtpLayerState", "mtp_step"]


@dataclass
class MtpLayerState(LayerState):
    """The MTP block's raw window: a ring indexed by ``pos % raw_cap`` with its own live-row
    counter, as upstream's graph keeps it (drafts may revisit positions after a rollback)."""

    pos: int = 0

    def push_raw(self, row: np.ndarray) -> None:
        self.raw[self.pos % self.raw_cap] = f16_round(row)
        self.n_raw = min(self.n_raw + 1, self.raw_cap)

    @property
    def raw_rows(self) -> np.ndarray:
        """Rows of positions ``pos-n_raw+1 .. pos``, oldest first."""
        idx = [(self.pos - self.n_raw + 1 + i) % self.raw_cap for i in range(self.n_raw)]
        return self.raw[idx]


@dataclass
class MtpWeights:
    """The ``mtp.0.*`` tensors."""

    e_proj: Tensor
    h_proj: Tensor
    enorm: Tensor
    hnorm: Tensor
    norm: Tensor
    hc_head_fn: Tensor
    hc_head_scale: Tensor
    hc_head_base: Tensor
    layer: LayerWeights

    @classmethod
    def load(cls, tf: TensorFile) -> "MtpWeights":
        g = lambda n: tf.get(f"mtp.0.{n}")  # noqa: E731
        layer = LayerWeights.load(tf, "mtp.0", 0, None)
        if layer.ffn.probs_bias is None:
            tf.get("mtp.0.exp_probs_b.bias")  # required for MTP: raises naming it
        return cls(g("e_proj.weight"), g("h_proj.weight"), g("enorm.weight"), g("hnorm.weight"),
                   g("norm.weight"), g("hc_head_fn.weight"), g("hc_head_scale.weight"),
                   g("hc_head_base.weight"), layer)


def mtp_step(model: "ReferenceModel", st: ReferenceState, hidden: np.ndarray, token: int, pos: int,
             trace: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Returns ``(logits float32[n_vocab], hc_out float32[n_hc, n_embd])``; updates ``st.mtp``."""
    s = model.shape
    w: MtpWeights = model.mtp
    if st.mtp is None:
        st.mtp = MtpLayerState(-1, 0, s.head_dim, s.indexer_head_dim, st.raw_cap, 0)
    st.mtp.pos = pos
    hprev = np.asarray(hidden, dtype=np.float32).reshape(s.n_hc, s.n_embd)
    e = model.embed(token)
    e_proj = w.e_proj.matvec(rms_norm(e, w.enorm.values, s.rms_eps))
    h_proj = np.stack([w.h_proj.matvec(rms_norm(hprev[h], w.hnorm.values, s.rms_eps)) for h in range(s.n_hc)])
    streams = (e_proj[None, :] + h_proj).astype(np.float32)
    lt = {} if trace is not None else None
    out = layer_forward(w.layer, st.mtp, streams, pos, token, s, rope_params(s, 0),
                        model.clamps[min(1, s.n_layer - 1)], lt)
    head = HeadWeights(w.hc_head_fn, w.hc_head_scale, w.hc_head_base, w.norm, model.head.output)
    ht = {} if trace is not None else None
    logits = output_logits(head, out, s, ht)
    _record(trace, "mtp.", {**(lt or {}), **(ht or {}), **({"logits": logits} if trace is not None else {})})
    return logits, out
