"""Pure-numpy reference of the DeepSeek V4 forward pass: the oracle the C++ engine is tested against.

Clarity over speed: one module per concept (quant formats, hyper-connections, RoPE, FP8/FP4,
attention, compressor, indexer, MoE, output head, state), numerics as MODEL.md §3-§4 pins them.
Only for small (synthetic) models: weights are dequantised to float32 in memory.

    >>> import ds4.reference as ref                       # doctest: +SKIP
    >>> m = ref.ReferenceModel("tiny.gguf")               # doctest: +SKIP
    >>> st = m.new_state(256)                             # doctest: +SKIP
    >>> logits = m.prefill(st, [1, 2, 3])                 # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ReferenceModel", "ReferenceState", "quant"]

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
    if name == "quant":
        return importlib.import_module("ds4.reference.quant")
    raise AttributeError(f"module 'ds4.reference' has no attribute {name!r}")
