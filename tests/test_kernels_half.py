"""F16/BF16 weights in register tiles (csrc/quant/dot_half_tile.inc, matmul_half.cpp; docs/gemm.md
"Half-precision weights"): 2 rows x 3 tokens per tile on AVX-512, 1 x 3 on AVX2, 4 / 2 rows per
tile for one token (decode), row blocks x token blocks over threads.

What must hold:
  * every output equals the path's row kernel on that row and token, bit for bit: the tile keeps
    the row kernel's float operations per output (4 accumulators over steps of 4 vectors, the same
    final reduction, the tail element by element). The row kernel is what matvec of a one-row
    matrix runs (a 1 x 1 tile); the test compares matmul and matvec against it row by row;
  * the old matmul (row kernels, DS4_GEMM=rows-half) gives the same bits as well;
  * within the derived float64-reference bound of test_kernels_matvec: (n + 6) u S + u |y|, where
    S = sum |w_i x_i| (n float summands, each product exact in float32 before its one rounding).
Shapes cross every tile edge: n not a multiple of 16 / 64 (tails), rows odd and beyond one row
block, 1..20 tokens (full tiles of 3 plus 1-2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given, settings, strategies as st

import ds4._core as core
from test_kernels_matvec import PATHS, _check_close, _reference, simd_path
from test_quant_blocks import ACT_PATTERNS, activation, random_weights

HALF_TYPES = (Q.F16, Q.BF16)


def _row_kernel(qtype, raw, n, rows, X):
    """[nb, rows]: each output from a one-row matvec, i.e. the row kernel (1 x 1 tile)."""
    rb = 2 * n
    return np.stack([[core.matvec(int(qtype), raw[r * rb : (r + 1) * rb], (n, 1), x)[0] for r in range(rows)]
                     for x in X]).astype(np.float32)


def _bits_equal(a, b):
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", HALF_TYPES, ids=lambda q: q.name)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_tiles_match_row_kernel_and_reference(path, qtype, data):
    n = data.draw(st.one_of(st.integers(1, 40), st.integers(41, 300)))  # below one vector .. several steps + tail
    rows = data.draw(st.integers(1, 21))
    nb = data.draw(st.integers(1, 20))
    raw = random_weights(qtype, n, rows, data.draw(st.integers(0, 2**32 - 1)),
                         data.draw(st.sampled_from(("normal", "mixed"))))
    # (zero blocks are drawn per 32 activations: only when the batch holds whole ones)
    patterns = [p for p in ACT_PATTERNS if p != "mixed_zero_blocks" or (n * nb) % 32 == 0]
    X = activation(n, data.draw(st.integers(0, 2**32 - 1)), data.draw(st.sampled_from(patterns)), batch=nb)
    with simd_path(path):
        Y = core.matmul(int(qtype), raw, (n, rows), X)
        per_token = np.stack([core.matvec(int(qtype), raw, (n, rows), x) for x in X])
        per_row = _row_kernel(qtype, raw, n, rows, X)
    np.testing.assert_array_equal(Y.view(np.uint32), per_row.view(np.uint32))
    np.testing.assert_array_equal(per_token.view(np.uint32), per_row.view(np.uint32))
    want, tol = _reference(qtype, raw, n, rows, X)
    _check_close(Y, want, tol)


@pytest.mark.parametrize("qtype", HALF_TYPES, ids=lambda q: q.name)
def test_realistic_shapes_match_row_kernel(qtype):
    """Shapes of the small model's F16 tensors (n x rows): several row blocks of 128 KiB, the
    24-row hc_*_fn split over tokens, and a 5-token speculative batch."""
    for n, rows, nb in ((1024, 150, 7), (4096, 24, 11), (1030, 64, 5)):
        raw = random_weights(qtype, n, rows, n + rows)
        X = activation(n, nb, "normal", batch=nb)
        for path in PATHS:
            with simd_path(path):
                Y = core.matmul(int(qtype), raw, (n, rows), X)
                y0 = core.matvec(int(qtype), raw, (n, rows), X[nb - 1])
                per_row = _row_kernel(qtype, raw, n, rows, X[[0, nb - 1]])
            np.testing.assert_array_equal(Y[[0, nb - 1]].view(np.uint32), per_row.view(np.uint32), err_msg=path)
            np.testing.assert_array_equal(y0.view(np.uint32), per_row[1].view(np.uint32), err_msg=path)


_ROW_KERNEL_RUN = r"""
import json, sys, numpy as np, ds4._core as core
sys.path.insert(0, sys.argv[1])
from test_quant_blocks import activation, random_weights
out = {}
for qtype in (1, 30):  # F16, BF16
    for n, rows, nb in ((300, 13, 8), (1024, 40, 4)):
        raw = random_weights(qtype, n, rows, 3)
        X = activation(n, 4, "normal", batch=nb)
        for path in core.simd_paths():
            core.set_simd_path(path)
            out[f"{qtype}/{n}/{path}"] = core.matmul(qtype, raw, (n, rows), X).view(np.uint32).tolist()
