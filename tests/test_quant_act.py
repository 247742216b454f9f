"""Activation quantisation (Q8_0-act, Q8_K) byte for byte against ds4.reference.quant.

Both sides do the same float32 operations (one division, one reciprocal, one multiply, rint with
ties to even), so the blocks must be identical, including the k+0.5 tie cases of docs/model.md 4.6.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given, strategies as st

import ds4._core as core
from ds4.errors import InvalidArgumentError, UnsupportedModelError
from ds4.reference import quant as ref
from test_quant_blocks import ACT_PATTERNS, activation


def _split_q8_0(raw: np.ndarray):
    blocks = raw.reshape(-1, 36)
    return blocks[:, :4].copy().view(np.float32).reshape(-1), blocks[:, 4:].view(np.int8)


def _split_q8_k(raw: np.ndarray):
    blocks = raw.reshape(-1, 292)
    d = blocks[:, :4].copy().view(np.float32).reshape(-1)
    q = blocks[:, 4:260].view(np.int8)
    bsums = blocks[:, 260:].copy().view(np.int16)
    return d, q, bsums


@given(st.integers(1, 12), st.integers(0, 2**32 - 1), st.sampled_from(ACT_PATTERNS))
def test_q8_0_act_matches_reference(nblocks, seed, pattern):
    x = activation(32 * nblocks, seed, pattern)
    raw = core.quantize_act(int(Q.Q8_0), x)
    assert raw.size == core.act_bytes(int(Q.Q8_0), x.size) == 36 * nblocks
    d, q = _split_q8_0(raw)
    rd, rq = ref.quantize_q8_0_act(x)
    np.testing.assert_array_equal(d.view(np.uint32), rd.view(np.uint32))
    np.testing.assert_array_equal(q, rq)


@given(st.integers(1, 3), st.integers(0, 2**32 - 1), st.sampled_from(ACT_PATTERNS))
def test_q8_k_matches_reference(nblocks, seed, pattern):
    x = activation(256 * nblocks, seed, pattern)
    for wtype in (Q.Q2_K, Q.Q4_K, Q.IQ2_XXS):
        raw = core.quantize_act(int(wtype), x)
        assert raw.size == core.act_bytes(int(wtype), x.size) == 292 * nblocks
        d, q, bsums = _split_q8_k(raw)
        rd, rq, rb = ref.quantize_q8_k(x)
        np.testing.assert_array_equal(d.view(np.uint32), rd.view(np.uint32))
        np.testing.assert_array_equal(q, rq)
        np.testing.assert_array_equal(bsums, rb)
        # A finite scale keeps |iscale*x| <= 127; -128 only appears when iscale overflowed (d == 0).
        assert ((q.min(axis=1) >= -127) | (d == 0)).all()


def test_q8_k_sign_convention_and_first_max():
    x = np.zeros(256, np.float32)
    x[3], x[9] = 2.0, -2.0  # equal magnitude: the first one (positive) is `max`
    d, q, _ = _split_q8_k(core.quantize_act(int(Q.Q2_K), x))
    assert q[0, 3] == -127 and q[0, 9] == 127
    assert d[0] == np.float32(1.0) / (np.float32(-127.0) / np.float32(2.0))


def test_q8_0_act_scale_not_rounded_to_f16():
    x = np.full(32, 1.0 / 3.0, np.float32)
    d, _ = _split_q8_0(core.quantize_act(int(Q.Q8_0), x))
    assert d[0] == np.float32(np.float32(1.0 / 3.0) / np.float32(127.0))
    assert np.float32(np.float16(d[0])) != d[0]


@pytest.mark.parametrize("wtype", [Q.F32, Q.F16, Q.BF16])
def test_float_weights_take_float_activations(wtype):
    x = activation(40, 5, "normal")
    raw = core.quantize_act(int(wtype), x)
    np.testing.assert_array_equal(raw.view(np.float32), x)


def test_batch_rows_quantised_independently():
    x = activation(64, 9, "normal", batch=3)
    raw = core.quantize_act(int(Q.Q8_0), x)
    for b in range(3):
        np.testing.assert_array_equal(raw[b * 72 : (b + 1) * 72], core.quantize_act(int(Q.Q8_0), x[b]))


def test_act_errors():
    with pytest.raises(InvalidArgumentError, match="multiple of 32"):
        core.quantize_act(int(Q.Q8_0), np.zeros(33, np.float32))
    with pytest.raises(InvalidArgumentError, match="multiple of 256"):
        core.quantize_act(int(Q.IQ2_XXS), np.zeros(128, np.float32))
    with pytest.raises(UnsupportedModelError, match="Q8_K"):
        core.quantize_act(int(Q.Q8_K), np.zeros(256, np.float32))
