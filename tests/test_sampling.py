"""Sampling tests: RNG against values printed by a C program, choices against a scalar reference
written from RUNTIME.md §3 (loops over float32 scalars), filters' support and seeded chi-square
frequency tests."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ds4.errors import InvalidArgumentError
from ds4.sampling import (
    Rng,
    SamplingParams,
    argmax,
    argmax_excluding,
    log_softmax,
    sample,
    token_logprob,
    top_logprobs,
)

F = np.float32

# ---- RNG ---------------------------------------------------------------------------------------

# Printed by a 10-line C program implementing §3.4 with uint64_t arithmetic (gcc -O2).
C_RNG = {
    0: ([973819730272012410, 6108091081255984487, 12125365036566318712, 9038174178950858617],
        [0.0527908206, 0.331120253, 0.65731734, 0.489960372], 12912965123806966029),
    1: ([5180492295206395165, 12380297144915551517, 13389498078930870103, 5599127315341312413],
        [0.280835032, 0.671137214, 0.725846112, 0.303529263], 2306758490171379329),
    12345: ([10977518812293740004, 13893246733018840292, 1412386850724336324, 13578198927181985541],
            [0.595092475, 0.753154397, 0.0765656233, 0.73607558], 7812230513901692169),
}


@pytest.mark.parametrize("seed", sorted(C_RNG))
def test_rng_matches_c(seed):
    outs, floats, final_state = C_RNG[seed]
    r = Rng(seed)
    assert [r.next_u64() for _ in range(4)] == outs
    assert r.state == final_state
    r = Rng(seed)
    got = [r.uniform() for _ in range(4)]
    assert all(isinstance(u, np.float32) for u in got)
    # C printed %.9g of the float: 9 significant digits identify a float32 exactly.
    assert [F(u) for u in got] == [F(x) for x in floats]


# ---- scalar reference (RUNTIME.md §3.1-3.3, one token at a time) --------------------------------


def _seq_sum(xs):
    s = F(0)
    for x in xs:
        s = F(s + x)
    return s


def ref_sample(logits, temperature, top_k, top_p, min_p, rng):
    """Literal loops of §3 over float32 scalars; expf modelled as a correctly rounded exp."""
    total = _seq_sum
    lg = [F(x) for x in logits]
    t, top_p, min_p = F(temperature), F(top_p), F(min_p)

    def amax():
        best, bv = 0, F(-1e30)
        for i, v in enumerate(lg):
            if v > bv:
                best, bv = i, v
        return best

    if not t > 0:
        return amax()
    if top_p <= 0 or top_p > 1:
        top_p = F(1)
    if min_p < 0:
        min_p = F(0)
    fin = [(i, v) for i, v in enumerate(lg) if math.isfinite(v)]
    if not fin:
        return amax()
    if top_k <= 0:
        best, m = fin[0]
        for i, v in fin:
            if v > m:
                best, m = i, v
        if top_p >= 1:
            kept = [(i, F(math.exp(F(F(v - m) / t)))) for i, v in fin]
            kept = [(i, p) for i, p in kept if not p < min_p]
            s = total([p for _, p in kept])
            if not (s > 0 and math.isfinite(s)):
                return best
            r = F(rng.uniform() * s)
            for i, p in kept:
                r = F(r - p)
                if r <= 0:
                    return i
            return best
        cand = [(i, v, F(math.exp(F(F(v - m) / t)))) for i, v in fin]
        s = total([p for _, _, p in cand])
        if not (s > 0 and math.isfinite(s)):
            return best
        cand.sort(key=lambda c: -c[1])  # stable: equal logits keep vocabulary order
        fallback = best
    else:
        k = min(top_k, 1024, len(lg))
        sel = []
        for i, v in fin:  # insertion into a descending array, strict > moves ahead
            if len(sel) == k and not v > sel[-1][1]:
                continue
            j = len(sel) if len(sel) < k else k - 1
            if len(sel) < k:
                sel.append(None)
            while j > 0 and sel[j - 1][1] < v:
                sel[j] = sel[j - 1]
                j -= 1
            sel[j] = (i, v)
        m = sel[0][1]
        cand = [(i, v, F(math.exp(F(F(v - m) / t)))) for i, v in sel]
        s = total([p for _, _, p in cand])
        if not (s > 0 and math.isfinite(s)):
            return sel[0][0]
        fallback = sel[0][0]
    min_prob = F(F(cand[0][2] / s) * min_p)
    fsum, n = F(0), 0
    for idx, (_, _, p) in enumerate(cand):
        if idx > 0 and F(p / s) < min_prob:
            break
        fsum = F(fsum + p)
        n += 1
        if F(fsum / s) >= top_p:
            break
    if n == 0:
        return fallback
    kept = cand[:n]
    r = F(rng.uniform() * total([p for _, _, p in kept]))
    for i, _, p in kept:
        r = F(r - p)
        if r <= 0:
            return i
    return kept[-1][0]


_logit = st.one_of(
    st.sampled_from([0.0, 1.0, -1.0, 2.5, 2.5, -30.0]),  # repeated values create ties
    st.floats(-20, 20, width=32),
    st.sampled_from([float("-inf"), float("nan"), float("inf")]),
)
_params = st.tuples(
    st.sampled_from([0.0, -1.0, 0.3, 0.7, 1.0, 1.5, 4.0]),  # temperature
    st.sampled_from([0, -3, 1, 2, 3, 5, 2000]),  # top_k
    st.sampled_from([1.0, 0.0, 1.7, 0.5, 0.9, 0.95, 0.2]),  # top_p
    st.sampled_from([0.05, 0.0, -0.5, 0.1, 0.5, 1.0, 2.0]),  # min_p
)


@given(st.lists(_logit, min_size=1, max_size=7), _params, st.integers(0, 2**64 - 1))
def test_sample_equals_scalar_reference_small_vocab(logits, params, seed):
    t, k, p, mp = params
    a, b = Rng(seed), Rng(seed)
    got = sample(np.array(logits, dtype=np.float32), t, k, p, mp, a)
    assert got == ref_sample(logits, t, k, p, mp, b)
    assert a.state == b.state  # same number of draws (0 or 1)


@given(st.integers(0, 2**32), _params, st.sampled_from([50, 300, 3000]))
def test_sample_equals_reference_larger_vocab(seed, params, n):
    t, k, p, mp = params
    g = np.random.default_rng(seed)
    logits = (g.normal(0, 2, n) + np.where(g.random(n) < 0.01, 8, 0)).astype(np.float32)
    logits[g.integers(0, n, 3)] = logits[0]  # ties
    a, b = Rng(seed), Rng(seed)
    got = sample(logits, t, k, p, mp, a)
    assert got == ref_sample(logits, t, k, p, mp, b)
    assert a.state == b.state


@given(st.integers(0, 2**32), st.sampled_from([0.0, 0.05]), st.sampled_from([1.0, 0.9]))
def test_chunked_draw_walk_equals_reference(seed, min_p, top_p):
    # The draw walk runs in chunks carrying the float32 running value; tiny chunks must not change it.
    import ds4.sampling as S

    g = np.random.default_rng(seed)
    logits = g.normal(0, 1, 200).astype(np.float32)
    saved = S._WALK_CHUNK
    S._WALK_CHUNK = 3
    try:
        a, b = Rng(seed), Rng(seed)
        got = sample(logits, 1.0, 0, top_p, min_p, a)
    finally:
        S._WALK_CHUNK = saved
    assert got == ref_sample(logits, 1.0, 0, top_p, min_p, b)


# ---- greedy and edge cases ---------------------------------------------------------------------


def test_greedy_is_argmax_and_consumes_no_draw():
    r = Rng(7)
    logits = np.array([1, 3, np.nan, 3, 2], dtype=np.float32)
    assert sample(logits, temperature=0.0, rng=r) == 1
    assert sample(logits, temperature=-1.0) == 1  # no rng needed when greedy
    assert r.state == 7


def test_argmax_rules():
    assert argmax(np.array([np.nan, np.nan], np.float32)) == 0
    assert argmax(np.array([-np.inf, -2e30], np.float32)) == 0  # nothing beats -1e30
    assert argmax(np.array([0, np.inf, np.inf], np.float32)) == 1
    assert argmax_excluding(np.array([9, 1, 5], np.float32), 0) == 2
    assert argmax_excluding(np.array([9, 1, 5], np.float32), 2) == 0
    assert argmax_excluding(np.array([1, np.nan, 5], np.float32), 0) == 1  # NaN start is kept


def test_no_finite_logit_falls_back_to_argmax_without_draw():
    r = Rng(3)
    assert sample(np.array([np.nan, -np.inf], np.float32), 1.0, rng=r) == 0
    assert r.state == 3


def test_sample_needs_rng_and_1d():
    with pytest.raises(InvalidArgumentError):
        sample(np.zeros(4, np.float32), 1.0)
    with pytest.raises(InvalidArgumentError):
        sample(np.zeros((2, 2), np.float32), 0.0)


def test_defaults():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (1.0, 0, 1.0, 0.05)
    assert not p.greedy and SamplingParams(temperature=0).greedy


def test_thinking_policy():
    from ds4.sampling import thinking_policy

    client = SamplingParams(temperature=0.2, top_k=5, top_p=0.5, min_p=0.0)
    assert thinking_policy(client, "high") == SamplingParams(1.0, 0, 1.0, 0.05)
    assert thinking_policy(client, "max") == SamplingParams(1.0, 0, 1.0, 0.05)
    assert thinking_policy(client, "none") is client


# ---- support and frequencies -------------------------------------------------------------------

PROBS = np.array([0.5, 0.3, 0.15, 0.04, 0.01])
LOGITS = np.concatenate([np.log(PROBS), np.full(3, -np.inf)]).astype(np.float32)
# Chi-square upper critical values at alpha = 1e-3 (probability a correct sampler fails for a
# given seed), by degrees of freedom; from standard tables.
CHI2_999 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467}

CASES = [
    # (kwargs, support kept by hand from PROBS)
    (dict(min_p=0.05), [0, 1, 2, 3]),  # p >= 0.05 * 0.5 = 0.025 drops 0.01
    (dict(min_p=0.0), [0, 1, 2, 3, 4]),
    (dict(min_p=0.5), [0, 1]),  # p >= 0.25
    (dict(min_p=0.0, top_p=0.75), [0, 1]),  # 0.5 < 0.75 <= 0.8
    (dict(min_p=0.0, top_p=0.9), [0, 1, 2]),  # 0.8 < 0.9 <= 0.95
    (dict(min_p=0.0, top_k=3), [0, 1, 2]),
    (dict(min_p=0.1, top_k=4, top_p=0.99), [0, 1, 2]),  # p >= 0.1 * 0.5 = 0.05 cuts 0.04
]


@pytest.mark.parametrize("kwargs,support", CASES)
def test_filters_keep_intended_support_and_frequencies(kwargs, support):
    n = 6000
    rng = Rng(20261129)
    draws = np.array([sample(LOGITS, rng=rng, **kwargs) for _ in range(n)])
    assert set(np.unique(draws)) <= set(support)
    expected = PROBS[support] / PROBS[support].sum() * n
    observed = np.array([np.count_nonzero(draws == s) for s in support])
    chi2 = float(np.sum((observed - expected) ** 2 / expected))
    assert chi2 < CHI2_999[len(support) - 1], (observed, expected)
    # every token of the support shows up (the rarest expects >= 0.04/1.0*6000 = 240 hits)
    assert observed.min() > 0


def test_temperature_flattens_distribution():
    n = 6000
    rng = Rng(99)
    draws = np.array([sample(LOGITS, temperature=2.0, min_p=0.0, rng=rng) for _ in range(n)])
    p = PROBS ** 0.5  # softmax(logits / 2)
    expected = p / p.sum() * n
    observed = np.array([np.count_nonzero(draws == s) for s in range(5)])
    assert float(np.sum((observed - expected) ** 2 / expected)) < CHI2_999[4]


# ---- log-probabilities -------------------------------------------------------------------------


def _ref_lse(values):
    fin = [float(v) for v in values if math.isfinite(v)]
    m = max(fin)
    return m + math.log(math.fsum(math.exp(v - m) for v in fin))


@given(st.lists(st.floats(-50, 50, width=32), min_size=1, max_size=40), st.integers(1, 10))
def test_top_logprobs(values, k):
    logits = np.array(values + [np.nan, -np.inf], dtype=np.float32)
    lse = _ref_lse(logits)
    got = top_logprobs(logits, k)
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))[:k]
    assert [g.id for g in got] == order
    for g in got:
        # logprob is stored as float32 (as upstream): compare within float32 resolution.
        assert g.logprob == pytest.approx(float(logits[g.id]) - lse, abs=1e-5, rel=1e-6)
    tl = token_logprob(logits, order[0])
    assert tl.logprob == got[0].logprob
    ls = log_softmax(logits)
    assert ls[-1] == -np.inf and ls[-2] == -np.inf
    assert math.fsum(math.exp(x) for x in ls[:-2]) == pytest.approx(1.0, abs=1e-12)


def test_token_logprob_bad_id():
    with pytest.raises(InvalidArgumentError):
        token_logprob(np.zeros(3, np.float32), 3)
