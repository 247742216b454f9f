"""Whole-vocabulary top-p buckets certified from their logit bounds (docs/sampling.md, "Eighth round").

Over the whole vocabulary the bucket partition (csrc/sampling/bucket_topp.*) no longer scatters
every id: a bucket whose weights all round to the same n units at the running value's unit is
added (or walked) as count * n units from bounds on its weights that follow from its logit
interval alone, and only the buckets that fail (the first tokens of the sum, binade crossings,
half-unit straddlers, the stop's and the pick's buckets) have their ids collected, in one pass over
the bucket indices for the buckets a prediction expects to fail. The kept set, the float32 sum and
the walk's picks must be the sorted loops' bit for bit, whatever the prediction collects.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ds4.sampling import Rng, probabilities, sample
from test_sampling import (F, _BucketsAlways, _core, _partition_matches_sorted, _plain_sum, _vocab_logits,
                           plain_probabilities, plain_sample)


def _weights(a, t):
    """The sampler's exact weights exp_weights(fl(fl(a - max) / t)) (0 where a is not finite)."""
    a = np.asarray(a, dtype=np.float32)
    fin = np.isfinite(a)
    hi = F(a[fin].max())
    x = np.asarray(_core()._shifted_args(a, hi, F(t))[0], dtype=np.float32)
    w = _core()._exp_weights(np.ascontiguousarray(x))
    return np.where(fin, w, F(0)).astype(np.float32)


class _Plan:
    """The collection plan for a block: 0 predicts the buckets that need ids, 1 collects only the
    bucket that asks (so every other one takes a pass of its own)."""

    def __init__(self, v):
        self.v = v

    def __enter__(self):
        self.old = _core()._bucket_top_p_plan()
        _core()._set_bucket_top_p_plan(self.v)

    def __exit__(self, *exc):
        _core()._set_bucket_top_p_plan(self.old)


def _check_bounded(a, t, top_p, rs, buckets, approx=False, g=None):
    """The partition with weights from the formula (bounds certify buckets) against the sorted loops."""
    a = np.asarray(a, dtype=np.float32)
    w = _weights(a, t)
    total = _plain_sum(w)
    rel = 2.0**-20 if approx else 0.0
    wa = w
    if approx:
        wa = (w.astype(np.float64) * (1 + rel * g.choice([-1.0, 1.0, 0.999], a.size))).astype(np.float32)
    got = _core()._bucket_top_p(a, w, wa, rel, F(total), F(top_p), buckets, np.asarray(rs, dtype=np.float32), t=F(t))
    return _partition_matches_sorted(got, a, w, total, top_p, rs)


def _logits(kind, g, n):
    if kind == "ties":   # quarter steps: long runs of equal logits, equal weights (half-unit ties)
        return (np.round(g.normal(0, 3, n) * 4) / 4).astype(np.float32)
    if kind == "zeros":   # signed zeros among tiny logits: one key, weights 1
        a = (g.normal(0, 1, n) * 1e-39).astype(np.float32)
        a[g.random(n) < 0.3] = -0.0
        a[g.random(n) < 0.3] = 0.0
        return a
    if kind == "nonfinite":
        a = g.normal(0, 3, n).astype(np.float32)
        u = g.random(n)
        a[u < 0.05] = -np.inf
        a[(u >= 0.05) & (u < 0.08)] = np.nan
        return a
    if kind == "wide":   # one far outlier: every other token in the first bucket
        a = g.normal(0, 3, n).astype(np.float32)
        a[g.integers(0, n)] = F(-1e30)
        return a
    if kind == "peaked":
        a = g.normal(0, 2, n).astype(np.float32)
        a[g.integers(0, n, 5)] += F(12)
        return a
    return g.normal(0, 3, n).astype(np.float32)   # flat


@settings(deadline=None)
@given(st.sampled_from(["flat", "ties", "zeros", "nonfinite", "wide", "peaked"]), st.integers(0, 2**32),
       st.sampled_from([3, 100, 2000, 20000]), st.sampled_from([1, 7, 64, 4096]),
       st.sampled_from([100.0, 30.0, 7.0, 3.0, 1.0, 0.25]), st.sampled_from([0.1, 0.5, 0.9, 0.99]), st.booleans(),
       st.sampled_from([0, 1]))
def test_bounded_buckets_equal_the_sorted_loops(kind, seed, n, buckets, t, top_p, approx, plan):
    g = np.random.default_rng(seed)
    a = _logits(kind, g, n)
    if not np.isfinite(a).any():
        return
    w = _weights(a, t)
    total = _plain_sum(w)
    rs = [F(u) * total for u in g.random(6).astype(np.float32)] + [F(0), total]
    with _Plan(plan):
        _check_bounded(a, t, top_p, rs, buckets, approx, g)


