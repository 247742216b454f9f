"""matvec / matmul / matvec_experts on every weight type and every SIMD path the machine has.

Expected values come from ds4.reference.quant: gguf-py dequantisation of the weights, the
activation quantised then dequantised (both exact in float64), and a float64 dot product.

Tolerance (derived, not tuned). Every kernel computes exact integer block sums (or exact f16/bf16
-> f32 products) and only then combines them in float32. With u = 2^-24:
  * each block term t_b = (scales) * (float)isum takes at most C = 6 roundings (scale products,
    int -> float conversion when |isum| >= 2^24, the product itself, the d/dmin difference);
  * adding K terms in any order (sequential, several accumulators, tree) errs by at most
    (K - 1) * u * sum|t_b| to first order;
  * the result is stored as float32: one more u * |y|.
So |y - ref64| <= (K + C) * u * S + u * |ref64| + floor, where S = sum_i |w_i * xa_i| bounds
sum|t_b| (for Q2_K/Q4_K, S counts the d part and the min part separately: |W_d|.|xa| + |W_m|.|xa|,
because their difference may cancel), K = number of float summands per row (n for float weights,
n/32 for Q8_0, 2n/256 for Q2_K/Q4_K, 9n/256 for IQ2_XXS, whose NEON order adds the eight
sub-block terms of a block in float before scaling by d), and floor = K * 2^-120 covers subnormal
scale products (each term's absolute error is at most 2^-149 * |isum| <= 2^-149 * 2^26).
F32 weights accumulate in double: n * 2^-53 * S + u * |ref64|.
The same bound applied to two paths bounds their difference by twice it.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import assume, given, strategies as st

import ds4._core as core
from ds4.reference import quant as ref
from test_quant_blocks import (
    ACT_PATTERNS,
    QUANT_TYPES,
    SCALE_FIELDS,
    WEIGHT_TYPES,
    activation,
    block_size,
    random_weights,
    split_scales,
    weight_case,
)

U = 2.0**-24
PATHS = core.simd_paths()


@contextlib.contextmanager
def simd_path(path):
    before = core.simd_path()
    core.set_simd_path(path)
    try:
        yield
    finally:
        core.set_simd_path(before)


def _summands(qtype, n):
    return {Q.Q8_0: n // 32, Q.Q2_K: 2 * n // 256, Q.Q4_K: 2 * n // 256, Q.IQ2_XXS: 9 * n // 256}.get(Q(qtype), n)


def _reference(qtype, raw, n, rows, x):
    """(ref64[rows] or [nb, rows], tol of the same shape) for activations x[n] or x[nb, n]."""
    at = ref.act_type_for(qtype)
    xs = np.atleast_2d(x)
    xa = np.stack([ref.act_roundtrip(at, r) for r in xs])  # [nb, n] float64, exactly what the kernel sees
    w = ref.dequantize(qtype, raw, (n, rows)).astype(np.float64)
    y = xa @ w.T
    if Q(qtype) in (Q.Q2_K, Q.Q4_K):
        wd, wm = (ref.dequantize(qtype, p, (n, rows)).astype(np.float64) for p in split_scales(qtype, raw))
        s = np.abs(xa) @ (np.abs(wd) + np.abs(wm)).T
    else:
        s = np.abs(xa) @ np.abs(w).T
    k = _summands(qtype, n)
    if Q(qtype) == Q.F32:
        tol = n * 2.0**-53 * s + U * np.abs(y) + 2.0**-140
    else:
        tol = (k + 6) * U * s + U * np.abs(y) + k * 2.0**-120
    if np.ndim(x) == 1:
        return y[0], tol[0]
    return y, tol


def _check_close(got, want, tol):
    assert got.shape == want.shape
    err = np.abs(got.astype(np.float64) - want)
    bad = err > tol
    assert not bad.any(), f"max err/tol {np.max(err / np.maximum(tol, 1e-300)):.3g} at {np.argwhere(bad)[:5].tolist()}"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda q: q.name)
@given(data=st.data())
def test_matvec_matches_reference(path, qtype, data):
    with simd_path(path):
        _test_matvec_matches_reference(qtype, data)


def _test_matvec_matches_reference(qtype, data):
    raw, n, rows, _ = data.draw(weight_case(qtype))
    x = activation(n, data.draw(st.integers(0, 2**32 - 1)), data.draw(st.sampled_from(ACT_PATTERNS)))
    want, tol = _reference(qtype, raw, n, rows, x)
    y = core.matvec(int(qtype), raw, (n, rows), x)
    assert y.dtype == np.float32
    _check_close(y, want, tol)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda q: q.name)
@given(data=st.data())
def test_matmul_matches_reference_and_matvec(path, qtype, data):
    with simd_path(path):
        _test_matmul_matches_reference_and_matvec(qtype, data)


def _test_matmul_matches_reference_and_matvec(qtype, data):
    raw, n, rows, _ = data.draw(weight_case(qtype, max_rows=5, max_blocks=2))
    nb = data.draw(st.integers(1, 5))
    X = activation(n, data.draw(st.integers(0, 2**32 - 1)), data.draw(st.sampled_from(ACT_PATTERNS)), batch=nb)
    want, tol = _reference(qtype, raw, n, rows, X)
    Y = core.matmul(int(qtype), raw, (n, rows), X)
    assert Y.shape == (nb, rows)
    _check_close(Y, want, tol)
    for b in range(nb):  # same kernel, same row order: identical bits
        np.testing.assert_array_equal(Y[b].view(np.uint32), core.matvec(int(qtype), raw, (n, rows), X[b]).view(np.uint32))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", QUANT_TYPES + (Q.F16,), ids=lambda q: q.name)
@given(data=st.data())
def test_matvec_experts_equals_per_expert_matvec(path, qtype, data):
    with simd_path(path):
        _test_matvec_experts_equals_per_expert_matvec(qtype, data)


def _test_matvec_experts_equals_per_expert_matvec(qtype, data):
    be, _ = block_size(qtype)
    n = 256 if be == 256 else 64
    rows = data.draw(st.integers(1, 4))
    n_expert = data.draw(st.integers(1, 6))
    raw = random_weights(qtype, n, rows * n_expert, data.draw(st.integers(0, 2**32 - 1)))
    ids = np.array(data.draw(st.lists(st.integers(0, n_expert - 1), min_size=1, max_size=6)), np.int32)
    per_slot = data.draw(st.booleans())
    X = activation(n, data.draw(st.integers(0, 2**32 - 1)), "normal", batch=len(ids) if per_slot else None)
    Y = core.matvec_experts(int(qtype), raw, (n, rows, n_expert), ids, X)
    assert Y.shape == (len(ids), rows)
    mat = raw.size // n_expert
    for i, e in enumerate(ids):
        xi = X[i] if per_slot else X
        want = core.matvec(int(qtype), raw[e * mat : (e + 1) * mat], (n, rows), xi)
        np.testing.assert_array_equal(Y[i].view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", QUANT_TYPES + (Q.F16,), ids=lambda q: q.name)
@given(data=st.data())
def test_matvec_experts_pair_equals_two_calls(path, qtype, data):
    """Decode's fused gate/up dispatch (matvec_experts_pair.h) gives each matrix the bits of its
    own matvec_experts call, at 1-3 threads (splits falling across the two matrices)."""
    be, _ = block_size(qtype)
    n = 256 if be == 256 else 64
    rows = data.draw(st.integers(1, 40))
    n_expert = data.draw(st.integers(1, 6))
    raw_a = random_weights(qtype, n, rows * n_expert, data.draw(st.integers(0, 2**32 - 1)))
    raw_b = random_weights(qtype, n, rows * n_expert, data.draw(st.integers(0, 2**32 - 1)))
    ids = np.array(data.draw(st.lists(st.integers(0, n_expert - 1), min_size=0, max_size=6)), np.int32)
    x = activation(n, data.draw(st.integers(0, 2**32 - 1)), "normal")
    threads = data.draw(st.integers(1, 3))
    before = core.threads()
    core.set_threads(threads)
    try:
        with simd_path(path):
            ya, yb = core.matvec_experts_pair(int(qtype), raw_a, raw_b, (n, rows, n_expert), ids, x)
            want_a = core.matvec_experts(int(qtype), raw_a, (n, rows, n_expert), ids, x)
            want_b = core.matvec_experts(int(qtype), raw_b, (n, rows, n_expert), ids, x)
    finally:
        core.set_threads(before)
    assert ya.shape == yb.shape == (len(ids), rows)
    np.testing.assert_array_equal(ya.view(np.uint32), want_a.view(np.uint32))
    np.testing.assert_array_equal(yb.view(np.uint32), want_b.view(np.uint32))


# ---- exact cases: power-of-two scales and activations make every float operation exact ----------


def _pow2_weights(qtype, n, rows, seed, a):
    """Random codes, every d/dmin = 2^a (float weights: small integers times 2^a)."""
    rng = np.random.default_rng(seed)
    if Q(qtype) in (Q.F32, Q.F16, Q.BF16):
        v = (rng.integers(-64, 65, size=rows * n) * 2.0**a).astype(np.float32)
        if Q(qtype) == Q.F32:
            return v.view(np.uint8)
        if Q(qtype) == Q.F16:
            return v.astype(np.float16).view(np.uint8)
        return (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    raw = random_weights(qtype, n, rows, seed).reshape(-1, block_size(qtype)[1])
    d_off, m_off = SCALE_FIELDS[Q(qtype)]
    for off in d_off + m_off:
        raw[:, off : off + 2] = np.array([2.0**a], np.float16).view(np.uint8)
    return raw.reshape(-1)


def _pow2_activation(n, seed, k):
    """Integer codes times 2^k, each 32-block led by +-127 * 2^k: both activation quantisers then
    produce scale 2^k (up to sign) and the codes themselves, exactly."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(-126, 127, size=n)
    codes[::32] = rng.choice([-127, 127], size=n // 32)
    return (codes * 2.0**k).astype(np.float32)


@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda q: q.name)
@given(st.integers(0, 2**32 - 1), st.integers(1, 3), st.integers(-8, 4), st.integers(-6, 6))
def test_every_path_is_exact_when_float_ops_are_exact(qtype, seed, nblk, a, k):
    be, _ = block_size(qtype)
    n = nblk * (256 if be == 256 else 64)
    rows = 3
    raw = _pow2_weights(qtype, n, rows, seed, a)
    x = _pow2_activation(n, seed + 1, k)
    want, _ = _reference(qtype, raw, n, rows, x)
    # All partial sums are integers in units of 2^(a+k) (1/8 of that for IQ2_XXS): exact in float32
    # whatever the order while the sum of magnitudes stays below 2^24 units.
    unit = 2.0 ** (a + k) * (0.125 if Q(qtype) == Q.IQ2_XXS else 1.0)
    w = ref.dequantize(qtype, raw, (n, rows)).astype(np.float64)
    mags = np.abs(w) @ np.abs(x.astype(np.float64)) / unit
    if Q(qtype) in (Q.Q2_K, Q.Q4_K):
        wd, wm = (ref.dequantize(qtype, p, (n, rows)).astype(np.float64) for p in split_scales(qtype, raw))
        mags = (np.abs(wd) + np.abs(wm)) @ np.abs(x.astype(np.float64)) / unit
    assume(mags.max() < 2**24)
    before = core.simd_path()
    try:
        for path in PATHS:
            core.set_simd_path(path)
            y = core.matvec(int(qtype), raw, (n, rows), x)
            np.testing.assert_array_equal(y.astype(np.float64), want, err_msg=f"path {path}")
    finally:
        core.set_simd_path(before)


