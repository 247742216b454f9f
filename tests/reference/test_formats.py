"""FP8 E4M3, FP4 E2M1, Hadamard-128 and the F16 round trip (docs/model.md §3.5, §4.4, §4.5)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from ds4.reference.fp4 import e2m1_round, fp4_roundtrip, hadamard128, indexer_qat
from ds4.reference.fp8 import E4M3_VALUES, e4m3_round, fp8_kv_roundtrip, pow2_scale
from ds4.reference.numerics import f16_round


def test_e4m3_table_code_points():
    assert E4M3_VALUES.size == 127
    assert E4M3_VALUES[0] == 0 and E4M3_VALUES[1] == 2.0**-9  # smallest subnormal
    assert E4M3_VALUES[8] == 2.0**-6                           # smallest normal
    assert E4M3_VALUES[126] == 448.0 and E4M3_VALUES[125] == 416.0
    assert np.all(np.diff(E4M3_VALUES) > 0)


def test_e4m3_round_exact_values_and_ties():
    # exact code points stay put
    assert np.array_equal(e4m3_round(E4M3_VALUES), E4M3_VALUES)
    assert np.array_equal(e4m3_round(-E4M3_VALUES[1:]), -E4M3_VALUES[1:])
    # 1.0 = code 56, 1.125 = code 57, 1.25 = code 58: 1.0625 ties -> even code 56 (1.0),
    # 1.1875 ties -> even code 58 (1.25)
    assert e4m3_round(np.float32(1.0625)) == 1.0
    assert e4m3_round(np.float32(1.1875)) == 1.25
    # 416 (code 125) and 448 (126): 432 ties -> even code 126
    assert e4m3_round(np.float32(432.0)) == 448.0
    assert e4m3_round(np.float32(1000.0)) == 448.0 and e4m3_round(np.float32(-1000.0)) == -448.0
    # subnormal tie 0.5*2^-9 between codes 0 and 1 -> code 0
    assert e4m3_round(np.float32(2.0**-10)) == 0.0
    assert e4m3_round(np.float32(1.1)) == 1.125  # plain nearest


@given(arrays(np.float32, 64, elements=st.floats(-448, 448, width=32)))
def test_e4m3_round_is_nearest(v):
    r = e4m3_round(v)
    cand = np.concatenate([-E4M3_VALUES[::-1], E4M3_VALUES])
    best = np.abs(v[:, None] - cand[None, :]).min(axis=1)
    assert np.array_equal(np.abs(v - r), best)


def test_pow2_scale_exact_power_of_two_corner():
    # amax/448 exactly 2^k must give scale 2^k (log2 exact), not 2^(k+1)
    assert pow2_scale(np.float32(448.0 * 4), 448.0) == 4.0
    assert pow2_scale(np.float32(448.0 * 4 * 1.0001), 448.0) == 8.0
    assert pow2_scale(np.float32(6.0 / 8), 6.0) == 0.125


def test_fp8_kv_roundtrip_blocks_and_tail():
    rng = np.random.default_rng(0)
    row = rng.standard_normal(256).astype(np.float32) * 3
    out = fp8_kv_roundtrip(row, 64)
    assert np.array_equal(out[192:], row[192:])  # RoPE tail untouched
    for b in range(3):
        blk = row[b * 64:(b + 1) * 64]
        scale = 2.0 ** np.ceil(np.log2(np.abs(blk).max() / 448.0))
        # every value is an E4M3 code times the block's power-of-two scale
        q = out[b * 64:(b + 1) * 64] / scale
        assert np.all(np.isin(np.abs(q), E4M3_VALUES))
        # relative error of E4M3 (3 mantissa bits): at most 2^-4 of the value, for normals
        big = np.abs(blk) > scale * 2.0**-6
        assert np.all(np.abs(out[b * 64:(b + 1) * 64][big] - blk[big]) <= np.abs(blk[big]) * 2.0**-4)
    with pytest.raises(ValueError):
        fp8_kv_roundtrip(np.zeros(100, np.float32), 64)


def test_fp8_small_block_uses_floor_amax():
    row = np.zeros(128, np.float32)
    row[0] = 1e-9  # amax floored to 1e-4 -> scale 2^ceil(log2(1e-4/448)) = 2^-22
    out = fp8_kv_roundtrip(row, 64)
    assert out[0] == e4m3_round(np.float32(1e-9) / np.float32(2.0**-22)) * np.float32(2.0**-22)


def test_e2m1_documented_ties():
    v = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, 7.0, 0.3], np.float32)
    assert e2m1_round(v).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 0.0, -2.0, 6.0, 0.5]


def test_fp4_roundtrip_scale():
    x = np.zeros(32, np.float32)
    x[:4] = [6.0, 1.25, -3.5, 0.25]  # amax 6 -> scale 1
    assert fp4_roundtrip(x)[:4].tolist() == [6.0, 1.0, -4.0, 0.0]
    y = x * 8  # scale 8: same codes
    assert (fp4_roundtrip(y)[:4] / 8).tolist() == [6.0, 1.0, -4.0, 0.0]


def _hadamard_matrix():
    h = np.array([[1.0]])
    for _ in range(7):
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(128)


@given(arrays(np.float32, (3, 128), elements=st.floats(-100, 100, width=32)))
def test_hadamard_matches_sylvester_matrix_and_is_involution(x):
    h = hadamard128(x)
    ref = x.astype(np.float64) @ _hadamard_matrix().T
    # float32 butterfly: 7 levels of adds, each value bounded by sqrt(128)*max|x|
    tol = 1e-5 * (np.abs(x).max() * 128 + 1)
    np.testing.assert_allclose(h, ref, atol=tol)
    np.testing.assert_allclose(hadamard128(h), x, atol=2 * tol)


def test_indexer_qat_is_hadamard_then_fp4():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 128)).astype(np.float32)
    assert np.array_equal(indexer_qat(x), fp4_roundtrip(hadamard128(x)))


def test_f16_round_trip():
    x = np.array([1.0, 1.0 + 2**-11, 1.0 + 3 * 2**-11, 70000.0, 2**-25], np.float32)
    # ties to even: 1+2^-11 -> 1, 1+3·2^-11 -> 1+2^-9; overflow -> inf; 2^-25 is half the smallest
    # f16 subnormal (2^-24) -> ties to even 0
    assert f16_round(x).tolist() == [1.0, 1.0, 1.0 + 2**-9, np.inf, 0.0]
