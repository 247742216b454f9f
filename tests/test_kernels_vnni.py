"""The avx512vnni path (AVX-512 kernels whose integer steps use vpdpbusd / vpdpwssd) against the
plain avx512 path: same int32 block sums and same float operations in the same order, so every
output must be bit-identical (no tolerance). Its agreement with the float64 reference is covered
by test_kernels_matvec.py, which runs on every path of core.simd_paths().
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given, strategies as st

import ds4._core as core
from test_kernels_matvec import simd_path
from test_quant_blocks import ACT_PATTERNS, WEIGHT_TYPES, activation, random_weights, weight_case

pytestmark = pytest.mark.skipif("avx512vnni" not in core.simd_paths(), reason="CPU/build without AVX-512 VNNI")


def _on(path, fn):
    with simd_path(path):
        return fn()


@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda q: q.name)
@given(data=st.data())
def test_vnni_matvec_and_matmul_bit_identical_to_avx512(qtype, data):
    raw, n, rows, _ = data.draw(weight_case(qtype, max_rows=5, max_blocks=20))
    nb = data.draw(st.integers(1, 6))  # every multi-activation width 1..4 plus remainders
    X = activation(n, data.draw(st.integers(0, 2**32 - 1)), data.draw(st.sampled_from(ACT_PATTERNS)), batch=nb)
    for fn in (lambda: core.matmul(int(qtype), raw, (n, rows), X), lambda: core.matvec(int(qtype), raw, (n, rows), X[0])):
        want = _on("avx512", fn)
        got = _on("avx512vnni", fn)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda q: q.name)
def test_vnni_bit_identical_on_long_rows(qtype):
    """Realistic row length (n = 4096, many 8-block groups) and a batch of 7 (4 + 3 activations)."""
    n, rows = 4096, 9
    raw = random_weights(qtype, n, rows, 31)
    X = activation(n, 32, "normal", batch=7)
    want = _on("avx512", lambda: core.matmul(int(qtype), raw, (n, rows), X))
    got = _on("avx512vnni", lambda: core.matmul(int(qtype), raw, (n, rows), X))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("wcode", [-128, -127, 127])
@pytest.mark.parametrize("xcode", [-127, 127])
def test_q8_0_extreme_codes_exact(wcode, xcode):
    """vpdpbusd takes the activation as u8 (code + 128) and removes 128 * sum(w) again: check the
    extreme codes, where an off-by-one in the offset or an int16 saturation would show. With
    d_w = 1 and activation values +-127 (scale exactly 1) every product and sum is an integer
    below 2^24, so the exact result is known and every path must return it."""
    n, rows = 256, 3
    rng = np.random.default_rng([wcode + 128, xcode + 128])
    codes = np.full((rows, n), wcode, np.int64)
    codes[1] = rng.choice([-128, -127, 127], size=n)  # mixed extremes, partial cancellation
    codes[2, ::2] = -128
    x = np.full(n, float(xcode), np.float32)
    x[n // 2 :] = rng.choice([-127.0, 127.0], size=n // 2)
    blocks = codes.reshape(-1, 32).astype(np.int8).view(np.uint8)
    d = np.broadcast_to(np.array([1.0], np.float16).view(np.uint8), (blocks.shape[0], 2))
    raw = np.ascontiguousarray(np.concatenate([d, blocks], axis=1)).reshape(-1)
    want = (codes @ x.astype(np.int64)).astype(np.float64)
    assert np.abs(want).max() < 2**24
    for path in core.simd_paths():
        y = _on(path, lambda: core.matvec(int(Q.Q8_0), raw, (n, rows), x))
        np.testing.assert_array_equal(y.astype(np.float64), want, err_msg=f"path {path}")
        Y = _on(path, lambda: core.matmul(int(Q.Q8_0), raw, (n, rows), np.stack([x, -x, x, x, -x])))
        np.testing.assert_array_equal(Y.astype(np.float64), np.stack([want, -want, want, want, -want]), err_msg=path)