@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda q: q.name)
def test_paths_agree_on_large_rows(qtype):
    """Scalar vs every SIMD path on realistic sizes (n = 4096): within twice the reference bound."""
    n, rows = 4096, 16
    raw = random_weights(qtype, n, rows, 11)
    x = activation(n, 12, "normal")
    want, tol = _reference(qtype, raw, n, rows, x)
    before = core.simd_path()
    try:
        outs = {}
        for path in PATHS:
            core.set_simd_path(path)
            outs[path] = core.matvec(int(qtype), raw, (n, rows), x)
            _check_close(outs[path], want, tol)
        for path, y in outs.items():
            _check_close(y, outs["scalar"].astype(np.float64), 2 * tol)
    finally:
        core.set_simd_path(before)


@pytest.mark.parametrize("qtype", (Q.Q2_K, Q.Q4_K, Q.IQ2_XXS), ids=lambda q: q.name)
@given(data=st.data())
def test_k_quant_paths_equal_scalar_exactly(qtype, data):
    """The K/IQ SIMD kernels form the scalar int32 block sums and reuse the scalar per-block float
    expression and order, so their results equal scalar exactly (value equality: a block with
    d == 0 may contribute -0.0 on one path and +0.0 on another)."""
    raw, n, rows, _ = data.draw(weight_case(qtype, max_rows=4, max_blocks=6))
    x = activation(n, data.draw(st.integers(0, 2**32 - 1)), data.draw(st.sampled_from(ACT_PATTERNS)))
    outs = []
    for path in PATHS:
        with simd_path(path):
            outs.append(core.matvec(int(qtype), raw, (n, rows), x))
    for y in outs[1:]:
        np.testing.assert_array_equal(y, outs[0])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda q: q.name)
