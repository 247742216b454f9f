"""The output head: HC collapse, final RMSNorm and the vocabulary projection (docs/model.md §3.11)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..shape import ModelShape
from .hc import hc_collapse
from .numerics import rms_norm
from .weights import Tensor, TensorFile

__all__ = ["HeadWeights", "output_logits"]


@dataclass
class HeadWeights:
    """``output_hc_{fn,scale,base}``, ``output_norm`` and the LM head ``output`` (or MTP's own)."""

    hc_fn: Tensor
    hc_scale: Tensor
    hc_base: Tensor
    norm: Tensor
    output: Tensor

    @classmethod
    def load(cls, tf: TensorFile) -> "HeadWeights":
        g = tf.get
        return cls(g("output_hc_fn.weight"), g("output_hc_scale.weight"), g("output_hc_base.weight"),
                   g("output_norm.weight"), g("output.weight"))


def output_logits(w: HeadWeights, streams: np.ndarray, s: ModelShape, trace: dict | None = None) -> np.ndarray:
    """Collapse the HC streams (sigmoid weights + hc_eps, no Sinkhorn), norm, project (Q8_0 act)."""
    y = hc_collapse(streams, w.hc_fn.values, w.hc_scale.values, w.hc_base.values, s.rms_eps, s.hc_eps)
    z = rms_norm(y, w.norm.values, s.rms_eps)
    logits = w.output.matvec(z)
    if trace is not None:
        trace.update(head_collapse=y, head_norm=z)
    return logits
