"""The top-p prefix through the bucket partition (docs/sampling.md, "Sixth round").

`min_p 0, top_p < 1` collects a prefix of the sorted order (every finite logit at or above a
floor guessed from the approximate masses) and, when it holds at least 1,024 tokens, hands it to
the bucket partition (csrc/sampling/bucket_topp.*) instead of radix-sorting it. The kept set, the
float32 sum and the walk's picks must be the sorted loops' bit for bit; a prefix that does not
hold the stop must be refused (the sorted path then decides).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ds4.sampling import Rng, probabilities, sample
from test_sampling import (F, _bucket_case, _check_buckets, _core, _plain_sum, _vocab_logits, plain_probabilities,
                           plain_sample)


@given(st.sampled_from(["flat", "ties", "halves", "crossing", "denormal", "nonfinite", "zeros"]),
       st.integers(0, 2**32), st.sampled_from([100, 2000, 20000]), st.sampled_from([1, 7, 64, 4096]),
       st.sampled_from([0.1, 0.5, 0.9, 0.99]), st.sampled_from([0.02, 0.3, 0.7, 1.0]), st.booleans())
def test_prefix_buckets_equal_the_sorted_loops_over_the_prefix(kind, seed, n, buckets, top_p, q, approx):
    # The floor at the q-quantile of the finite logits from the top (1.0: every finite token): a
    # prefix that holds the stop or not, cut inside tie runs or between them.
    g = np.random.default_rng(seed)
    a, w = _bucket_case(kind, g, n)
    fin = np.isfinite(a)
    if not fin.any():
        return
    total = _plain_sum(np.where(fin, w, F(0)))
    vals = np.sort(a[fin])[::-1]
    floor = vals[min(vals.size - 1, int(q * vals.size))]
    rel = 2.0**-20 if approx else 0.0
    wa = w
    if approx:
        wa = (w.astype(np.float64) * (1 + rel * g.choice([-1.0, 1.0, 0.999, g.uniform(-1, 1)], n))).astype(np.float32)
    rs = [F(u) * total for u in g.random(6).astype(np.float32)] + [F(0), total]
    _check_buckets(a, w, total, top_p, rs, buckets, wa=wa, rel=rel, floor=floor)


def test_prefix_without_the_stop_is_refused():
    # Ten tokens of weight 1, total 10, top_p .9: the stop is the ninth token. A prefix of eight
    # must be refused (its whole sum stays below the stop), one of nine or more decides.
    a = np.arange(10, 0, -1).astype(np.float32)
    w = np.ones(10, dtype=np.float32)
    for floor, kept in ((3.0, None), (2.0, 9), (1.0, 9)):
        assert _check_buckets(a, w, F(10), 0.9, [F(0.5), F(8.5), F(10)], 4, floor=floor) == kept


@pytest.mark.parametrize("kind", ["flat", "peaked", "ties", "heavy", "nonfinite", "tinyrange"])
@pytest.mark.parametrize("t, top_p", [(1.0, 0.9), (1.0, 0.95), (1.0, 0.5), (1.5, 0.9), (0.7, 0.99), (0.05, 0.9), (100.0, 0.9)])
def test_sampler_prefix_branch_equals_plain_reference(kind, t, top_p):
    # The sampler at its defaults (min_p 0): picks, RNG states and probabilities() bits against
    # the plain reference, whichever branch decides.
    logits = _vocab_logits(23, 129_280, kind)
    for draw in range(3):
        a, b = Rng(draw), Rng(draw)
        assert sample(logits, t, 0, top_p, 0.0, a) == plain_sample(logits, t, 0, top_p, 0.0, b)
        assert a.state == b.state
    got, want = probabilities(logits, t, 0, top_p, 0.0), plain_probabilities(logits, t, 0, top_p, 0.0)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampler_prefix_branch_decides_the_bench_row(seed):
    # Flat N(0, 3) logits at T 1, top_p .9 (the bench's row, a prefix of ~5,000-7,000 tokens):
    # the prefix branch decides every call, and picks as the plain reference does.
    g = np.random.default_rng(seed)
    logits = g.normal(0, 3, 129_280).astype(np.float32)
    before = _core()._bucket_top_p_prefix_selections()
    for draw in range(4):
        a, b = Rng(draw), Rng(draw)
        assert sample(logits, 1.0, 0, 0.9, 0.0, a) == plain_sample(logits, 1.0, 0, 0.9, 0.0, b)
        assert a.state == b.state
    got, want = probabilities(logits, 1.0, 0, 0.9, 0.0), plain_probabilities(logits, 1.0, 0, 0.9, 0.0)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert _core()._bucket_top_p_prefix_selections() == before + 5


@pytest.mark.parametrize("head, head_logit, tail_logit, top_p", [(10, 0.0, -12.0, 0.95), (1100, -9.6, -9.8, 0.9)])
def test_sampler_prefix_without_the_stop_falls_back(head, head_logit, tail_logit, top_p):
    # One token at logit 0, `head` at head_logit and the rest of 129,280 at tail_logit, just below
    # the floor fl(max - d) of the prefix collected after the max pass (d = 9.69 at T 1, top_p .9;
    # 10.74 at .95), while the top-p stop lies in the tail: the short prefix (11 tokens: sorted) and
    # the long one (1,101: bucketed) must both be refused, and the sampler must still keep the tail
    # tokens the plain loop keeps.
    n = 129_280
    logits = np.full(n, tail_logit, dtype=np.float32)
    pick = np.random.default_rng(head).choice(n, head + 1, replace=False)
    logits[pick[:-1]] = head_logit
    logits[pick[-1]] = 0.0
    before = _core()._bucket_top_p_prefix_selections()
    got, want = probabilities(logits, 1.0, 0, top_p, 0.0), plain_probabilities(logits, 1.0, 0, top_p, 0.0)
    assert _core()._bucket_top_p_prefix_selections() == before   # refused
    assert np.count_nonzero(want) > head + 1   # the stop is in the tail
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    for draw in range(3):
        a, b = Rng(draw), Rng(draw)
        assert sample(logits, 1.0, 0, top_p, 0.0, a) == plain_sample(logits, 1.0, 0, top_p, 0.0, b)
        assert a.state == b.state


class _EarlyMax:
    """The early top-p prefix collected up to this sampled size (0: never, inf: always)."""

    def __init__(self, v):
        self.v = v

    def __enter__(self):
        self.old = _core()._bucket_top_p_early_max()
        _core()._set_bucket_top_p_early_max(self.v)

    def __exit__(self, *exc):
        _core()._set_bucket_top_p_early_max(self.old)


def _assert_plain(logits, t, top_p, draws=3):
    for draw in range(draws):
        a, b = Rng(draw), Rng(draw)
        assert sample(logits, t, 0, top_p, 0.0, a) == plain_sample(logits, t, 0, top_p, 0.0, b)
        assert a.state == b.state
    got, want = probabilities(logits, t, 0, top_p, 0.0), plain_probabilities(logits, t, 0, top_p, 0.0)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("early", [0.0, 50_000.0, float("inf")])
@pytest.mark.parametrize("sigma, t, top_p", [(1.5, 1.0, 0.9), (1.5, 1.0, 0.5), (1.5, 1.0, 0.2), (1.5, 0.7, 0.5),
                                             (1.0, 1.0, 0.95), (3.0, 1.0, 0.99), (3.0, 1.0, 0.999), (2.0, 1.5, 0.9)])
def test_sampler_narrow_logits_every_route_equals_plain_reference(early, sigma, t, top_p):
    # N(0, sigma) logits (sigma 1.5: the bundled small model's) whose top-p prefix guessed after
    # the max pass is most of the vocabulary while few tokens are kept (docs/sampling.md, "Ninth
    # round"): collected early and partitioned, refused as too light, or left to the mass
    # threshold's tighter floor and the whole-vocabulary partition, the sampler picks as the plain
    # reference does. (top_p .99 and .999 at sigma 3 take the mass threshold's capped margin.)
    logits = np.random.default_rng(int(sigma * 10 + top_p * 1000)).normal(0, sigma, 129_280).astype(np.float32)
    with _EarlyMax(early):
        _assert_plain(logits, t, top_p)


@pytest.mark.parametrize("kind", ["ties", "nonfinite", "tinyrange", "sparse"])
def test_sampler_packed_prefix_on_awkward_logits(kind):
    # The packed prefix (an id and a grid level in one word, the level the partition's bucket
    # index) on logits with long tie runs, non-finite entries, a range of a few ulps, and few
    # finite values: the prefix is collected and partitioned whatever its size (a range of a few ulps
    # lies wholly above the floor, so the whole-vocabulary branch takes it instead).
    logits = _vocab_logits(5, 129_280, kind)
    old = _core()._bucket_top_p_prefix_min()
    _core()._set_bucket_top_p_prefix_min(0.0)
    before = _core()._bucket_top_p_prefix_selections()
    try:
        with _EarlyMax(float("inf")):
            for t, top_p in ((1.0, 0.9), (1.0, 0.5), (0.7, 0.95)):
                _assert_plain(logits, t, top_p, draws=2)
        if kind != "tinyrange":   # there every finite logit lies above the floor: the whole-vocabulary
            assert _core()._bucket_top_p_prefix_selections() > before   # branch decides, nothing is collected
    finally:
        _core()._set_bucket_top_p_prefix_min(old)


@pytest.mark.parametrize("n", [20_000, 70_000])
def test_sampler_packed_prefix_at_other_id_widths(n):
    # Vocabularies whose ids need 15 and 17 bits: the level takes the other 16 and 15 bits of the
    # word (collect_prefix); the ids must come back whole.
    logits = np.random.default_rng(n).normal(0, 3, n).astype(np.float32)
    old = _core()._bucket_top_p_prefix_min()
    _core()._set_bucket_top_p_prefix_min(0.0)
    before = _core()._bucket_top_p_prefix_selections()
    try:
        with _EarlyMax(float("inf")):
            for top_p in (0.9, 0.5):
                _assert_plain(logits, 1.0, top_p, draws=2)
        assert _core()._bucket_top_p_prefix_selections() > before   # the packed prefix was partitioned
    finally:
        _core()._set_bucket_top_p_prefix_min(old)


def test_packed_prefix_leaves_out_infinite_logits():
    # +inf logits are never candidates; were the prefix collection to take one (it passes
    # `>= floor`), it would sit first in the top bucket with weight 0, where only a draw of exactly
    # 0 can see it: that draw must stop at the largest finite logit, as the plain loop does.
    from test_sampling import _seed_with_first_uniform_zero

    seed = _seed_with_first_uniform_zero()
    g = np.random.default_rng(9)
    logits = g.normal(0, 3, 129_280).astype(np.float32)
    logits[g.choice(129_280, 3, replace=False)] = np.inf
    with _EarlyMax(float("inf")):
        for top_p in (0.9, 0.95):
            a, b = Rng(seed), Rng(seed)
            got = sample(logits, 1.0, 0, top_p, 0.0, a)
            assert got == plain_sample(logits, 1.0, 0, top_p, 0.0, b) == int(np.argmax(np.where(np.isfinite(logits), logits, -np.inf)))
            assert a.state == b.state
            _assert_plain(logits, 1.0, top_p, draws=1)