def test_matmul_equals_matvec_on_long_rows(path, qtype):
    """Long rows (several 8-block groups plus a tail) and every batch remainder mod 4, so the
    multi-activation kernels' grouped reductions are compared bit for bit with matvec."""
    be, _ = block_size(qtype)
    n = 256 * 11 if be == 256 else 32 * 19 if be == 32 else 600
    rows = 5
    raw = random_weights(qtype, n, rows, 21)
    X = activation(n, 22, "normal", batch=7)
    with simd_path(path):
        Y = core.matmul(int(qtype), raw, (n, rows), X)
        for b in range(len(X)):
            np.testing.assert_array_equal(Y[b].view(np.uint32), core.matvec(int(qtype), raw, (n, rows), X[b]).view(np.uint32))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", QUANT_TYPES + (Q.F16,), ids=lambda q: q.name)
@given(data=st.data())
def test_matmul_experts_equals_matvec_experts_per_token(path, qtype, data):
    with simd_path(path):
        _test_matmul_experts_equals_matvec_experts_per_token(qtype, data)


def _test_matmul_experts_equals_matvec_experts_per_token(qtype, data):
    be, _ = block_size(qtype)
    n = 256 * data.draw(st.integers(1, 3)) if be == 256 else 32 * data.draw(st.integers(1, 20))
    rows = data.draw(st.integers(1, 70))  # crosses the 64-row work chunk
    n_expert = data.draw(st.integers(1, 6))
    n_tok, n_used = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 4))
    raw = random_weights(qtype, n, rows * n_expert, data.draw(st.integers(0, 2**32 - 1)))
    ids = np.array(data.draw(st.lists(st.integers(0, n_expert - 1), min_size=n_tok * n_used, max_size=n_tok * n_used)),
                   np.int32).reshape(n_tok, n_used)
    per_pair = data.draw(st.booleans())  # down: one activation per (token, slot); gate/up: one per token
    X = activation(n, data.draw(st.integers(0, 2**32 - 1)), "normal", batch=n_tok * (n_used if per_pair else 1))
    X = X.reshape(n_tok, n_used, n) if per_pair else X
    Y = core.matmul_experts(int(qtype), raw, (n, rows, n_expert), ids, X)
    assert Y.shape == (n_tok, n_used, rows)
    for b in range(n_tok):
        want = core.matvec_experts(int(qtype), raw, (n, rows, n_expert), ids[b], X[b])
        np.testing.assert_array_equal(Y[b].view(np.uint32), want.view(np.uint32))
