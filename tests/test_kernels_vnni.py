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


# ---- Q8_0 small batches (matmul below the GEMM crossover: the prepared multi-activation kernel) ---


def _q8_0_extreme_weights(n, rows, seed, mode, extreme_frac):
    """Q8_0 weights of random_weights (any codes, scales of `mode`) with a fraction of the codes
    set to the extremes -128 / -127 / 127, where an error in the u8 offset would show."""
    raw = random_weights(Q.Q8_0, n, rows, seed, mode).reshape(-1, 34).copy()
    rng = np.random.default_rng(seed + 1)
    codes = raw[:, 2:].view(np.int8)
    hit = rng.random(codes.shape) < extreme_frac
    codes[hit] = rng.choice(np.array([-128, -127, 127], np.int8), size=int(hit.sum()))
    return raw.reshape(-1)


@given(data=st.data())
def test_q8_0_small_batch_bit_identical_to_row_kernel(data):
    """Every (row, token) of a small-batch matmul must be the avx512 row kernel's result to the bit
    (x86_q8_0_n: same int32 block sums, same eight-lane float order) and the matvec of the same
    path. Row lengths cover whole 16-block chunks, a trailing group of 8 and leftover blocks
    (1..40 blocks); batches 1..9 cover one and two calls of up to 8 activations."""
    nblk = data.draw(st.integers(1, 40))
    n, rows = 32 * nblk, data.draw(st.integers(1, 9))
    nb = data.draw(st.integers(1, 9))
    mode = data.draw(st.sampled_from(("normal", "subnormal", "huge", "mixed", "zero_blocks")))
    raw = _q8_0_extreme_weights(n, rows, data.draw(st.integers(0, 2**31)), mode, data.draw(st.sampled_from((0.0, 0.1, 1.0))))
    X = activation(n, data.draw(st.integers(0, 2**32 - 1)), data.draw(st.sampled_from(ACT_PATTERNS)), batch=nb)
    want = _on("avx512", lambda: core.matmul(int(Q.Q8_0), raw, (n, rows), X))
    got = _on("avx512vnni", lambda: core.matmul(int(Q.Q8_0), raw, (n, rows), X))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    for b in range(nb):
        y = _on("avx512vnni", lambda: core.matvec(int(Q.Q8_0), raw, (n, rows), X[b]))
        np.testing.assert_array_equal(got[b].view(np.uint32), y.view(np.uint32))