@pytest.mark.parametrize("t, top_p", [(100.0, 0.9), (100.0, 0.5), (30.0, 0.99), (7.0, 0.9), (3.0, 0.95), (1.5, 0.9)])
@pytest.mark.parametrize("kind", ["flat", "ties"])
def test_bounded_buckets_on_the_whole_vocabulary(kind, t, top_p):
    # 129,280 logits at 4,096 buckets (the sampler's setting), many draws: binade crossings, half-unit
    # straddlers and ties at every unit the sum and the walk pass through.
    g = np.random.default_rng(7)
    a = _logits(kind, g, 129_280)
    w = _weights(a, t)
    total = _plain_sum(w)
    rs = [F(u) * total for u in g.random(40).astype(np.float32)]
    for plan in (0, 1):
        with _Plan(plan):
            assert _check_bounded(a, t, top_p, rs, 4096) is not None


def test_a_bucket_of_equal_weights_on_a_half_unit_is_refused():
    # 19 logits 0 and one -2^-19 (weights 1 and 1 - 2^-19: the sum reaches 20 - 2^-19, an odd count
    # of units 2^-19), then 8 logits -3 * 2^-20 whose weight 1 - 3 * 2^-20 is 2^19 - 3/2 units: a
    # tie, which the sorted loop rounds to even, so each addition depends on the running count's
    # parity (it adds 8 * 2^19 - 15 units; a count of round-half-up units would add 8 * 2^19 - 8),
    # then 50 logits -1e-4. The range is 1e-4, so a bucket is 2.4e-8 wide and its bounds' weights
    # may be that one float: only the one-ulp widening and the strict test keep the certificate
    # from taking the run as a unit count.
    x = F(-3 * 2.0**-20)
    a = np.concatenate([np.zeros(19, dtype=np.float32), [F(-(2.0**-19))], np.full(8, x),
                        np.full(50, F(-1e-4))]).astype(np.float32)
    a = a[np.random.default_rng(1).permutation(a.size)]
    w = _weights(a, 1.0)
    wr = F(1 - 3 * 2.0**-20)
    assert np.count_nonzero(w == wr) == 8 and np.count_nonzero(w == F(1 - 2.0**-19)) == 1
    head = _plain_sum(np.concatenate([np.ones(19, dtype=np.float32), [F(1 - 2.0**-19)]]))
    run = _plain_sum(np.concatenate([np.ones(19, dtype=np.float32), [F(1 - 2.0**-19)], np.full(8, wr)]))
    assert int(head * 2**19) % 2 == 1 and int(run * 2**19) == int(head * 2**19) + 8 * 2**19 - 15
    total = _plain_sum(w)
    for top_p in (0.4, 0.9, 0.99):
        rs = [F(u) * total for u in (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.99)]
        for plan in (0, 1):
            with _Plan(plan):
                assert _check_bounded(a, 1.0, top_p, rs, 4096) is not None


@pytest.mark.parametrize("plan", [0, 1])
@pytest.mark.parametrize("kind", ["flat", "peaked", "ties", "nonfinite", "heavy"])
@pytest.mark.parametrize("t, top_p", [(100.0, 0.9), (100.0, 0.5), (7.0, 0.9), (3.0, 0.99), (1.5, 0.95)])
def test_sampler_whole_vocabulary_buckets_equal_the_plain_reference(kind, t, top_p, plan):
    # The sampler's branch (forced) with either plan: picks, RNG states, probabilities() bits.
    logits = _vocab_logits(23, 129_280, kind)
    with _BucketsAlways(), _Plan(plan):
        before = _core()._bucket_top_p_selections()
        for draw in range(3):
            a, b = Rng(100 + draw), Rng(100 + draw)
            assert sample(logits, t, 0, top_p, 0.0, a) == plain_sample(logits, t, 0, top_p, 0.0, b)
            assert a.state == b.state
        got = probabilities(logits, t, 0, top_p, 0.0)
        assert _core()._bucket_top_p_selections() == before + 4
    want = plain_probabilities(logits, t, 0, top_p, 0.0)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("kind", ["flat", "peaked"])
def test_high_temperature_draw_collects_at_most_twice(kind):
    # The point of the bounds: at T 100 a draw collects ids in one pass for the sum and one for the
    # walk (the prediction finds every bucket that needs them), not one per bucket.
    logits = _vocab_logits(3, 129_280, kind)
    rng = Rng(5)
    for _ in range(8):
        before = _core()._bucket_top_p_collections()
        sample(logits, 100.0, 0, 0.9, 0.0, rng)
        assert _core()._bucket_top_p_collections() - before <= 2
