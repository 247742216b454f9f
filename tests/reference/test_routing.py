"""Selections and gates: indexer top-k, expert top-k, hash routing, expert weights, SwiGLU (docs/model.md §3.6, §3.10)."""

import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from ds4.errors import ModelFormatError
from ds4.reference.indexer import topk_strict
from ds4.reference.moe import FfnWeights, expert_weights, select_experts, swiglu, topk_desc
from ds4.reference.numerics import NEG, softplus
from ds4.reference.weights import Tensor

small_ints = arrays(np.float32, st.integers(1, 40), elements=st.integers(-3, 3).map(float))


def test_topk_strict_ties_to_lowest_index():
    s = np.array([1.0, 5.0, 3.0, 5.0, 3.0, 0.0], np.float32)
    assert np.flatnonzero(topk_strict(s, 1)).tolist() == [1]
    assert np.flatnonzero(topk_strict(s, 2)).tolist() == [1, 3]
    assert np.flatnonzero(topk_strict(s, 3)).tolist() == [1, 2, 3]


@given(small_ints, st.integers(1, 10))
def test_topk_strict_equals_stable_descending_sort(s, k):
    k = min(k, s.size)
    expect = np.sort(np.argsort(-s.astype(np.float64), kind="stable")[:k])
    got = topk_strict(s, k)
    assert got.sum() == k and np.flatnonzero(got).tolist() == expect.tolist()


def test_topk_strict_upstream_corner_rescans_row_zero():
    # no remaining score above NEG: upstream's scan keeps best = 0
    s = np.array([2.0, NEG, NEG], np.float32)
    assert np.flatnonzero(topk_strict(s, 2)).tolist() == [0]


def test_topk_desc_order_and_ties():
    s = np.array([0.5, 0.9, 0.9, 0.1, 0.95], np.float32)
    assert topk_desc(s, 3) == [4, 1, 2]
    assert topk_desc(s, 1) == [4]
    assert topk_desc(np.zeros(5, np.float32), 2) == [0, 1]


@given(small_ints, st.integers(1, 8))
def test_topk_desc_is_a_stable_sort(s, k):
    k = min(k, s.size)
    assert topk_desc(s, k) == np.argsort(-s.astype(np.float64), kind="stable")[:k].tolist()


def _tensor(name, values, qtype=GGMLQuantizationType.F32):
    v = np.ascontiguousarray(values)
    return Tensor(name, qtype, tuple(reversed(v.shape)), v)


def _ffn(bias=None, table=None):
    z = _tensor("z", np.zeros((1, 1), np.float32))
    return FfnWeights(z, z, z, z, z, z, z, z,
                      None if bias is None else _tensor("blk.3.exp_probs_b.bias", np.asarray(bias, np.float32)),
                      None if table is None else _tensor("blk.0.ffn_gate_tid2eid.weight",
                                                         np.asarray(table, np.int32), GGMLQuantizationType.I32))


def test_bias_selects_but_does_not_weight():
    probs = np.array([0.9, 0.8, 0.1, 0.2], np.float32)
    w = _ffn(bias=[0.0, 0.0, 1.0, 0.0])
    sel = select_experts(w, probs, token=0, k=2)
    assert sel == [2, 0]  # 1.1 then 0.9
    wts = expert_weights(probs, sel, 1.5)
    np.testing.assert_allclose(wts, [0.1 / 1.0 * 1.5, 0.9 / 1.0 * 1.5], rtol=1e-6)
    assert select_experts(_ffn(), probs, token=0, k=2) == [0, 1]  # no bias tensor: plain top-k


def test_hash_routing_uses_the_token_row_in_order():
    table = [[3, 1], [0, 2], [2, 3]]
    w = _ffn(bias=[5.0, 5.0, 5.0, 5.0], table=table)
    probs = np.array([0.4, 0.3, 0.2, 0.1], np.float32)
    assert select_experts(w, probs, token=1, k=2) == [0, 2]
    assert select_experts(w, probs, token=0, k=2) == [3, 1]
    with pytest.raises(ModelFormatError):
        select_experts(w, probs, token=3, k=2)
    with pytest.raises(ModelFormatError):
        select_experts(_ffn(table=[[0, 9]]), probs, token=0, k=2)


def test_expert_weight_sum_floor():
    probs = np.array([1e-6, 2e-6, 0.5], np.float32)
    wts = expert_weights(probs, [0, 1], 1.5)
    floor = 2.0**-14  # the sum 3e-6 is raised to 2^-14
    np.testing.assert_allclose(wts, [1e-6 / floor * 1.5, 2e-6 / floor * 1.5], rtol=1e-6)


def test_swiglu_clamps_gate_above_only_and_up_both_sides():
    g = np.array([20.0, -20.0, 1.0, 1.0], np.float32)
    u = np.array([1.0, 1.0, 20.0, -20.0], np.float32)
    out = swiglu(g, u, 10.0)
    silu = lambda x: x / (1 + math.exp(-x))  # noqa: E731
    np.testing.assert_allclose(out, [silu(10.0), silu(-20.0), silu(1.0) * 10, silu(1.0) * -10], rtol=1e-6)
    np.testing.assert_allclose(swiglu(g, u, 0.0), [silu(20.0), silu(-20.0), silu(1.0) * 20, -silu(1.0) * 20],
                               rtol=1e-6)


def test_softplus_branches():
    x = np.array([-30.0, -1.0, 0.0, 3.0, 25.0], np.float32)
    np.testing.assert_allclose(softplus(x), [math.exp(-30), math.log1p(math.exp(-1)), math.log(2),
                                             math.log1p(math.exp(3)), 25.0], rtol=1e-6)
