"""Indexer scores, top-k mask and compressor pooling on the emulator against ds4.reference."""

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ds4.metal_emu import ops
from ds4.reference import compressor as ref_comp, indexer as ref_idx
from ds4.reference.numerics import NEG, dot_f32
from metal_bounds import indexer_scores_bound

U = 2.0**-24
FAST = settings(max_examples=12, deadline=None)


def _scores_ref(q, w, rows, n_head, head_dim):
    hw = (w * (np.float32(1.0) / np.sqrt(np.float32(head_dim * n_head)))).astype(np.float32)
    dots = np.maximum(dot_f32(rows, q.reshape(n_head, head_dim).T), np.float32(0.0))
    score = np.zeros(rows.shape[0], np.float32)
    for h in range(n_head):
        score = (score + dots[:, h] * hw[h]).astype(np.float32)
    return score, hw, dots


@FAST
@given(data=st.data())
def test_indexer_scores(emu, data):
    n_head, head_dim = data.draw(st.integers(1, 4)), data.draw(st.sampled_from([32, 128]))
    n_rows = data.draw(st.integers(1, 40))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    q = rng.standard_normal((n_head, head_dim)).astype(np.float32)
    w = rng.standard_normal(n_head).astype(np.float32)
    rows = rng.standard_normal((n_rows, head_dim)).astype(np.float32)
    got = ops.indexer_scores(ops.checked(emu), q, w, rows, n_head, head_dim, data.draw(st.sampled_from([1, 2, 4])))
    want, hw, dots = _scores_ref(q, w, rows, n_head, head_dim)
    bound = indexer_scores_bound(q, rows, hw, dots, n_head, head_dim)
    assert (np.abs(got - want) <= bound).all()
    # A row scored against the wrong query head (one head's q replaced) is outside the bound.
    q2 = q.copy()
    q2[0] = rng.standard_normal(head_dim)
    wrong, _, _ = _scores_ref(q2, w, rows, n_head, head_dim)
    moved = np.abs(wrong - want) > 4 * bound
    assert not moved.any() or (np.abs(got - wrong)[moved] > bound[moved]).all()


@FAST
@given(n_head=st.integers(1, 70), seed=st.integers(0, 2**32 - 1))
def test_indexer_weights_scale_is_exact(emu, n_head, seed):
    """w * (1/sqrt(head_dim * n_head)) in float32, bit for bit (the CPU's in-place scaling)."""
    w = np.random.default_rng(seed).standard_normal(n_head).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(np.float32(128 * n_head))
    got = ops.indexer_weights_scale(ops.checked(emu), w, float(scale))
    assert np.array_equal(got.view(np.uint32), (w * scale).astype(np.float32).view(np.uint32))


def _cpu_top_k(scores, k):
    """The CPU's rule (csrc/layers/indexer.cpp select_top_k): NaN and the sentinel never qualify."""
    n = scores.size
    cand = [c for c in range(n) if scores[c] > NEG]
    cand.sort(key=lambda c: (-scores[c], c))
    mask = np.zeros(n, np.uint8)
    mask[cand[:k]] = 1
    if len(cand) < k and n:
        mask[0] = 1
    return mask


@FAST
@given(data=st.data())
def test_top_k_mask_is_exact(emu, data):
    n = data.draw(st.integers(1, 300))
    k = data.draw(st.integers(1, 40))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    scores = rng.integers(-5, 5, size=n).astype(np.float32)            # many ties
    if data.draw(st.booleans()):
        scores[rng.random(n) < 0.3] = NEG                                 # sentinel rows
    got = ops.top_k_mask(ops.checked(emu), scores, k)
    assert np.array_equal(got, _cpu_top_k(scores, k))
    if not (scores <= NEG).any():                                        # upstream's loop agrees when all qualify
        assert np.array_equal(got.astype(bool), ref_idx.topk_strict(scores, min(k, n)))
    with_nan = scores.copy()
    with_nan[::7] = np.nan
    assert np.array_equal(ops.top_k_mask(ops.checked(emu), with_nan, k), _cpu_top_k(with_nan, k))


SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, NEG, 1.0, -1.0, 2.0**-149, -(2.0**-149), 3.0e38],
                   np.float32)


@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 3000), k=st.integers(0, 600), seed=st.integers(0, 2**32 - 1))
def test_top_k_mask_special_values_and_long_rows(emu, n, k, seed):
    """Rows longer than the threadgroup (several per thread), every key edge: -0 ties +0, +-inf,
    denormals, NaN and the sentinel never qualify; the mask equals the CPU's insertion order."""
    rng = np.random.default_rng(seed)
    scores = SPECIAL[rng.integers(0, SPECIAL.size, n)]
    plain = rng.random(n) < 0.5                      # half distinct values, half heavy ties
    scores[plain] = rng.standard_normal(int(plain.sum())).astype(np.float32)
    got = ops.top_k_mask(ops.checked(emu), scores, k)
    assert np.array_equal(got, _cpu_top_k(scores, k))


@pytest.mark.parametrize("ratio", [4, 128])
@FAST
@given(data=st.data())
def test_compressor_pool_state(emu, ratio, data):
    """A convex combination of the frontier's values: each softmax weight carries a few roundings
    (exp ulps on a GPU), the two running sums ratio roundings each: <= (2*ratio + 16)*u*max|kv|."""
    head_dim = data.draw(st.sampled_from([32, 64]))
    coff = 2 if ratio == 4 else 1
    rows = 2 * ratio if ratio == 4 else ratio
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    kv = rng.standard_normal((rows, coff * head_dim)).astype(np.float32)
    score = (rng.standard_normal((rows, coff * head_dim)) * 4).astype(np.float32)
    if data.draw(st.booleans()):
        score[:, : head_dim // 4] = NEG                                  # dims never written: pooled to 0
    got = ops.compressor_pool_state(ops.checked(emu), kv, score, head_dim, ratio)
    want = ref_comp.compressor_pool(SimpleNamespace(ratio=ratio, head_dim=head_dim, kv=kv, score=score))
    assert (np.abs(got - want) <= (2 * ratio + 16) * U * np.abs(kv).max()).all()
