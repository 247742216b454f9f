"""The register-blocked prefill GEMM (csrc/quant/gemm*.cpp, docs/gemm.md) on shapes that cross its
tiles: 16 weight rows per panel, 8 tokens per register tile, Q8_0 blocks in groups of 8.

What must hold (docs/gemm.md "Numerics"):
  * bit-identical to the row kernel of the same SIMD path, token by token (matvec): the GEMM forms
    the same exact int32 block sums and the same float operations in the same order;
  * therefore for Q2_K, Q4_K and IQ2_XXS bit-identical to the scalar path as well (the x86 row
    kernels are), and for Q8_0 within twice the derived bound of test_kernels_matvec (the x86 Q8_0
    row kernel sums blocks in eight lanes, scalar sequentially);
  * within the derived float64-reference bound of test_kernels_matvec (no new tolerance).
These run on every path of core.simd_paths(): the GEMM runs on avx512vnni, avx512 and avx2 (all four
types, test_gemm_covers_every_type_on_x86_paths) for matrices/experts with at least gemm_min_tokens
(4; 6 for Q2_K; 8 for IQ2_XXS on avx2 / avx512) tokens; elsewhere the row kernels run and the same
assertions hold.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given, settings, strategies as st

import ds4._core as core
from test_kernels_matvec import PATHS, _check_close, _reference, simd_path
from test_quant_blocks import ACT_PATTERNS, QUANT_TYPES, SCALE_FIELDS, activation, block_size, random_weights

SCALAR_EXACT = (Q.Q2_K, Q.Q4_K, Q.IQ2_XXS)


def _shape(data, qtype):
    be, _ = block_size(qtype)
    # Q8_0: 1..20 blocks (whole groups of 8 plus tails); K/IQ: 1..3 superblocks.
    n = be * data.draw(st.integers(1, 20 if be == 32 else 3))
    rows = data.draw(st.integers(1, 40))  # 1..3 panels, the last one partial
    nb = data.draw(st.integers(1, 20))  # 0..2 full token tiles plus a remainder
    return n, rows, nb


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda q: q.name)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_gemm_matches_matvec_scalar_and_reference(path, qtype, data):
    n, rows, nb = _shape(data, qtype)
    raw = random_weights(qtype, n, rows, data.draw(st.integers(0, 2**32 - 1)),
                         data.draw(st.sampled_from(("normal", "normal", "zero", "subnormal", "huge"))))
    X = activation(n, data.draw(st.integers(0, 2**32 - 1)), data.draw(st.sampled_from(ACT_PATTERNS)), batch=nb)
    with simd_path(path):
        Y = core.matmul(int(qtype), raw, (n, rows), X)
        per_token = np.stack([core.matvec(int(qtype), raw, (n, rows), x) for x in X])
    np.testing.assert_array_equal(Y.view(np.uint32), per_token.view(np.uint32))
    want, tol = _reference(qtype, raw, n, rows, X)
    _check_close(Y, want, tol)
    with simd_path("scalar"):
        Ys = core.matmul(int(qtype), raw, (n, rows), X)
    if qtype in SCALAR_EXACT:
        np.testing.assert_array_equal(Y.view(np.uint32), Ys.view(np.uint32))
    else:
        _check_close(Y, Ys.astype(np.float64), 2 * tol)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda q: q.name)
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_gemm_experts_match_matvec_experts(path, qtype, data):
    """Many tokens per expert (so experts get full 8-token tiles) and rows crossing panels."""
    be, _ = block_size(qtype)
    n = be * (data.draw(st.integers(1, 10)) if be == 32 else data.draw(st.integers(1, 2)))
    rows, n_expert = data.draw(st.integers(1, 36)), data.draw(st.integers(1, 4))
    n_tok, n_used = data.draw(st.integers(1, 24)), data.draw(st.integers(1, min(3, n_expert)))
    raw = random_weights(qtype, n, rows * n_expert, data.draw(st.integers(0, 2**32 - 1)))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    ids = np.stack([rng.choice(n_expert, n_used, replace=False) for _ in range(n_tok)]).astype(np.int32)
    per_pair = data.draw(st.booleans())
    X = activation(n, data.draw(st.integers(0, 2**32 - 1)), "normal", batch=n_tok * (n_used if per_pair else 1))
    X = X.reshape(n_tok, n_used, n) if per_pair else X
    with simd_path(path):
        Y = core.matmul_experts(int(qtype), raw, (n, rows, n_expert), ids, X)
        for b in range(n_tok):
            want = core.matvec_experts(int(qtype), raw, (n, rows, n_expert), ids[b], X[b])
            np.testing.assert_array_equal(Y[b].view(np.uint32), want.view(np.uint32))


# The AVX-512 panel decoders read each row group's blocks as contiguous row loads transposed in
# registers: Q8_0 in spans of 4 blocks (136 bytes, a dword boundary) with a 1-3 block tail read
# through byte masks, Q4_K/IQ2_XXS with a 16-byte-per-row transpose for the bytes past 128 (Q4_K
# dwords 32-35, the IQ2_XXS scale). Every span tail, every partial group (rows past the last
# full 16 are never read) and tokens past the prepared small-batch cut-off (dense Q8_0 matmul
# takes the GEMM from 16 tokens) must give the row kernel's bits.
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda q: q.name)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_gemm_panel_span_tails_and_partial_groups(path, qtype, data):
    be, _ = block_size(qtype)
    n = be * data.draw(st.integers(1, 13) if be == 32 else st.integers(1, 2))
    rows = data.draw(st.sampled_from((1, 2, 3, 7, 15, 16, 17, 31, 33)))
    nb = data.draw(st.integers(16, 26))
    raw = random_weights(qtype, n, rows, data.draw(st.integers(0, 2**32 - 1)),
                         data.draw(st.sampled_from(("normal", "mixed", "subnormal", "huge"))))
    X = activation(n, data.draw(st.integers(0, 2**32 - 1)), data.draw(st.sampled_from(ACT_PATTERNS)), batch=nb)
    with simd_path(path):
        Y = core.matmul(int(qtype), raw, (n, rows), X)
        per_token = np.stack([core.matvec(int(qtype), raw, (n, rows), x) for x in X])
    np.testing.assert_array_equal(Y.view(np.uint32), per_token.view(np.uint32))


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda q: q.name)
def test_gemm_realistic_shape_bit_identical_to_matvec(qtype):
    """n = 4096, 37 rows (two full panels and a partial one), 19 tokens (two tiles + 3)."""
    n, rows, nb = 4096, 37, 19
    raw = random_weights(qtype, n, rows, 41)
    X = activation(n, 42, "normal", batch=nb)
    for path in PATHS:
        with simd_path(path):
            Y = core.matmul(int(qtype), raw, (n, rows), X)
            for b in (0, 7, 8, 15, 16, 18):
                np.testing.assert_array_equal(Y[b].view(np.uint32),
                                              core.matvec(int(qtype), raw, (n, rows), X[b]).view(np.uint32), err_msg=path)


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda q: q.name)
def test_reference_bound_catches_one_code_decoding_error(qtype):
    """The smallest decoding error a panel bug makes (one weight code of one row off by one step,
    here a changed byte of the code area) moves that row's outputs beyond the bound used above,
    while the other rows stay inside it."""
    n, rows, nb = 512, 20, 9
    be, bb = block_size(qtype)
    row_bytes = n // be * bb
    # Every block gets the same f16 scales (0.01) and a full sub-block scale where the code is
    # changed, so the change is a full code step of this row and not hidden under a block with a
    # much larger scale (the bound is relative to the whole row's sum of |terms|).
    blocks = random_weights(qtype, n, rows, 5).reshape(-1, bb)
    d_off, m_off = SCALE_FIELDS[qtype]
    for off in d_off + m_off:
        blocks[:, off : off + 2] = np.array([0.01], np.float16).view(np.uint8)
    if qtype == Q.Q2_K:
        blocks[:, 0] |= 0x0F
    if qtype == Q.Q4_K:
        blocks[:, 4] |= 0x3F
    raw = blocks.reshape(-1)
    X = activation(n, 6, "normal", batch=nb)
    want, tol = _reference(qtype, raw, n, rows, X)
    code_off = {Q.Q8_0: 2, Q.Q2_K: 16, Q.Q4_K: 16, Q.IQ2_XXS: 2}[qtype]
    bad = raw.copy()
    r = 17  # in the second (partial) panel
    bad[r * row_bytes + code_off] ^= 0x01 if qtype != Q.IQ2_XXS else 0x05  # another grid row
    Y = core.matmul(int(qtype), bad, (n, rows), X)
    err = np.abs(Y.astype(np.float64) - want)
    assert (err[:, r] > tol[:, r]).any(), "a one-code error went unnoticed"
    others = np.delete(np.arange(rows), r)
    assert (err[:, others] <= tol[:, others]).all()


GEMM_PATHS = [p for p in PATHS if p in ("avx2", "avx512", "avx512vnni", "neon")]


@pytest.mark.parametrize("path", GEMM_PATHS)
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda q: q.name)
def test_gemm_covers_every_type_on_x86_paths(path, qtype):
    """Every quantised type has a GEMM on every SIMD path that has one at all (so the bit-identity
    tests above compare the GEMM with the row kernel, not the row kernel with itself); scalar none."""
    with simd_path(path):
        assert core.gemm_active(int(qtype), 4096)
    with simd_path("scalar"):
        assert not core.gemm_active(int(qtype), 4096)


def _q8_0_act_codes(x):
    q = core.quantize_act(int(Q.Q8_0), x).reshape(-1, 36)
    return q[:, 4:].view(np.int8)


# The AVX2 / plain AVX-512 Q8_0 tiles multiply |w| by the activation code carrying w's sign, which
# wraps for an activation code of -128 (blocks whose scale is subnormal, quantize_act.cpp) against a
# negative w; the driver's mask of those codes lets the tile add the difference back
# (docs/gemm.md "Signed codes"). Blocks of tiny values next to ordinary ones, weights with every
# code including -128, and whole tokens of tiny values (whose outputs are tiny too, so a missing
# correction is not rounded away under larger terms).
@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_gemm_q8_0_activation_code_minus_128(path, data):
    n = 32 * data.draw(st.integers(1, 20))
    rows, nb = data.draw(st.integers(1, 40)), data.draw(st.integers(16, 24))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    raw = random_weights(Q.Q8_0, n, rows, data.draw(st.integers(0, 2**32 - 1)))
    blocks = raw.reshape(-1, 34)
    blocks[:, 2:][rng.random((blocks.shape[0], 32)) < 0.1] = 0x80  # weight code -128 too
    X = rng.standard_normal((nb, n)).astype(np.float32)
    tiny = rng.random((nb, n // 32)) < data.draw(st.sampled_from((0.2, 0.5, 1.0)))
    tiny[0] = False
    # Per block 2^-119 .. 2^-142: scales from just normal through subnormal with a finite reciprocal
    # (codes off by the scale's rounding) to an infinite one (codes +-127 / -128 only).
    Xb = X.reshape(nb, -1, 32)
    Xb[tiny] *= np.exp2(-rng.integers(119, 143, size=(int(tiny.sum()), 1))).astype(np.float32)
    Xb[0] *= np.float32(2.0**-130)  # one token all tiny, with -128 codes for its negative values
    codes = _q8_0_act_codes(X)
    assert (codes == -128).any(), "no -128 activation code: the case is not exercised"
    with simd_path(path):
        Y = core.matmul(int(Q.Q8_0), raw, (n, rows), X)
        per_token = np.stack([core.matvec(int(Q.Q8_0), raw, (n, rows), x) for x in X])
    np.testing.assert_array_equal(Y.view(np.uint32), per_token.view(np.uint32))
    want, tol = _reference(Q.Q8_0, raw, n, rows, X)
    _check_close(Y, want, tol)


@contextlib.contextmanager
def _bytes_before_guard_page(data: np.ndarray):
    """A copy of `data` whose last byte is the last readable byte before a PROT_NONE page, so a
    kernel reading past the end of the weights faults instead of reading garbage."""
    page = mmap.PAGESIZE
    body = -(-data.size // page) * page
    m = mmap.mmap(-1, body + page)
    anchor = ctypes.c_char.from_buffer(m)
    base = ctypes.addressof(anchor)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    assert libc.mprotect(base + body, page, 0) == 0  # PROT_NONE
    try:
        view = np.frombuffer(m, np.uint8, count=data.size, offset=body - data.size)
        view[:] = data
        yield view
    finally:  # readable again before anything can free the mapping (numpy views keep it alive)
        libc.mprotect(base + body, page, mmap.PROT_READ | mmap.PROT_WRITE)


@pytest.mark.skipif(sys.platform != "linux", reason="mprotect through ctypes: Linux only")
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda q: q.name)
def test_gemm_decoders_read_nothing_past_the_weights(qtype):
    """The panel decoders load whole rows of block bytes (masked at block tails); with the weights
    ending right before an unreadable page, every path, row count and Q8_0 span tail must run (and
    give the row kernel's bits)."""
    be, _ = block_size(qtype)
    for nblk in ((1, 2, 3, 4, 5, 9) if be == 32 else (1, 2)):
        n = be * nblk
        for rows in (1, 7, 8, 9, 16, 17):
            raw = random_weights(qtype, n, rows, 100 * nblk + rows)
            X = activation(n, 7, "normal", batch=17)
            with _bytes_before_guard_page(raw) as w:
                for path in PATHS:
                    with simd_path(path):
                        Y = core.matmul(int(qtype), w, (n, rows), X)
                        want = np.stack([core.matvec(int(qtype), w, (n, rows), x) for x in X])
                    np.testing.assert_array_equal(Y.view(np.uint32), want.view(np.uint32), err_msg=path)


def test_int8_dot_peak_probe():
    p = core.int8_dot_peak(10_000)
    if "avx512vnni" not in core.simd_paths():
        assert p["macs"] == 0
        return
    assert p["macs"] == core.threads() * 10_000 * 12 * 64
    assert p["wall_s"] > 0 and p["cpu_s"] > 0
