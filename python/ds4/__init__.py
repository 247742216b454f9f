"""ds4: DeepSeek V4 Flash / Pro GGUF inference with a compiled C++ core.

The pure-Python parts (inspect, testing, reference, tokenizer, chat, sampling) import without the
compiled core; ``Engine`` and ``Session`` load ``ds4._core`` on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import errors
from .errors import (
    CacheFormatError,
    ContextOverflowError,
    Ds4Error,
    InvalidArgumentError,
    ModelFormatError,
    UnsupportedModelError,
)

__version__ = "0.1.0"

# name -> (module, attribute); resolved lazily so `import ds4` stays cheap and works unbuilt.
_LAZY = {
    "inspect": ("ds4.inspection", "inspect"),
    "ModelInfo": ("ds4.inspection", "ModelInfo"),
    "ModelShape": ("ds4.shape", "ModelShape"),
    "Engine": ("ds4.engine", "Engine"),
    "Session": ("ds4.session", "Session"),
    "Tokenizer": ("ds4.tokenizer", "Tokenizer"),
    "KVCache": ("ds4.kvcache", "KVCache"),
    "available_backends": ("ds4.backends", "available_backends"),
    "BackendInfo": ("ds4.backends", "BackendInfo"),
}

__all__ = [
    "errors",
    "Ds4Error",
    "ModelFormatError",
    "UnsupportedModelError",
    "ContextOverflowError",
    "CacheFormatError",
    "InvalidArgumentError",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'ds4' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value