print(json.dumps(out))
"""


def test_same_bits_as_row_kernel_matmul():
    """DS4_GEMM=rows-half runs F16/BF16 matmul on the row kernels (DotFn per row and token, the
    code before the tiles): a fresh process with it gives the same bits as the tiles here."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, DS4_GEMM="rows-half")
    res = subprocess.run([sys.executable, "-c", _ROW_KERNEL_RUN, here], env=env, capture_output=True, text=True,
                         check=True, timeout=300)
    old = json.loads(res.stdout)
    for key, bits in old.items():
        qtype, n, path = key.split("/")
        n = int(n)
        rows, nb = {300: (13, 8), 1024: (40, 4)}[n]
        raw = random_weights(int(qtype), n, rows, 3)
        X = activation(n, 4, "normal", batch=nb)
        with simd_path(path):
            Y = core.matmul(int(qtype), raw, (n, rows), X)
        np.testing.assert_array_equal(Y.view(np.uint32), np.array(bits, np.uint32), err_msg=key)


@pytest.mark.parametrize("qtype", HALF_TYPES, ids=lambda q: q.name)
def test_bit_check_catches_one_ulp_weight(qtype):
    """The bit comparison above is not vacuous: one weight of one row one ulp off (the raw 16-bit
    pattern + 1) changes that row's outputs, and only that row's."""
    n, rows, nb = 200, 9, 7
    raw = random_weights(qtype, n, rows, 11)
    X = activation(n, 12, "normal", batch=nb)
    Y = core.matmul(int(qtype), raw, (n, rows), X)
    r = 5
    w16 = raw.view(np.uint16)
    i = int(np.argmax(np.abs(ref_weights(qtype, raw, n, rows)[r] * X[0])))  # the largest term of token 0
    bad = w16.copy()
    bad[r * n + i] += 1
    per_row = _row_kernel(qtype, bad.view(np.uint8), n, rows, X)
    assert not _bits_equal(Y, per_row)
    assert not _bits_equal(Y[:, r], per_row[:, r])
    others = np.delete(np.arange(rows), r)
    assert _bits_equal(Y[:, others], per_row[:, others])


def ref_weights(qtype, raw, n, rows):
    from ds4.reference import quant as ref

    return ref.dequantize(qtype, raw, (n, rows)).astype(np.float64)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", HALF_TYPES, ids=lambda q: q.name)
def test_reference_bound_catches_one_lost_term(path, qtype):
    """The smallest error a tile bug makes (one element of one row skipped, or taken from another
    token: an error of one term w_i x_i) moves that row beyond the reference bound for a term of
    about average size (|w_i x_i| >= S / (2n)) at n = 1000, while the other rows stay inside it.
    (The bound is about n^2 u S / n: it catches such a term up to n of a few thousand.)"""
    n, rows, nb = 1000, 7, 5
    raw = random_weights(qtype, n, rows, 21)
    X = activation(n, 22, "normal", batch=nb)
    r = 3
    w = ref_weights(qtype, raw, n, rows)
    i = int(np.argmin(np.abs(np.abs(w[r]) - np.mean(np.abs(w[r])))))  # a weight of the row's mean magnitude
    X[:, i] = np.float32(np.mean(np.abs(X)))  # against an activation of average magnitude
    want, tol = _reference(qtype, raw, n, rows, X)
    S = np.abs(X.astype(np.float64)) @ np.abs(w[r])
    assert (np.abs(w[r, i] * X[:, i]) >= S / (2 * n)).all()  # the term is not a small one
    bad = raw.view(np.uint16).copy()
    bad[r * n + i] = 0  # +0.0 in both formats: the term is lost
    with simd_path(path):
        Y = core.matmul(int(qtype), bad.view(np.uint8), (n, rows), X)
    err = np.abs(Y.astype(np.float64) - want)
    assert (err[:, r] > tol[:, r]).all(), "a lost term went unnoticed"
    others = np.delete(np.arange(rows), r)
    assert (err[:, others] <= tol[:, others]).all()
