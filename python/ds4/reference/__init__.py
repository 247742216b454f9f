"""Pure-numpy reference of the DeepSeek V4 forward pass: the oracle the C++ engine is tested against.

Clarity over speed: one module per concept (quant formats, hyper-connections, RoPE, FP8/FP4,
attention, compressor, indexer, MoE, output head, state), numerics as docs/model.md §3-§4 pins them.
Only for small (synthetic) models: weights are dequantised to float32 in memory.

Validated against upstream antirez/ds4's own CPU backend on the tiny synthetic model
(docs/validation.md): fed upstream's intermediate inputs every stage agrees to ~1e-6
relative, saved cache states match field by field, and end-to-end logits differ from upstream as
much as upstream's strict and fast-math builds differ from each other (mean abs ~0.03).

    >>> import ds4.reference as ref                       # doctest: +SKIP
    >>> m = ref.ReferenceModel("tiny.gguf")               # doctest: +SKIP
    >>> st = m.new_state(256)                             # doctest: +SKIP
    >>> logits = m.prefill(st, [1, 2, 3])                 # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ReferenceModel", "ReferenceState", "quant", "compare"]

_LAZY = {
    "ReferenceModel": ("ds4.reference.model", "ReferenceModel"),
    "ReferenceState": ("ds4.reference.state", "ReferenceState"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        value = getattr(importlib.import_module(module_name), attr)
        globals()[name] = value
        return value
    if name in ("quant", "compare"):
        return importlib.import_module(f"ds4.reference.{name}")
    raise AttributeError(f"module 'ds4.reference' has no attribute {name!r}")
