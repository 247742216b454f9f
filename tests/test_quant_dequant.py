"""Dequantisation of every weight format against gguf-py's independent implementation.

gguf-py evaluates the same float32 expressions as ggml (d*sc*q - dmin*m, d*(0.5+ls)*0.25*grid*sign),
so equality is required bit for bit on every type; for Q2_K/Q4_K/IQ2_XXS this is stronger than
the "within float32 rounding" the formats would strictly need.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from hypothesis import given, strategies as st

import ds4._core as core
from ds4.errors import InvalidArgumentError, UnsupportedModelError
from test_quant_blocks import WEIGHT_TYPES, block_size, random_weights, tensor_bytes, weight_case


def _gguf(qtype, raw, n, rows):
    if qtype == Q.F32:
        return raw.view(np.float32).reshape(rows, n)
    if qtype == Q.F16:
        return raw.view(np.float16).astype(np.float32).reshape(rows, n)
    _, bb = block_size(qtype)
    return gguf_dequantize(raw.reshape(-1, bb), qtype).reshape(rows, n)


@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda q: q.name)
@given(data=st.data())
def test_dequantize_matches_gguf(qtype, data):
    raw, n, rows, _ = data.draw(weight_case(qtype))
    got = core.dequantize(int(qtype), raw, (n, rows))
    want = _gguf(qtype, raw, n, rows)
    assert got.dtype == np.float32 and got.shape == (rows, n)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_dequantize_accepts_bytes_and_misaligned_views():
    raw = random_weights(Q.Q8_0, 64, 3, 1)
    want = core.dequantize(int(Q.Q8_0), raw, (64, 3))
    np.testing.assert_array_equal(core.dequantize(int(Q.Q8_0), raw.tobytes(), (64, 3)), want)
    shifted = np.frombuffer(b"\0" + raw.tobytes(), dtype=np.uint8, offset=1)  # odd address
    np.testing.assert_array_equal(core.dequantize(int(Q.Q8_0), shifted, (64, 3)), want)
    np.testing.assert_array_equal(core.dequantize(int(Q.Q8_0), memoryview(raw.tobytes()), (64, 3)), want)


def test_dequantize_3d_shape():
    raw = random_weights(Q.Q4_K, 256, 6, 2)
    got = core.dequantize(int(Q.Q4_K), raw, (256, 3, 2))
    assert got.shape == (2, 3, 256)
    np.testing.assert_array_equal(got.reshape(6, 256), _gguf(Q.Q4_K, raw, 256, 6))


def test_q8_k_dequantize_is_d_times_q():
    blk = np.zeros(292, np.uint8)
    blk[0:4] = np.array([0.5], np.float32).view(np.uint8)
    blk[4:260] = np.arange(-128, 128, dtype=np.int8).view(np.uint8)
    got = core.dequantize(int(Q.Q8_K), blk, (256,))
    np.testing.assert_array_equal(got, np.arange(-128, 128, dtype=np.float32) * 0.5)


@pytest.mark.parametrize(
    "qtype,name,elems,nbytes",
    [(Q.F32, "F32", 1, 4), (Q.F16, "F16", 1, 2), (Q.BF16, "BF16", 1, 2), (Q.Q8_0, "Q8_0", 32, 34),
     (Q.Q2_K, "Q2_K", 256, 84), (Q.Q4_K, "Q4_K", 256, 144), (Q.IQ2_XXS, "IQ2_XXS", 256, 66),
     (Q.Q8_K, "Q8_K", 256, 292), (Q.I32, "I32", 1, 4)],
)
def test_type_info_and_row_bytes(qtype, name, elems, nbytes):
    assert core.type_info(int(qtype)) == (name, elems, nbytes)
    assert core.row_bytes(int(qtype), 4 * elems) == 4 * nbytes


def test_bad_inputs_raise():
    raw = random_weights(Q.Q2_K, 256, 2, 3)
    with pytest.raises(InvalidArgumentError, match=r"needs 168 bytes, buffer has 167"):
        core.dequantize(int(Q.Q2_K), raw[:-1], (256, 2))
    with pytest.raises(InvalidArgumentError, match="multiple of the block size 256"):
        core.dequantize(int(Q.Q2_K), raw, (128, 4))
    with pytest.raises(UnsupportedModelError, match="unknown GGML type id 99"):
        core.dequantize(99, raw, (256, 2))
    with pytest.raises(UnsupportedModelError, match="unknown GGML type id"):
        core.row_bytes(-1, 32)
    with pytest.raises(UnsupportedModelError, match="I32"):
        core.dequantize(int(Q.I32), np.zeros(16, np.uint8), (4,))
    with pytest.raises(InvalidArgumentError, match="negative dim"):
        core.dequantize(int(Q.F32), np.zeros(16, np.uint8), (4, -1))
    with pytest.raises(InvalidArgumentError, match="not contiguous"):
        core.dequantize(int(Q.F16), np.zeros(16, np.uint8)[::2], (4,))
    assert tensor_bytes(Q.Q2_K, 256, 2) == raw.size
