"""Activation quantisation and quantised products, as the upstream CPU path computes them.

Weights are dequantised exactly (``gguf.quants.dequantize``: every quant format used by DS4 gives
float32 values that are exact products of its stored fields). Activations are quantised the way the
CPU kernel quantises them before the integer dot (docs/model.md §4.2):

* Q8_0 weights see Q8_0 activations, one scale per 32 values, ``d = amax/127`` kept in float32
  (**not** rounded to f16 as ggml would);
* k-quant / i-quant weights (Q2_K, Q4_K, IQ2_XXS, ...) see Q8_K activations, 256 per block;
* F16 / BF16 / F32 weights see the float activation unchanged.

Products are then accumulated in float64 (docs/model.md §4.6 recommends exact block sums or double
accumulation and warns against float32 BLAS of dequantised values) and returned as float32.

    >>> import numpy as np
    >>> d, q = quantize_q8_0_act(np.arange(32, dtype=np.float32))
    >>> float(d[0]) == np.float32(31) / np.float32(127), int(q[0, 31])
    (True, 127)
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as _gguf_dequantize

__all__ = [
    "QK8_0",
    "QK_K",
    "FLOAT_ACT",
    "quantize_q8_0_act",
    "dequantize_q8_0_act",
    "quantize_q8_k",
    "dequantize_q8_k",
    "act_type_for",
    "act_roundtrip",
    "dequantize",
    "matvec",
    "matmul",
    "matvec_weights",
    "matmul_weights",
]

QK8_0 = 32
QK_K = 256

_Q = GGMLQuantizationType
_FLOAT_TYPES = (_Q.F32, _Q.F16, _Q.BF16)
FLOAT_ACT = _Q.F32  # activation type of float weights: the float activation, unquantised


def _blocks(x: np.ndarray, block: int) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if x.size % block:
        raise ValueError(f"activation length {x.size} is not a multiple of the block size {block}")
    return x.reshape(-1, block)


def quantize_q8_0_act(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 activation quantisation (upstream ``quantize_q8_0_activation``).

    Per block of 32: ``d = amax/127`` (float32), ``id = 1/d`` (0 when d == 0),
    ``q = clamp(rint(x*id), -128, 127)`` with the product in float32 and round-half-even.
    Returns ``d: float32[nb]``, ``q: int8[nb, 32]``.
    """
    xb = _blocks(x, QK8_0)
    amax = np.max(np.abs(xb), axis=1)
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    prod = (xb * inv[:, None]).astype(np.float32)
    q = np.clip(np.rint(prod), -128, 127).astype(np.int8)
    return d, q


