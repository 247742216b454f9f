"""GGUF tensors read with ``gguf.GGUFReader`` and dequantised lazily (the shape comes from ``ds4.inspect``).

A :class:`Tensor` keeps its ggml type and dims next to the dequantised values, so a product with it
quantises the activation the way the CPU kernel for that type does (:mod:`ds4.reference.quant`).
Only small models are practical: a dequantised tensor is held in memory as float32 and float64.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader

from ..errors import ModelFormatError
from ..shape import ARCH, METADATA_KEYS, ModelShape
from .quant import act_roundtrip, act_type_for, dequantize

__all__ = ["Tensor", "TensorFile", "read_swiglu_clamps"]


@dataclass
class Tensor:
    """One GGUF tensor: name, ggml type, ggml dims ``[ne0, ne1, ...]`` and lazily dequantised values."""

    name: str
    qtype: GGMLQuantizationType
    dims: tuple[int, ...]
    raw: np.ndarray
    _values: np.ndarray | None = field(default=None, repr=False)
    _values64: np.ndarray | None = field(default=None, repr=False)

    @property
    def values(self) -> np.ndarray:
        """float32 values with numpy shape ``reversed(dims)`` (row ``o`` of a matrix = output ``o``)."""
        if self._values is None:
            if self.qtype == GGMLQuantizationType.I32:
                self._values = np.ascontiguousarray(self.raw).view(np.int32).reshape(tuple(reversed(self.dims)))
            else:
                self._values = dequantize(self.qtype, self.raw, self.dims)
        return self._values

    @property
    def values64(self) -> np.ndarray:
        if self._values64 is None:
            self._values64 = self.values.astype(np.float64)
        return self._values64

    @property
    def act_type(self) -> GGMLQuantizationType:
        return act_type_for(self.qtype)

    def _check_width(self, n: int) -> None:
        if self.dims[0] != n:
            raise ModelFormatError(f"tensor {self.name}: input width ne0={self.dims[0]}, activation has {n}")

    def matvec(self, x: np.ndarray, expert: int | None = None) -> np.ndarray:
        """``W·x`` (or expert ``expert`` of a 3-D tensor): activation quantised per the weight type,
        products accumulated in float64, result float32[ne1]."""
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        self._check_width(x.size)
        w = self.values64 if expert is None else self.values64[expert]
        return (w @ act_roundtrip(self.act_type, x)).astype(np.float32)

    def matvec_rows(self, x: np.ndarray, row0: int, n_rows: int) -> np.ndarray:
        """``W[row0:row0+n_rows]·x`` with the same activation rule (grouped output projection)."""
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        self._check_width(x.size)
        return (self.values64[row0:row0 + n_rows] @ act_roundtrip(self.act_type, x)).astype(np.float32)


def _field_value(f: Any) -> Any:
    return f.contents()


class TensorFile:
    """The tensors and metadata of one GGUF file."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        try:
            self.reader = GGUFReader(self.path, "r")
        except (OSError, ValueError) as e:
            raise ModelFormatError(f"{self.path}: cannot read GGUF: {e}") from e
        self.tensors: dict[str, Tensor] = {}
        for t in self.reader.tensors:
            dims = tuple(int(d) for d in t.shape)
            self.tensors[t.name] = Tensor(t.name, GGMLQuantizationType(int(t.tensor_type)), dims, t.data)

    def metadata(self, key: str) -> Any:
        f = self.reader.fields.get(key)
        return None if f is None else _field_value(f)

    def has(self, name: str) -> bool:
        return name in self.tensors

    def get(self, name: str, dims: tuple[int, ...] | None = None) -> Tensor:
        t = self.tensors.get(name)
        if t is None:
            raise ModelFormatError(f"{self.path}: required tensor {name} is missing")
        if dims is not None and tuple(t.dims) != tuple(dims):
            raise ModelFormatError(f"{self.path}: tensor {name} has dims {list(t.dims)}, expected {list(dims)}")
        return t

    def opt(self, name: str) -> Tensor | None:
        return self.tensors.get(name)


def read_swiglu_clamps(tf: TensorFile, shape: ModelShape) -> list[float]:
    """Per-layer SwiGLU clamp (the metadata array), or the shape's single value for every layer."""
    clamp = tf.metadata(f"{ARCH}.{METADATA_KEYS['swiglu_clamp']}")
    if isinstance(clamp, list) and len(clamp) >= shape.n_layer:
        return [float(c) for c in clamp[:shape.n_layer]]
    return [shape.swiglu_clamp] * shape.n_layer
