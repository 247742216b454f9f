"""Each check of the backend-ops suite fails on a perturbation of the size it must catch, and
passes on the float noise it must tolerate (the reasons are in _ops.py)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from _ops import NMSE_FLOAT, NMSE_REQUANT, REFERENCE, assert_exact, assert_matches, assert_nmse, floats, weight


def _attention_output():
    rng = np.random.default_rng(5)
    n_head, D = 4, 64
    return REFERENCE.attention(floats(rng, n_head * D), floats(rng, 40, D), 40, 7, floats(rng, 30, D), None,
                               floats(rng, n_head), n_head, D)


def test_exact_check_catches_one_ulp():
    x = _attention_output()
    y = x.copy()
    y.reshape(-1)[17] = np.nextafter(y.reshape(-1)[17], np.float32(np.inf))
    assert_exact(x, x.copy())
    with pytest.raises(AssertionError):
        assert_exact(y, x)
    with pytest.raises(AssertionError):   # an exact op on a CPU path is held to bits, not NMSE
        assert_matches("rms_norm", "cpu-avx2", y, x)


def test_nmse_float_passes_reassociation_noise_and_catches_one_wrong_value():
    x = _attention_output().astype(np.float64)
    rng = np.random.default_rng(0)
    noise = x * (1 + rng.uniform(-1, 1, x.shape) * 16 * 2.0**-24)   # 16 ulps on every value
    assert_nmse(noise.astype(np.float32), x, NMSE_FLOAT)
    bad = x.copy()
    bad.reshape(-1)[100] *= 1.01                                    # one value off by 1 % in 256
    with pytest.raises(AssertionError):
        assert_nmse(bad, x, NMSE_FLOAT)


def _routed(sel, wts):
    rng = np.random.default_rng(3)
    E, F, NE = 256, 256, 6
    gate, up = weight(Q.IQ2_XXS, E, F * NE, 1), weight(Q.IQ2_XXS, E, F * NE, 2)
    down = weight(Q.Q2_K, F, E * NE, 3)
    x = floats(rng, 1, E)
    return REFERENCE.routed_experts(gate, int(Q.IQ2_XXS), up, down, int(Q.Q2_K), E, F, NE, x,
                                    np.array([sel], np.int32), np.array([wts], np.float32), 10.0)


def test_nmse_requant_catches_a_wrong_expert_and_a_wrong_weight():
    good = _routed([0, 3, 5, 1], [0.4, 0.3, 0.2, 0.1])
    assert_nmse(good, good.copy(), NMSE_REQUANT)
    with pytest.raises(AssertionError):            # one slot routed to the wrong expert
        assert_nmse(_routed([0, 3, 4, 1], [0.4, 0.3, 0.2, 0.1]), good, NMSE_REQUANT)
    with pytest.raises(AssertionError):            # the largest slot's weight 2 % off
        assert_nmse(_routed([0, 3, 5, 1], [0.408, 0.3, 0.2, 0.1]), good, NMSE_REQUANT)


def test_metal_exact_ops_and_integer_outputs_are_held_to_bits():
    x = _attention_output()
    y = x.copy()
    y.reshape(-1)[3] = np.nextafter(y.reshape(-1)[3], np.float32(np.inf))
    with pytest.raises(AssertionError):      # bit-identical by construction on Metal: one ulp fails
        assert_matches("hc_post", "metal-emu", y, x)
    assert_matches("attention", "metal-emu", y, x)   # a float-order op: one ulp is noise
    sel = np.array([[3, 1], [0, 2]], np.int32)
    with pytest.raises(AssertionError):      # one expert swapped in a selection
        assert_matches("router", "metal-emu", np.array([[3, 1], [2, 0]], np.int32), sel)
