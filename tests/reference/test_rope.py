"""RoPE on the head tails and YaRN for compressed layers (docs/model.md §3.4)."""

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ds4.reference.rope import RopeParams, rope_angles, rope_params, rope_tail, yarn_corr_dims
from ds4.shape import FLASH

positions = st.integers(0, 70000)
seeds = st.integers(0, 2**32 - 1)
DENSE = rope_params(FLASH, 0)
COMP = rope_params(FLASH, 4)


def test_layer_parameters():
    assert DENSE == RopeParams(64, 10000.0)
    assert COMP.freq_base == 160000.0 and COMP.freq_scale == 1 / 16 and COMP.ext_factor == 1.0
    assert COMP.n_ctx_orig == 65536
    assert rope_params(FLASH, 128) == COMP


def test_yarn_corr_dims_flash():
    low, high = yarn_corr_dims(COMP)
    assert (low, high) == (15.0, 25.0)  # corr(32) ≈ 15.45 -> floor 15, corr(1) ≈ 24.71 -> ceil 25


def test_yarn_has_no_magnitude_scaling():
    c, s = rope_angles(COMP, 12345)
    # mscale is exactly 1 in float32, so every pair is a pure rotation
    np.testing.assert_allclose(c.astype(np.float64) ** 2 + s.astype(np.float64) ** 2, 1.0, atol=2e-7)


def _expected_theta(p, pos):
    k = np.arange(p.n_rot // 2)
    extrap = pos * p.freq_base ** (-2.0 * k / p.n_rot)
    if p.ext_factor == 0:
        return extrap * p.freq_scale
    low, high = 15, 25
    ramp = 1 - np.clip((k - low) / (high - low), 0, 1)
    return extrap * p.freq_scale * (1 - ramp) + extrap * ramp


@given(positions)
def test_angles_follow_the_frequency_schedule(pos):
    for p in (DENSE, COMP):
        c, s = rope_angles(p, pos)
        theta = _expected_theta(p, pos)
        # repeated float32 multiplication: relative angle error grows ~1e-7 per pair (32 pairs),
        # so compare rotations by the sine of the angle difference, scaled by the angle itself
        diff = np.arctan2(s * np.cos(theta) - c * np.sin(theta), c * np.cos(theta) + s * np.sin(theta))
        assert np.all(np.abs(diff) <= 1e-5 * (1 + theta))


def test_yarn_blend_regions():
    pos = 3  # every angle below pi, so atan2 recovers it
    c, s = rope_angles(COMP, pos)
    theta = np.arctan2(s.astype(np.float64), c.astype(np.float64))
    extrap = pos * 160000.0 ** (-2.0 * np.arange(32) / 64)
    np.testing.assert_allclose(theta[:16], extrap[:16], rtol=1e-5)       # k <= 15: unscaled
    np.testing.assert_allclose(theta[25:], extrap[25:] / 16, rtol=1e-5)  # k >= 25: frequency / 16
    mid = theta[16:25] / extrap[16:25]                                     # blend: strictly between
    assert np.all((mid < 1) & (mid > 1 / 16)) and np.all(np.diff(mid) < 0)


@given(seeds, st.integers(0, 5000), st.sampled_from([0, 4]))
def test_rope_is_complex_rotation_of_tail_pairs(seed, pos, ratio):
    p = rope_params(FLASH, ratio)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(3 * 192).astype(np.float32)
    y = rope_tail(x, 3, 192, p, pos)
    xr, yr = x.reshape(3, 192), y.reshape(3, 192)
    assert np.array_equal(yr[:, :128], xr[:, :128])  # non-RoPE dims untouched
    c, s = rope_angles(p, pos)
    z = xr[:, 128::2].astype(np.complex128) + 1j * xr[:, 129::2]
    rot = z * (c.astype(np.float64) + 1j * s.astype(np.float64))
    np.testing.assert_allclose(yr[:, 128::2], rot.real, atol=1e-5)
    np.testing.assert_allclose(yr[:, 129::2], rot.imag, atol=1e-5)
    # rotation preserves every pair's norm
    np.testing.assert_allclose(np.abs(z), np.hypot(yr[:, 128::2], yr[:, 129::2]), rtol=1e-5)


@given(seeds, positions, st.sampled_from([0, 4]))
def test_inverse_rope_undoes_rope(seed, pos, ratio):
    p = rope_params(FLASH, ratio)
    x = np.random.default_rng(seed).standard_normal(2 * 256).astype(np.float32)
    back = rope_tail(rope_tail(x, 2, 256, p, pos), 2, 256, p, pos, inverse=True)
    np.testing.assert_allclose(back, x, atol=1e-5)  # two float32 rotations of unit-size values


def test_position_zero_is_identity():
    x = np.random.default_rng(0).standard_normal(512).astype(np.float32)
    assert np.array_equal(rope_tail(x, 1, 512, DENSE, 0), x)


def test_interleaved_not_neox():
    # pair 0 is (x[n_nope], x[n_nope+1]); pair 0's angle is pos exactly (theta_scale^0 = 1)
    x = np.zeros(128, np.float32)
    x[64] = 1.0
    y = rope_tail(x, 1, 128, DENSE, 1)
    assert math.isclose(y[64], math.cos(1.0), rel_tol=1e-6)
    assert math.isclose(y[65], math.sin(1.0), rel_tol=1e-6)
    assert np.count_nonzero(y) == 2