def test_q8_0_small_batch_check_sees_one_scale():
    """The bitwise comparison above is not vacuous on realistic data: a one-ulp change of a single
    block's f16 scale (in each position of the 16-block chunk, the 8-block group and the leftover
    blocks) changes that row's output for the tokens, and the small-batch kernel follows it
    exactly. So a kernel pairing any block with a wrong scale would fail the test above."""
    n, rows, nb = 32 * 27, 3, 9  # 16 + 8 + 3 blocks
    raw = _q8_0_extreme_weights(n, rows, 5, "normal", 0.1)
    X = activation(n, 6, "normal", batch=nb)
    base = _on("avx512vnni", lambda: core.matmul(int(Q.Q8_0), raw, (n, rows), X))
    for blk in range(n // 32):
        bad = raw.reshape(-1, 34).copy()
        bad[n // 32 + blk, :2] = (bad[n // 32 + blk, :2].view(np.uint16) ^ np.uint16(1)).view(np.uint8)  # row 1
        bad = bad.reshape(-1)
        got = _on("avx512vnni", lambda: core.matmul(int(Q.Q8_0), bad, (n, rows), X))
        want = _on("avx512", lambda: core.matmul(int(Q.Q8_0), bad, (n, rows), X))
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        assert (got[:, 1] != base[:, 1]).any(), f"block {blk}: one-ulp scale change invisible"
        np.testing.assert_array_equal(got[:, [0, 2]], base[:, [0, 2]])


@pytest.mark.parametrize("nb", [8, 9, 16, 17, 24])
def test_q8_0_batches_around_the_crossovers_match_matvec(nb):
    """Batches at the kernel's 8-activation step and at the switch to the GEMM (17 tokens, matvec.cpp):
    every token's row equals matvec to the bit on either side."""
    n, rows = 32 * 40, 21
    raw = _q8_0_extreme_weights(n, rows, nb, "normal", 0.05)
    X = activation(n, nb + 100, "normal", batch=nb)
    Y = core.matmul(int(Q.Q8_0), raw, (n, rows), X)
    for b in range(nb):
        np.testing.assert_array_equal(Y[b].view(np.uint32), core.matvec(int(Q.Q8_0), raw, (n, rows), X[b]).view(np.uint32))


# ---- Q8_0 matvec (one activation: q8_0_dot_vec, codes in block order) ---------------------------


@given(data=st.data())
def test_q8_0_matvec_bit_identical_to_row_kernel(data):
    """matvec on avx512vnni runs its own one-activation kernel (block-order codes, a transposing
    add tree per 8 blocks, scales assembled without a gather): every output must be the avx512 row
    kernel's (x86_q8_0_n) to the bit. Lengths cover several 16-block steps, a trailing group of 8
    and leftover blocks (1..70 blocks), extreme codes and every scale mode."""
    nblk = data.draw(st.integers(1, 70))
    n, rows = 32 * nblk, data.draw(st.integers(1, 7))
    mode = data.draw(st.sampled_from(("normal", "subnormal", "huge", "mixed", "zero_blocks")))
    raw = _q8_0_extreme_weights(n, rows, data.draw(st.integers(0, 2**31)), mode, data.draw(st.sampled_from((0.0, 0.1, 1.0))))
    x = activation(n, data.draw(st.integers(0, 2**32 - 1)), data.draw(st.sampled_from(ACT_PATTERNS)))
    want = _on("avx512", lambda: core.matvec(int(Q.Q8_0), raw, (n, rows), x))
    got = _on("avx512vnni", lambda: core.matvec(int(Q.Q8_0), raw, (n, rows), x))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_q8_0_matvec_check_sees_every_block():
    """The bitwise check above is not vacuous for the matvec kernel: changing one block's f16 scale
    (one mantissa bit, ~6 %) or its codes (bit 6 of each), at every block position of a 2048-long
    row (decode's shape: four 16-block steps) and of a 16 + 8 + 3 block row, changes that row's
    output, and the kernel follows the avx512 row kernel exactly. So a kernel pairing a block with
    a wrong scale, or a block sum with the wrong lane of the add tree, would fail the test above."""
    for nblk in (64, 27):
        n, rows = 32 * nblk, 3
        # scales of one magnitude, so that every block's term shows in the row's float sum
        rng = np.random.default_rng(nblk)
        blocks = rng.integers(-128, 128, size=(rows * nblk, 34)).astype(np.int8).view(np.uint8)
        blocks[:, :2] = rng.uniform(0.5, 1.0, rows * nblk).astype(np.float16).view(np.uint8).reshape(-1, 2)
        raw = np.ascontiguousarray(blocks).reshape(-1)
        x = activation(n, 7, "normal")
        base = _on("avx512vnni", lambda: core.matvec(int(Q.Q8_0), raw, (n, rows), x))
        for blk in range(nblk):
            for field in ("scale", "codes"):
                bad = raw.reshape(-1, 34).copy()
                if field == "scale":
                    bad[nblk + blk, :2] = (bad[nblk + blk, :2].view(np.uint16) ^ np.uint16(1 << 6)).view(np.uint8)
                else:
                    bad[nblk + blk, 2:] ^= np.uint8(0x40)
                bad = bad.reshape(-1)
                got = _on("avx512vnni", lambda: core.matvec(int(Q.Q8_0), bad, (n, rows), x))
                want = _on("avx512", lambda: core.matvec(int(Q.Q8_0), bad, (n, rows), x))
                np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
                assert got[1] != base[1], f"{nblk} blocks: {field} change in block {blk} invisible"
                np.testing.assert_array_equal(got[[0, 2]], base[[0, 2]])