def dequantize_q8_0_act(d: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Values of a Q8_0 activation as float64 (``d*q`` is exact in double)."""
    return (d.astype(np.float64)[:, None] * q.astype(np.float64)).reshape(-1)


def quantize_q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q8_K quantisation (ggml ``quantize_row_q8_K``, docs/model.md §4.1).

    Per block of 256: ``max`` is the signed value of the *first* element with the largest |x|;
    ``iscale = -127/max``, ``q = clamp(rint(iscale*x), -128, 127)``, ``d = 1/iscale`` (so the
    largest element maps to -127); an all-zero block has d = 0 and q = 0.
    Returns ``d: float32[nb]``, ``q: int8[nb, 256]``, ``bsums: int16[nb, 16]``.
    """
    xb = _blocks(x, QK_K)
    # argmax returns the first maximal index: exactly the strict ">" scan.
    idx = np.argmax(np.abs(xb), axis=1)
    mx = xb[np.arange(xb.shape[0]), idx]
    nz = mx != 0
    with np.errstate(divide="ignore"):
        iscale = np.where(nz, np.float32(-127.0) / np.where(nz, mx, 1), 0).astype(np.float32)
        d = np.where(nz, np.float32(1.0) / np.where(nz, iscale, 1), 0).astype(np.float32)
    prod = (xb * iscale[:, None]).astype(np.float32)
    q = np.clip(np.rint(prod), -128, 127).astype(np.int8)
    bsums = q.reshape(q.shape[0], 16, 16).astype(np.int32).sum(axis=2).astype(np.int16)
    return d, q, bsums


def dequantize_q8_k(d: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Values of a Q8_K activation as float64."""
    return (d.astype(np.float64)[:, None] * q.astype(np.float64)).reshape(-1)


def _as_qtype(qtype: int | GGMLQuantizationType) -> GGMLQuantizationType:
    return GGMLQuantizationType(int(qtype))


def act_type_for(qtype: int | GGMLQuantizationType) -> GGMLQuantizationType:
    """Activation format the CPU dot uses against a weight of ``qtype`` (docs/model.md §4.2)."""
    qt = _as_qtype(qtype)
    if qt in _FLOAT_TYPES:
        return _Q.F32
    if qt == _Q.Q8_0:
        return _Q.Q8_0
    if GGML_QUANT_SIZES[qt][0] == QK_K:
        return _Q.Q8_K
    raise NotImplementedError(f"no activation format defined for weight type {qt.name}")


def act_roundtrip(act_type: int | GGMLQuantizationType, x: np.ndarray) -> np.ndarray:
    """The activation the dot product really sees, as float64 (quantised then dequantised)."""
    at = _as_qtype(act_type)
    if at == _Q.F32:
        return np.asarray(x, dtype=np.float32).astype(np.float64).reshape(-1)
    if at == _Q.Q8_0:
        return dequantize_q8_0_act(*quantize_q8_0_act(x))
    if at == _Q.Q8_K:
        d, q, _ = quantize_q8_k(x)
        return dequantize_q8_k(d, q)
    raise NotImplementedError(f"activation type {at.name} is not an activation format")


def dequantize(qtype: int | GGMLQuantizationType, raw: np.ndarray, ggml_dims) -> np.ndarray:
    """Dequantise a tensor's bytes to float32 with numpy shape ``reversed(ggml_dims)``.

    ``raw`` is the tensor data as stored (any dtype, e.g. the array a ``GGUFReader`` gives);
    it is reinterpreted as bytes. ``ggml_dims`` is ``[ne0, ne1, ...]`` with ne0 contiguous.
    """
    qt = _as_qtype(qtype)
    dims = [int(n) for n in ggml_dims]
    shape = tuple(reversed(dims))
    n_elem = int(np.prod(dims, dtype=np.int64))
    block, type_size = GGML_QUANT_SIZES[qt]
    if dims[0] % block:
        raise ValueError(f"ne0={dims[0]} is not a multiple of the {qt.name} block size {block}")
    n_bytes = n_elem // block * type_size
    data = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if data.size != n_bytes:
        raise ValueError(f"{qt.name} tensor {dims}: expected {n_bytes} bytes, got {data.size}")
    if qt == _Q.F32:
        out = data.view(np.float32)
    elif qt == _Q.F16:
        out = data.view(np.float16).astype(np.float32)
    else:
        out = _gguf_dequantize(data.reshape(-1, type_size), qt).astype(np.float32, copy=False)
    return out.reshape(shape)


def matvec_weights(w: np.ndarray, x: np.ndarray, act_type: int | GGMLQuantizationType) -> np.ndarray:
    """``y = W·x`` for dequantised weights ``w[rows, in]``, activation quantised per ``act_type``.

    Accumulates in float64 and returns float32[rows].
    """
    xa = act_roundtrip(act_type, x)
    if w.shape[-1] != xa.size:
        raise ValueError(f"matvec: weight width {w.shape[-1]} != activation length {xa.size}")
    return (w.astype(np.float64) @ xa).astype(np.float32)


def matmul_weights(w: np.ndarray, x: np.ndarray, act_type: int | GGMLQuantizationType) -> np.ndarray:
    """Row-wise :func:`matvec_weights` for ``x[n, in]``: each row quantised on its own."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError("matmul: x must be 2-D [n, in]")
    xa = np.stack([act_roundtrip(act_type, row) for row in x]) if x.shape[0] else np.zeros((0, w.shape[-1]))
    return (xa @ w.astype(np.float64).T).astype(np.float32)


def matvec(qtype: int | GGMLQuantizationType, raw: np.ndarray, ggml_dims, x: np.ndarray) -> np.ndarray:
    """``y = W·x`` for a 2-D weight given as raw bytes; activation format per :func:`act_type_for`."""
    if len(ggml_dims) != 2:
        raise ValueError(f"matvec needs a 2-D weight, got dims {list(ggml_dims)}")
    w = dequantize(qtype, raw, ggml_dims)
    return matvec_weights(w, x, act_type_for(qtype))


def matmul(qtype: int | GGMLQuantizationType, raw: np.ndarray, ggml_dims, x: np.ndarray) -> np.ndarray:
    """``Y[n] = W·X[n]`` for a 2-D weight given as raw bytes; returns float32[n, rows]."""
    if len(ggml_dims) != 2:
        raise ValueError(f"matmul needs a 2-D weight, got dims {list(ggml_dims)}")
    w = dequantize(qtype, raw, ggml_dims)
    return matmul_weights(w, x, act_type_for(qtype))
