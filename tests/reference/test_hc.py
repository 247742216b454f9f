"""Hyper-connections: Sinkhorn split, HC pre weighted sum, HC post, output collapse (docs/model.md §3.1, §3.9, §3.11)."""

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ds4.reference.hc import hc_collapse, hc_post, hc_pre, hc_split, sinkhorn

seeds = st.integers(0, 2**32 - 1)


def _sinkhorn_loops(logits, iters, eps):
    """Upstream's loop structure written out element by element in Python floats (double)."""
    n = len(logits)
    m = [[0.0] * n for _ in range(n)]
    for a in range(n):
        mx = max(logits[a])
        ex = [math.exp(logits[a][b] - mx) for b in range(n)]
        s = sum(ex)
        for b in range(n):
            m[a][b] = ex[b] * (1.0 / s) + eps

    def cols():
        for b in range(n):
            inv = 1.0 / (sum(m[a][b] for a in range(n)) + eps)
            for a in range(n):
                m[a][b] *= inv

    def rows():
        for a in range(n):
            inv = 1.0 / (sum(m[a]) + eps)
            for b in range(n):
                m[a][b] *= inv

    cols()
    for _ in range(1, iters):
        rows()
        cols()
    return np.array(m)


@given(seeds, st.floats(0.1, 4.0))
def test_sinkhorn_matches_loop_structure_and_is_doubly_stochastic(seed, spread):
    rng = np.random.default_rng(seed)
    z = (rng.standard_normal((4, 4)) * spread).astype(np.float32)
    m = sinkhorn(z, 20, 1e-6)
    ref = _sinkhorn_loops(z.astype(np.float64).tolist(), 20, 1e-6)
    np.testing.assert_allclose(m, ref, rtol=2e-5, atol=1e-7)  # float32 vs double, 40 normalisations
    # ends with a column normalisation: columns sum to 1 - eps/sum (float32 rounding on top)
    np.testing.assert_allclose(m.sum(axis=0), 1.0, atol=1e-5)
    # rows converge only as fast as Sinkhorn does: for logits of std <= 1 twenty rounds reach
    # 1e-4 (measured max 5e-5 over 2000 seeds); at std 4 rows can still be 6% off
    if spread <= 1.0:
        np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-4)
    assert np.all(m > 0)


def test_sinkhorn_iteration_count_matters():
    z = np.array([[3.0, 0, 0, -2], [0, 1, 0, 0], [2, 0, -1, 0], [0, 0, 0, 4]], np.float32)
    m20 = sinkhorn(z, 20, 1e-6)
    assert not np.array_equal(m20, sinkhorn(z, 19, 1e-6))
    assert not np.array_equal(m20, sinkhorn(z, 21, 1e-6))
    np.testing.assert_allclose(m20, _sinkhorn_loops(z.astype(np.float64).tolist(), 20, 1e-6), rtol=2e-5)


def test_sinkhorn_single_iteration_is_softmax_then_columns():
    z = np.array([[0.0, 1.0], [2.0, -1.0]], np.float32)
    sm = np.exp(z - z.max(axis=1, keepdims=True))
    sm = sm / sm.sum(axis=1, keepdims=True) + 1e-6
    ref = sm / (sm.sum(axis=0, keepdims=True) + 1e-6)
    np.testing.assert_allclose(sinkhorn(z, 1, 1e-6), ref, rtol=1e-6)


def test_hc_split_gates():
    mix = np.zeros(24, np.float32)
    scale = np.array([1.0, 1.0, 1.0], np.float32)
    base = np.zeros(24, np.float32)
    base[:4] = [0.0, 100.0, -100.0, 1.0]
    base[4:8] = [0.0, 100.0, -100.0, 1.0]
    sp = hc_split(mix, scale, base, 4, 20, 1e-6)
    np.testing.assert_allclose(sp.pre, [0.5 + 1e-6, 1.0 + 1e-6, 1e-6, 1 / (1 + math.exp(-1)) + 1e-6], rtol=1e-6)
    np.testing.assert_allclose(sp.post, [1.0, 2.0, 0.0, 2 / (1 + math.exp(-1))], rtol=1e-6, atol=1e-30)
    # uniform comb logits: every entry 1/4 (to eps)
    np.testing.assert_allclose(sp.comb, 0.25, rtol=1e-5)


def test_hc_split_comb_orientation():
    # comb logits M[a][b] = mix[8+4a+b]: softmax runs over b, so a large logit at (a=0, b=3)
    # makes comb[0, 3] (source 0 -> destination 3) large
    mix = np.zeros(24, np.float32)
    mix[8 + 0 * 4 + 3] = 10.0
    sp = hc_split(mix, np.ones(3, np.float32), np.zeros(24, np.float32), 4, 20, 1e-6)
    assert sp.comb[0, 3] > 0.9 and sp.comb[3, 0] < 0.5


@given(seeds)
def test_hc_post_formula(seed):
    rng = np.random.default_rng(seed)
    out = rng.standard_normal(8).astype(np.float32)
    res = rng.standard_normal((4, 8)).astype(np.float32)
    mix = rng.standard_normal(24).astype(np.float32)
    sp = hc_split(mix, np.ones(3, np.float32), np.zeros(24, np.float32), 4, 20, 1e-6)
    new = hc_post(out, res, sp)
    for b in range(4):
        ref = out.astype(np.float64) * sp.post[b] + sum(float(sp.comb[a, b]) * res[a].astype(np.float64)
                                                        for a in range(4))
        np.testing.assert_allclose(new[b], ref, rtol=1e-5, atol=1e-6)


def test_hc_pre_weighted_sum_and_norm():
    rng = np.random.default_rng(1)
    streams = rng.standard_normal((4, 32)).astype(np.float32)
    fn = rng.standard_normal((24, 128)).astype(np.float32) * 0.1
    scale = np.array([0.5, 0.5, 0.5], np.float32)
    base = rng.standard_normal(24).astype(np.float32)
    x, sp = hc_pre(streams, fn, scale, base, 20, 1e-6, 1e-6)
    flat = streams.reshape(-1).astype(np.float64)
    flat = flat / np.sqrt((flat**2).mean() + 1e-6)
    mix = fn.astype(np.float64) @ flat
    ref = hc_split(mix.astype(np.float32), scale, base, 4, 20, 1e-6)
    np.testing.assert_allclose(sp.pre, ref.pre, rtol=1e-5)
    np.testing.assert_allclose(x, (streams * sp.pre[:, None]).sum(axis=0), rtol=1e-5, atol=1e-6)
    # scale invariance of the RMSNorm: the control values ignore the streams' overall magnitude
    x2, sp2 = hc_pre(streams * 8, fn, scale, base, 20, 1e-6, 1e-6)
    np.testing.assert_allclose(sp2.pre, sp.pre, rtol=1e-5)


def test_hc_collapse_uses_sigmoid_weights_without_sinkhorn():
    streams = np.stack([np.full(8, float(h + 1), np.float32) for h in range(4)])
    fn = np.zeros((4, 32), np.float32)
    base = np.array([0.0, 100.0, -100.0, 0.0], np.float32)
    y = hc_collapse(streams, fn, np.ones(1, np.float32), base, 1e-6, 1e-6)
    w = np.array([0.5, 1.0, 0.0, 0.5]) + 1e-6
    np.testing.assert_allclose(y, np.full(8, (w * [1, 2, 3, 4]).sum()), rtol=1e-6)
