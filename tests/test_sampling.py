"""Sampling tests: RNG against values printed by a C program, choices against a scalar reference
written from docs/runtime.md §3 (loops over float32 scalars), filters' support and seeded chi-square
frequency tests."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ds4.errors import InvalidArgumentError
from ds4.sampling import (
    Rng,
    SamplingParams,
    argmax,
    argmax_excluding,
    log_softmax,
    probabilities,
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


# ---- scalar reference (docs/runtime.md §3.1-3.3, one token at a time) --------------------------------


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
    # in-range values only: out-of-range ones are refused (test_out_of_range_arguments_are_refused)
    st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.5, 4.0]),  # temperature
    st.sampled_from([0, 1, 2, 3, 5, 2000]),  # top_k
    st.sampled_from([1.0, 0.5, 0.9, 0.95, 0.2]),  # top_p
    st.sampled_from([0.05, 0.0, 0.1, 0.5, 1.0]),  # min_p
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


# ---- greedy and edge cases ---------------------------------------------------------------------


def test_greedy_is_argmax_and_consumes_no_draw():
    r = Rng(7)
    logits = np.array([1, 3, np.nan, 3, 2], dtype=np.float32)
    assert sample(logits, temperature=0.0, rng=r) == 1
    assert sample(logits, temperature=0.0) == 1  # no rng needed when greedy
    assert r.state == 7


@pytest.mark.parametrize("kw,name", [
    (dict(temperature=-1.0), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"), (dict(temperature="hot"), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_p=float("nan")), "top_p"),
    (dict(min_p=-0.1), "min_p"), (dict(min_p=1.01), "min_p"), (dict(min_p=float("nan")), "min_p"),
    (dict(top_k=-1), "top_k"), (dict(top_k=2.5), "top_k"), (dict(top_k=2**70 * 1.0), "top_k"),
])
def test_out_of_range_arguments_are_refused(kw, name):
    from ds4.errors import InvalidArgumentError
    with pytest.raises(InvalidArgumentError, match=name):
        sample(np.array([1, 3, 2], dtype=np.float32), rng=Rng(1), **kw)


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


@pytest.mark.parametrize("kwargs,support", CASES)
def test_probabilities_are_the_filtered_distribution(kwargs, support):
    # probabilities() is what one draw picks from: the hand-computed support, PROBS renormalised
    # over it (float32 weights: 1e-6 relative covers their rounding; a wrong support or a missing
    # renormalisation is off by >= 1%).
    from ds4.sampling import probabilities

    p = probabilities(LOGITS, **kwargs)
    assert p.dtype == np.float32 and p.shape == LOGITS.shape
    assert set(np.flatnonzero(p)) == set(support)
    want = PROBS[support] / PROBS[support].sum()
    assert np.allclose(p[support], want, rtol=1e-6, atol=0)
    greedy = probabilities(LOGITS, temperature=0)
    assert greedy.tolist() == [1.0] + [0.0] * (LOGITS.size - 1)


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


# ---- fast paths against a plain whole-vocabulary implementation ---------------------------------
#
# sample() avoids whole-vocabulary exp/sum/sort work where it can (logit floors, proven intervals
# around the total, predicted top-p prefixes). `plain_sample` does every step of §3 over the
# whole vocabulary with numpy: exp of every finite logit, np.cumsum for every sequential float32
# sum (numpy's accumulate adds in order), a stable argsort for every ordering. It is checked
# against the scalar loops above on small vocabularies, then used as the reference at sizes where
# the scalar loops would be too slow.


def _plain_expf(x):
    return np.exp(np.asarray(x, dtype=np.float64)).astype(np.float32)


def _plain_seq(w):
    return np.cumsum(np.asarray(w, dtype=np.float32), dtype=np.float32)


def _plain_walk(w, total, rng):
    r = F(rng.uniform() * total)
    run = _plain_seq(np.concatenate([[r], -np.asarray(w, dtype=np.float32)]))[1:]
    hit = np.flatnonzero(run <= 0)
    return int(hit[0]) if hit.size else None


def _plain_kept(logits, temperature, top_k, top_p, min_p):
    """What one draw picks from: ("pick", id) when no draw happens, else ("walk", ids, weights,
    their sequential sum, the pick when the walk runs off the end)."""
    lg = np.asarray(logits, dtype=np.float32)
    t, top_p, min_p = F(temperature), F(top_p), F(min_p)

    def amax():
        clean = np.where(np.isnan(lg), -np.inf, lg)
        i = int(np.argmax(clean))
        return i if clean[i] > F(-1e30) else 0

    if not t > 0:
        return ("pick", amax())
    if not (top_p > 0 and top_p <= 1):
        top_p = F(1)
    if min_p < 0:
        min_p = F(0)
    fin = np.flatnonzero(np.isfinite(lg))
    if fin.size == 0:
        return ("pick", amax())
    order = fin[np.argsort(-lg[fin], kind="stable")]  # logit desc, index asc
    if top_k <= 0:
        m = lg[order[0]]
        best = int(order[0])
        p = _plain_expf((lg[fin] - m) / t)
        if top_p >= 1:
            keep = ~(p < min_p)
            idx, w = fin[keep], p[keep]
            s = _plain_seq(w)[-1] if w.size else F(0)
            if not (s > 0 and np.isfinite(s)):
                return ("pick", best)
            return ("walk", idx, w, s, best)
        s = _plain_seq(p)[-1]
        if not (s > 0 and np.isfinite(s)):
            return ("pick", best)
        cand = order
        w = _plain_expf((lg[cand] - m) / t)
    else:
        cand = order[: min(top_k, 1024, lg.size)]
        w = _plain_expf((lg[cand] - lg[cand[0]]) / t)
        s = _plain_seq(w)[-1]
        if not (s > 0 and np.isfinite(s)):
            return ("pick", int(cand[0]))
    min_prob = F(F(w[0] / s) * min_p)
    run = _plain_seq(w)
    n = w.size
    below = np.flatnonzero((w[1:] / s).astype(np.float32) < min_prob)
    if below.size:
        n = min(n, int(below[0]) + 1)
    reached = np.flatnonzero((run / s).astype(np.float32) >= top_p)
    if reached.size:
        n = min(n, int(reached[0]) + 1)
    kept_w = w[:n]
    return ("walk", cand[:n], kept_w, _plain_seq(kept_w)[-1], int(cand[n - 1]))


def plain_sample(logits, temperature, top_k, top_p, min_p, rng):
    kept = _plain_kept(logits, temperature, top_k, top_p, min_p)
    if kept[0] == "pick":
        return kept[1]
    _, ids, w, s, fallback = kept
    hit = _plain_walk(w, s, rng)
    return fallback if hit is None else int(ids[hit])


def plain_probabilities(logits, temperature, top_k, top_p, min_p):
    """Each kept token's weight over the kept sum, float32(float64(w) * (1 / float64(sum)))."""
    out = np.zeros(np.asarray(logits).size, dtype=np.float32)
    kept = _plain_kept(logits, temperature, top_k, top_p, min_p)
    if kept[0] == "pick":
        out[kept[1]] = 1
        return out
    _, ids, w, s, _ = kept
    out[ids] = (w.astype(np.float64) * (1.0 / float(s))).astype(np.float32)
    return out


@given(st.lists(_logit, min_size=1, max_size=7), _params, st.integers(0, 2**64 - 1))
def test_plain_reference_equals_scalar_reference(logits, params, seed):
    t, k, p, mp = params
    a, b = Rng(seed), Rng(seed)
    assert plain_sample(logits, t, k, p, mp, a) == ref_sample(logits, t, k, p, mp, b)
    assert a.state == b.state


def _vocab_logits(seed, n, kind):
    g = np.random.default_rng(seed)
    if kind == "flat":
        x = g.normal(0, 3, n)
    elif kind == "peaked":  # a few dozen strong candidates over a floor, like a language model
        x = g.normal(0, 2, n)
        strong = g.choice(n, min(40, n), replace=False)
        x[strong] += g.uniform(6, 14, strong.size)
    elif kind == "ties":  # few distinct values: long runs of equal logits and weights
        x = np.round(g.normal(0, 2, n) * 2) / 2
    elif kind == "heavy":
        x = g.standard_cauchy(n)
    elif kind == "equal":  # one value: every token ties, every filter keeps all or none
        x = np.full(n, g.normal(0, 3))
    elif kind == "few":  # a handful of distinct values: huge tie runs of different weights
        x = g.choice(g.normal(0, 2, 5), n)
    elif kind == "denormal":  # logits around the denormal range: differences round, ties by -0/+0
        x = g.normal(0, 1, n) * 1e-39
        x[g.random(n) < 0.1] = -0.0
        x[g.random(n) < 0.1] = 0.0
    elif kind == "tinyrange":  # weights all within a few ulps of 1
        x = g.normal(0, 1e-6, n)
    elif kind == "sparse":  # nearly every logit -inf or NaN: fewer finite tokens than top_k asks
        x = np.full(n, -np.inf)
        x[g.random(n) < 0.3] = np.nan
        x[g.integers(0, n, 12)] = g.normal(0, 2, 12)
    else:  # non-finite entries: -inf, NaN and sometimes +inf among normal logits
        x = g.normal(0, 3, n)
        u = g.random(n)
        x[u < 0.02] = -np.inf
        x[(u >= 0.02) & (u < 0.03)] = np.nan
        if seed % 2:
            x[g.integers(0, n)] = np.inf
    return x.astype(np.float32)


_big_params = st.tuples(
    st.sampled_from([0.25, 0.7, 1.0, 1.5, 3.0]),  # temperature
    st.sampled_from([0, 0, 0, 1, 40, 1024]),  # top_k
    st.sampled_from([1.0, 0.99, 0.95, 0.9, 0.5, 0.1]),  # top_p
    st.sampled_from([0.05, 0.0, 0.2, 1e-4, 1e-30]),  # min_p
)


@given(st.integers(0, 2**32), st.sampled_from([129280, 20000, 3001]),
       st.sampled_from(["flat", "peaked", "ties", "heavy", "nonfinite"]), _big_params)
def test_sample_equals_plain_reference_full_vocab(seed, n, kind, params):
    t, k, p, mp = params
    logits = _vocab_logits(seed, n, kind)
    for draw in range(3):  # a few draws per logit vector: different walk positions
        a, b = Rng(seed + draw), Rng(seed + draw)
        assert sample(logits, t, k, p, mp, a) == plain_sample(logits, t, k, p, mp, b)
        assert a.state == b.state


@given(st.integers(0, 2**32), st.sampled_from([0.9, 0.5, 1.0]), st.integers(1, 6))
def test_min_p_at_a_weight_boundary(seed, top_p, which):
    # min_p equal to (or one ulp around) a token's weight: the interval shortcut must step aside
    # and the exact total decide.
    logits = _vocab_logits(seed, 5000, "peaked")
    order = np.argsort(-logits, kind="stable")
    w = _plain_expf(logits[order[which]] - logits[order[0]])
    for mp in (w, np.nextafter(w, F(0)), np.nextafter(w, F(1))):
        a, b = Rng(seed), Rng(seed)
        assert sample(logits, 1.0, 0, top_p, float(mp), a) == plain_sample(logits, 1.0, 0, top_p, float(mp), b)


# ---- a wide seeded sweep: the fast paths against the plain reference ----------------------------
#
# Every logit shape above (ties, equal, few values, denormals, +-inf and NaN, heavy tails) with
# temperatures from 0.05 to 100 (100 makes every weight near 1: the sorted prefixes span most of the
# vocabulary), top_k 0..1024, top_p 0.1..1 and min_p 0..1 incl. a denormal. Picks and RNG states
# must equal plain_sample's, probabilities() must equal plain_probabilities' bit for bit; with one
# sampler thread and with two (the pool path of the whole-vocabulary total must not change a bit).

_SWEEP_KINDS = ["flat", "peaked", "ties", "heavy", "nonfinite", "equal", "few", "denormal", "tinyrange", "sparse"]


def _sweep_cases(seed, count):
    g = np.random.default_rng(seed)
    for i in range(count):
        kind = _SWEEP_KINDS[i % len(_SWEEP_KINDS)]
        n = int(g.choice([129280, 20000, 3001, 200]))
        t = float(g.choice([0.05, 0.25, 1.0, 1.5, 100.0]))
        k = int(g.choice([0, 0, 0, 1, 40, 1024]))
        p = float(g.choice([1.0, 1.0, 0.99, 0.9, 0.5, 0.1]))
        mp = float(g.choice([0.05, 0.0, 0.0, 0.2, 1e-4, 1e-30, 1.0, 1e-45]))
        if t == 100.0 and p < 1 and k == 0 and kind in ("flat", "peaked", "heavy", "nonfinite"):
            n = min(n, 20000)   # a sort of nearly every token: milliseconds per call at 129,280
        yield int(g.integers(0, 2**32)), kind, n, t, k, p, mp


@pytest.mark.parametrize("threads", [1, 2])
def test_sweep_equals_plain_reference(threads):
    from ds4.sampling import set_sampler_threads

    set_sampler_threads(threads)
    assert _core().sampling_threads() == threads
    try:
        for i, (seed, kind, n, t, k, p, mp) in enumerate(_sweep_cases(1400 + threads, 200)):
            logits = _vocab_logits(seed, n, kind)
            case = (seed, kind, n, t, k, p, mp)
            for draw in range(2):
                a, b = Rng(seed + draw), Rng(seed + draw)
                assert sample(logits, t, k, p, mp, a) == plain_sample(logits, t, k, p, mp, b), case
                assert a.state == b.state, case
            if i % 2 == 0:
                got = probabilities(logits, t, k, p, mp)
                want = plain_probabilities(logits, t, k, p, mp)
                assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), case
    finally:
        set_sampler_threads(1)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_set_sampler_threads_refuses_non_positive_integers(bad):
    from ds4.sampling import set_sampler_threads

    with pytest.raises(InvalidArgumentError, match="n"):
        set_sampler_threads(bad)


# ---- the fast paths' building blocks -------------------------------------------------------------


@given(st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, 1e-30, -3e38, 3e38]) | st.floats(-5, 5, width=32),
                min_size=1, max_size=300))
def test_order_desc_is_a_stable_descending_argsort(values):
    from ds4.reference import logprobs as S   # the numpy top_logprobs, now the core's reference

    v = np.array(values * (64 // len(values) + 1), dtype=np.float32)  # >= 64: the uint64-key sort
    assert S._order_desc(v).tolist() == np.argsort(-v, kind="stable").tolist()


@given(st.integers(0, 2**32), st.integers(1, 3000), st.integers(1, 1100))
def test_rank_floor_keeps_the_top_k(seed, n, k):
    from ds4.reference import logprobs as S   # the numpy top_logprobs, now the core's reference

    v = np.round(np.random.default_rng(seed).normal(0, 3, n), 1).astype(np.float32)  # with ties
    k = min(k, n)
    f = S._rank_floor(v, k)
    assert f <= np.sort(v)[::-1][k - 1]  # at or below the k-th largest: the top k are all >= f


# ---- exact sums a binade at a time (csrc/sampling/binade_sum.*) ----------------------------------
#
# The sampler's whole-vocabulary sums and walks add integer units per binade and evaluate most
# weights only approximately (docs/sampling.md). Each must equal the plain float32 loop bit for bit;
# the references below are that loop (np.cumsum adds in order). Inputs aim at the model's edges:
# exact half-unit ties (either parity), long runs of equal terms, binade crossings, terms far below
# half a unit, denormals, zeros, and inf/NaN/negative terms, which must drop to the plain loop.


def _core():
    from ds4 import _core
    return _core


def _f32_bits_equal(a, b) -> bool:
    a, b = np.float32(a), np.float32(b)
    return bool(a.view(np.uint32) == b.view(np.uint32)) or (np.isnan(a) and np.isnan(b))


def _plain_sum(w) -> np.float32:
    # s = 0; s += w[i]: the leading 0 matters (0 + -0 is +0, which cumsum alone would not give)
    w = np.concatenate([[F(0)], np.asarray(w, dtype=np.float32)])
    return np.cumsum(w, dtype=np.float32)[-1]


def _terms(kind: str, seed: int, n: int) -> np.ndarray:
    g = np.random.default_rng(seed)
    if kind == "equal":   # one value n times: long runs of the same rounding
        return np.full(n, g.choice([1.0, 0.1, 2.0**-24, 3e-8, 1e-30, 1e-40, 0.0]), dtype=np.float32)
    if kind == "ties":    # half a unit of the running sum, exactly, from an even or odd start
        start = np.float32(g.choice([1.0, 1.0 + 2.0**-23, 3.0, 2.0**20 + 1, 0.75]))
        half = np.spacing(start) / 2
        w = np.full(n, half, dtype=np.float32)
        w[g.random(n) < 0.1] = half * g.choice([2, 3, 5])
        w[0] = start
        return w
    if kind == "geometric":   # growing terms: the sum crosses a binade every few dozen terms
        return (1e-6 * 1.02 ** np.arange(n) * g.uniform(0.5, 1.5, n)).astype(np.float32)
    if kind == "tiny":        # terms below half a unit once a large one is in
        w = g.uniform(0, 2.0**-26, n).astype(np.float32)
        w[g.integers(0, n)] = 1.0
        return w
    w = np.exp(g.normal(0, 3, n)).astype(np.float32)   # "lognormal", "special"
    if kind == "special":
        for v in (np.inf, np.nan, -1.0, -0.0, 1e-45, 0.0):
            if g.random() < 0.5:
                w[g.integers(0, n)] = v
    return w


@given(st.sampled_from(["equal", "ties", "geometric", "tiny", "lognormal", "special"]),
       st.integers(0, 2**32), st.sampled_from([1, 15, 16, 127, 128, 129, 1000, 5000]))
def test_binade_seq_sum_is_the_plain_loop(kind, seed, n):
    w = _terms(kind, seed, n)
    assert _f32_bits_equal(_core()._binade_seq_sum(w), _plain_sum(w))


def test_binade_seq_sum_ties_go_to_even():
    # 1 + 2^-24 is a tie between 1 and 1 + 2^-23: the plain loop keeps 1 (even) however many are
    # added; a model that rounded halves up would climb by 2^-23 each time. From an odd start the
    # first tie goes up to the even neighbour, after which the sum stays.
    for start, want in ((1.0, 1.0), (1.0 + 2.0**-23, 1.0 + 2.0**-22)):
        w = np.full(300, 2.0**-24, dtype=np.float32)
        w[0] = start
        got = _core()._binade_seq_sum(w)
        assert _f32_bits_equal(got, _plain_sum(w)) and got == np.float32(want)
        assert np.float32(start) + 299 * 2.0**-23 != want   # round-half-up would differ


@pytest.mark.parametrize("below", [1, 2, 3, 17, 64, 200])
@pytest.mark.parametrize("n", [16, 64, 256])
def test_binade_seq_sum_at_the_top_of_a_binade(below, n):
    # A sum `below` units under 2^24 (unit 1), then terms of 0.75 and 1.25 (one unit each, no
    # half-unit tie): the unit count is symmetric only while it stays below 2^24, where the grid
    # turns to 2 and the order of the 0.75s and 1.25s decides the rounding (docs/sampling.md,
    # "Order inside a binade"; the bucket design's prototype met the same boundary).
    g = np.random.default_rng(below * 1000 + n)
    w = np.where(g.random(n) < 0.5, 0.75, 1.25).astype(np.float32)
    for head in (np.float32(2**24 - below), np.float32(2**24 - below) * np.float32(2.0**-30)):
        ws = np.concatenate([[head], w * (head / np.float32(2**24 - below))]).astype(np.float32)
        assert _f32_bits_equal(_core()._binade_seq_sum(ws), _plain_sum(ws))


def _args(kind: str, seed: int, n: int) -> np.ndarray:
    g = np.random.default_rng(seed)
    if kind == "flat":
        a = g.normal(0, 3, n)
    elif kind == "peaked":
        a = g.normal(0, 2, n)
        a[g.choice(n, min(40, n), replace=False)] += g.uniform(6, 14, min(40, n))
    elif kind == "equal":      # every weight 1: integer sums
        a = np.zeros(n)
    elif kind == "halves":     # weights of 2^-24 after a 1: exact half-unit ties
        a = np.full(n, -24 * math.log(2))
        a[0] = 0.0
    else:                      # "sparse": runs of -inf and of weights that are exactly 0
        a = g.normal(0, 3, n)
        a[g.random(n) < 0.5] = -np.inf
        a[(np.arange(n) // 200) % 3 == 1] = -200.0
        a[g.integers(0, n)] = 5.0
    x = (a - np.max(a[np.isfinite(a)])).astype(np.float32)
    return x


_ARG_KINDS = ["flat", "peaked", "equal", "halves", "sparse"]


@given(st.sampled_from(_ARG_KINDS), st.integers(0, 2**32), st.sampled_from([5, 128, 1000, 20000]))
def test_binade_weight_total_and_walk_are_the_plain_loops(kind, seed, n):
    core = _core()
    x = _args(kind, seed, n)
    w = core._exp_weights(x)
    total = _plain_sum(w)
    assert _f32_bits_equal(core._binade_weight_total(x), total)
    g = np.random.default_rng(seed)
    for r in (F(0), F(1e-30), F(g.random()) * total, total, np.nextafter(total, F(0)), F(g.random() * 1e-3) * total):
        run = np.cumsum(np.concatenate([[F(r)], -w]).astype(np.float32), dtype=np.float32)[1:]
        hit = np.flatnonzero(run <= 0)
        assert core._binade_weight_walk(x, F(r)) == (int(hit[0]) if hit.size else -1)


def test_approx_weights_stay_within_their_bound():
    # The certificate behind skipping exact exponentials: |approx - exact| <= rel * exact for
    # arguments >= -87 (weights normal floats), <= 2^-125 below. (Checked once over every float32 in [-87, 0]:
    # at most 2^-21.2; here a sample, with the edges.) A bound 8x tighter than rel is violated,
    # so the check is not vacuous.
    core = _core()
    g = np.random.default_rng(5)
    x = np.concatenate([g.uniform(-87, 0, 200_000), -np.exp(g.uniform(-40, math.log(87), 200_000)),
                        [0.0, -0.0, -87.0, -87.5, -105.0, -1e30, -np.inf],
                        np.arange(-4032, 1) * (math.log(2) / 32)]).astype(np.float32)
    exact = core._exp_weights(x).astype(np.float64)
    err = np.abs(core._approx_exp_weights(x).astype(np.float64) - exact)
    rel = core._approx_weight_rel()
    normal = x >= -87
    assert np.all(err[normal] <= rel * exact[normal])
    assert np.all(err[~normal] <= 2.0**-125)
    if rel < 2.0**-10:   # the AVX-512 build approximates; elsewhere approx is exact (err 0)
        assert np.any(err[normal] > rel / 8 * exact[normal]) or not np.any(err)


# ---- regressions and the branches added for issue 14's speed target ------------------------------


def test_binade_units_do_not_overflow_int32():
    # 128 terms of exactly 2^24 units each (2 after a sum of 1): 2^31 units in one chunk wrapped
    # the int32 count to a negative sum. Through sample(): the weight 1 tokens after a first
    # weight in [0.5, 1) (2^24 units at the unit 2^-24) made the min_p 0 total negative, so the
    # sampler picked the best token without a draw.
    w = np.array([1.0] + [0.0] * 127 + [2.0] * 128, dtype=np.float32)
    assert _f32_bits_equal(_core()._binade_seq_sum(w), _plain_sum(w))
    x = np.array([-0.5] + [-np.inf] * 127 + [0.0] * 128, dtype=np.float32)
    assert _f32_bits_equal(_core()._binade_weight_total(x), _plain_sum(_core()._exp_weights(x)))
    for seed in range(20):
        for t, mp in ((1.0, 0.0), (1.0, 0.05), (0.5, 0.0)):
            a, b = Rng(seed), Rng(seed)
            assert sample(x, t, 0, 1.0, mp, a) == plain_sample(x, t, 0, 1.0, mp, b)
            assert a.state == b.state


def _seed_with_first_uniform_zero() -> int:
    """A seed whose first uniform() is exactly 0: xorshift64* inverted from an output below 2^40."""
    mask = (1 << 64) - 1
    x = (12345 * pow(0x2545F4914F6CDD1D, -1, 1 << 64)) & mask   # the state that outputs 12345

    def undo_right(v, s):
        r = v
        for _ in range(64 // s + 1):
            r = v ^ (r >> s)
        return r & mask

    def undo_left(v, s):
        r = v
        for _ in range(64 // s + 1):
            r = v ^ ((r << s) & mask)
        return r & mask

    return undo_right(undo_left(undo_right(x, 27), 25), 12)


def test_a_draw_of_zero_stops_at_the_first_kept_token():
    # r = u * total = 0 stops the walk at the first kept token. The whole-vocabulary walk reads
    # every logit (non-finite ones weighing 0), so it must not stop at a non-finite token 0.
    seed = _seed_with_first_uniform_zero()
    assert Rng(seed).uniform() == 0
    g = np.random.default_rng(3)
    for lead in ([-np.inf], [np.nan, np.inf], [-np.inf] * 40):
        logits = np.concatenate([lead, g.normal(0, 2, 3000)]).astype(np.float32)
        for t, k, p, mp in ((1.0, 0, 1.0, 0.0), (100.0, 0, 1.0, 0.05), (1.0, 0, 1.0, 0.05), (1.0, 0, 0.9, 0.0)):
            a, b = Rng(seed), Rng(seed)
            got = sample(logits, t, k, p, mp, a)
            assert got == plain_sample(logits, t, k, p, mp, b)
            assert a.state == b.state
            if p == 1.0 and (mp == 0.0 or t == 100.0):   # every finite token kept, in id order
                assert got == len(lead)


_equal_value = st.sampled_from([0.0, -0.0, 1.5, -7.25, 1e-40, -1e-45, 3e38, -3e38, 88.0])


@given(st.integers(0, 2**32), _equal_value, st.sampled_from([1, 2, 7, 300, 3001, 129280]),
       st.sampled_from(["none", "nonfinite", "signed_zero", "one_ulp"]), _big_params,
       st.sampled_from([1.0, 0.9999, 0.5, 0.1, 1e-7]))
def test_equal_logits_equal_the_plain_reference(seed, value, n, extra, params, top_p):
    # All finite logits equal: every weight is expf(0) = 1 and the sampler counts instead of
    # summing (docs/sampling.md). Non-finite entries, -0.0 among 0.0, and one logit one ulp away
    # (which must leave the shortcut) against the plain reference; probabilities bit for bit.
    t, k, _, mp = params
    g = np.random.default_rng(seed)
    logits = np.full(n, value, dtype=np.float32)
    if extra == "nonfinite" and n > 1:
        logits[g.integers(0, n, max(1, n // 10))] = g.choice([np.nan, np.inf, -np.inf])
    elif extra == "signed_zero":
        logits[:] = 0.0
        logits[g.random(n) < 0.5] = -0.0
    elif extra == "one_ulp":
        logits[g.integers(0, n)] = np.nextafter(np.float32(value), np.float32(np.inf if g.random() < 0.5 else -np.inf))
    for draw in range(3):
        a, b = Rng(seed + draw), Rng(seed + draw)
        assert sample(logits, t, k, top_p, mp, a) == plain_sample(logits, t, k, top_p, mp, b)
        assert a.state == b.state
    got = probabilities(logits, t, k, top_p, mp)
    want = plain_probabilities(logits, t, k, top_p, mp)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@given(st.integers(0, 2**32), st.sampled_from([0.05, 0.25, 1.0, 3.0]), st.sampled_from([(1.0, 0.0), (0.9, 0.0), (1.0, 1e-30)]))
def test_runs_of_zero_weights_equal_the_plain_reference(seed, t, filters):
    # Logits far below the maximum weigh exactly 0 and are skipped a block at a time by a logit
    # compare (docs/sampling.md). Runs of them with NaN and +-inf inside, logits at and around the
    # skip floor, and runs that end mid-block, against the plain reference.
    top_p, mp = filters
    g = np.random.default_rng(seed)
    n = 20000
    logits = g.normal(0, 2, n)
    logits[g.choice(n, 30, replace=False)] += g.uniform(6, 14, 30)
    m = float(np.max(logits))
    for start in g.integers(0, n - 700, 12):
        length = int(g.integers(1, 700))
        logits[start:start + length] = m - 105.0 * t * g.uniform(1.0, 3.0, length)
        logits[start + g.integers(0, length, 3)] = g.choice([np.nan, np.inf, -np.inf, m - 105.0 * t])
    edge = np.float32(m - 105.0 * t)
    logits[g.integers(0, n, 20)] = [np.nextafter(edge, np.float32(k % 3 - 1)) for k in range(20)]
    logits = logits.astype(np.float32)
    logits[int(np.argmax(logits))] = np.float32(m)   # the maximum stays finite
    for draw in range(6):
        a, b = Rng(seed + draw), Rng(seed + draw)
        assert sample(logits, t, 0, top_p, mp, a) == plain_sample(logits, t, 0, top_p, mp, b)
        assert a.state == b.state
    # the total divides every probability: a skipped weight that was not 0 changes their bits
    got, want = probabilities(logits, t, 0, top_p, mp), plain_probabilities(logits, t, 0, top_p, mp)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


_EXP2_32 = [float.fromhex(h) for h in (
    "0x1.0000000000000p+0", "0x1.059b0d3158574p+0", "0x1.0b5586cf9890fp+0", "0x1.11301d0125b51p+0",
    "0x1.172b83c7d517bp+0", "0x1.1d4873168b9aap+0", "0x1.2387a6e756238p+0", "0x1.29e9df51fdee1p+0",
    "0x1.306fe0a31b715p+0", "0x1.371a7373aa9cbp+0", "0x1.3dea64c123422p+0", "0x1.44e086061892dp+0",
    "0x1.4bfdad5362a27p+0", "0x1.5342b569d4f82p+0", "0x1.5ab07dd485429p+0", "0x1.6247eb03a5585p+0",
    "0x1.6a09e667f3bcdp+0", "0x1.71f75e8ec5f74p+0", "0x1.7a11473eb0187p+0", "0x1.82589994cce13p+0",
    "0x1.8ace5422aa0dbp+0", "0x1.93737b0cdc5e5p+0", "0x1.9c49182a3f090p+0", "0x1.a5503b23e255dp+0",
    "0x1.ae89f995ad3adp+0", "0x1.b7f76f2fb5e47p+0", "0x1.c199bdd85529cp+0", "0x1.cb720dcef9069p+0",
    "0x1.d5818dcfba487p+0", "0x1.dfc97337b9b5fp+0", "0x1.ea4afa2a490dap+0", "0x1.f50765b6e4540p+0")]


def _scalar_exp_weights(x):
    """csrc/sampling/exp_weights.inc's double evaluation, one IEEE operation per numpy step (no
    fused multiply-adds): the scalar build's bits, which every SIMD build must reproduce."""
    v = np.asarray(x, dtype=np.float32).astype(np.float64)
    v = np.where(v < -120.0, -120.0, v)
    kshift = v * 46.166241308446828384 + 6755399441055744.0
    k = kshift - 6755399441055744.0
    r = (v - k * (0.693147180369123816490 / 32.0)) - k * (1.90821492927058770002e-10 / 32.0)
    p = np.full_like(v, 1.0 / 720.0)
    for c in (1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0):
        p = p * r + c
    u = kshift.view(np.uint64) - np.uint64(0x4338000000000000) + np.uint64(1023 * 32)
    scale = ((u >> np.uint64(5)) << np.uint64(52)).view(np.float64)
    return ((p * np.array(_EXP2_32)[(u & np.uint64(31)).astype(np.int64)]) * scale).astype(np.float32)


def test_exp_weights_are_the_scalar_bits():
    # The exact weights of every build (the AVX-512 one here when the CPU has it: a max for the
    # clamp, x - k*ln2_hi fused since that product is exact) against the scalar evaluation, bit for
    # bit: arguments over the whole range, the table's every entry and both sides of the clamp, in
    # a length that leaves a remainder for the scalar tail.
    g = np.random.default_rng(14)
    x = np.concatenate([g.uniform(-125, 0, 300_000), -np.exp(g.uniform(-30, math.log(125), 300_000)),
                        np.arange(-5600, 1) * (math.log(2) / 32), g.uniform(-0.02, 0, 10_000),
                        [0.0, -0.0, -1e-45, -87.0, -103.9, -104.0, -119.99, -120.0, -120.01, -1e30, -np.inf]])
    x = x.astype(np.float32)
    assert x.size % 8 != 0
    got, want = _core()._exp_weights(x).view(np.uint32), _scalar_exp_weights(x).view(np.uint32)
    assert np.array_equal(got, want), f"{np.count_nonzero(got != want)} weights differ, e.g. x={x[got != want][:3]}"


@pytest.mark.parametrize("kind", ["flat", "peaked", "nonfinite", "denormal", "heavy"])
@pytest.mark.parametrize("t, mp", [(1.0, 0.0), (0.7, 0.0), (100.0, 0.0), (100.0, 0.05), (1.0, 1e-45)])
def test_whole_vocabulary_probabilities_from_exact_weights(kind, t, mp):
    # probabilities() with every finite token kept (top_p 1; min_p 0, or every token surviving it)
    # writes the exact weights into its output, sums them there and scales them in place: bit for
    # bit the plain reference, in lengths that end inside a piece of 2048 logits and a block of 16.
    # A sample() after it must still draw from its own buffers (the output is the caller's).
    for n in (129_280, 4_099, 37):
        seed = 77 + n
        logits = _vocab_logits(seed, n, kind)
        got = probabilities(logits, t, 0, 1.0, mp)
        want = plain_probabilities(logits, t, 0, 1.0, mp)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (kind, n, t, mp)
        a, b = Rng(seed), Rng(seed)
        assert [sample(logits, t, 0, 1.0, mp, a) for _ in range(3)] == [plain_sample(logits, t, 0, 1.0, mp, b) for _ in range(3)]
        assert a.state == b.state


# ---- top-p over logit-value buckets (csrc/sampling/bucket_topp.*, docs/sampling.md) -------------
#
# The bucket branch computes the sorted branch's top-p stop, kept set, sum and walk without sorting
# most of the prefix. `_bucket_top_p` runs it on given weights (exact w, approximations wa within
# rel of them), so the boundaries that real logits never reach can be built; the sampler's own use
# is checked against the plain reference with the branch's size threshold lowered to 0 (every
# `min_p 0, top_p < 1` selection of a non-equal vocabulary takes it) and at its default.


def _plain_top_p(a, w, total, top_p, rs):
    """The sorted loops: (kept ids in sorted order, their float32 sum, the id each r's walk picks or -1)."""
    a = np.asarray(a, dtype=np.float32)
    fin = np.flatnonzero(np.isfinite(a))
    order = fin[np.argsort(-a[fin], kind="stable")]
    run = _plain_seq(np.concatenate([[F(0)], w[order]]))[1:]
    with np.errstate(divide="ignore", invalid="ignore"):   # a total of 0: no stop (NaN)
        hit = np.flatnonzero((run / F(total)).astype(np.float32) >= F(top_p))
    if not hit.size or not F(total) > 0:
        return None
    kept = order[: hit[0] + 1]
    picks = []
    for r in rs:
        walk = _plain_seq(np.concatenate([[F(r)], -w[kept]]))[1:]
        h = np.flatnonzero(walk <= 0)
        picks.append(int(kept[h[0]]) if h.size else -1)
    return kept, run[hit[0]], picks


def _check_buckets(a, w, total, top_p, rs, buckets, wa=None, rel=0.0, floor=None):
    """The bucket partition against the sorted loops: over every token, or with ``floor`` over the
    prefix {finite a >= floor} (tests/test_sampling_prefix.py). Returns the kept count, None when
    the partition refused (no stop in reach: the sorted path decides)."""
    a, w = np.asarray(a, dtype=np.float32), np.asarray(w, dtype=np.float32)
    wa = w if wa is None else np.asarray(wa, dtype=np.float32)
    prefix = {} if floor is None else {"floor": F(floor)}
    got = _core()._bucket_top_p(a, w, wa, rel, F(total), F(top_p), buckets, np.asarray(rs, dtype=np.float32),
                                **prefix)
    if floor is not None:
        with np.errstate(invalid="ignore"):
            a = np.where(~(a >= F(floor)), np.float32(-np.inf), a)   # outside the prefix (NaN too)
    return _partition_matches_sorted(got, a, w, total, top_p, rs)


def _partition_matches_sorted(got, a, w, total, top_p, rs):
    """``_bucket_top_p``'s result against the sorted loops over the finite tokens of ``a``: the
    kept count, sum bits, kept set and walk picks, or None on both sides. Returns the kept count."""
    want = _plain_top_p(a, w, total, top_p, rs)
    if want is None:
        assert got is None
        return None
    assert got is not None
    count, s, kept, picks, _ = got
    assert count == want[0].size and _f32_bits_equal(s, want[1])
    assert np.array_equal(np.sort(kept), np.sort(want[0]))
    assert picks == want[2]
    return count


@pytest.mark.parametrize("rel", [0.0, 2.0**-20])
def test_bucket_sum_at_the_top_of_a_binade(rel):
    # A running sum 2^24 - 1 units (unit 1), then one bucket {0.75, 1.25}: 2 units would end at
    # 2^24 + 1, past the binade; the grid there is 2 and the sorted loop gives 2^24 + 2, a unit
    # count 2^24 + 1 -> 2^24. The bucket must be sorted (S + R < 2^24 is the bound). The next
    # terms 1 and 2^24 carry the difference to the stop's sum (2^25 + 4 against 2^25).
    a = [1.0, 0.0, -0.0001, -2.5, -5.0]
    w = [16777215.0, 0.75, 1.25, 1.0, 2.0**24]
    assert F(F(F(w[0]) + F(w[1])) + F(w[2])) == F(2**24 + 2)
    assert _plain_seq(w)[-1] == F(2**25 + 4) and F(F(F(2**24) + F(1)) + F(2**24)) == F(2**25)
    rs = [F(u) * F(2**25 + 4) for u in (0.1, 0.4999999, 0.5, 0.5000001, 0.9)]
    for total in (4e7, 3.6e7):
        _check_buckets(a, w, total, 0.8, rs, 4096, rel=rel)
    # the same one unit lower: S + R = 2^24 - 1 + 1 stays inside and is added as a count
    w2 = [16777214.0, 0.75, 0.25, 1.0, 2.0**24]
    _check_buckets(a, w2, 4e7, 0.8, rs, 4096, rel=rel)


@pytest.mark.parametrize("rel", [0.0, 2.0**-20])
def test_bucket_walk_at_the_floor_of_a_binade(rel):
    # The walk from r = 2^23 + 1 (unit 1) over a bucket {1.4}: one unit would leave 2^23, but the
    # exact 2^23 - 0.4 lies on the finer grid below 2^23 and rounds to 2^23 - 0.5, which the next
    # weight 2^23 - 0.5 then takes to 0 (a pick); the unit count would leave 0.5 (no pick). The
    # walk may count a bucket only while S - R >= 2^23 + 1.
    a = [2.0, 1.0, 0.0]
    w = [1.4, 8388607.5, 1.0]
    assert F(F(8388609.0) - F(1.4)) == F(8388607.5)
    _check_buckets(a, w, 8388610.0, 0.5, [8388609.0, 8388610.0, 8388608.0, 1.0, 0.0], 4096, rel=rel)


def test_bucket_ties_at_the_stop_keep_id_order():
    # The stop inside a run of equal logits: the kept part of the run is its lowest ids.
    a = np.array([3.0] * 5 + [2.0] * 40 + [1.0] * 7, dtype=np.float32)
    perm = np.random.default_rng(2).permutation(a.size)
    a = a[perm]
    w = _plain_expf(a - F(3.0))
    total = _plain_sum(w)
    for top_p in (0.3, 0.5, 0.7, 0.8, 0.9, 0.999):
        for nb in (1, 2, 4096):
            _check_buckets(a, w, total, top_p, [F(u) * total for u in (0.0, 0.2, 0.5, 0.99)], nb)


def _bucket_case(kind, g, n):
    """Logits and exact weights of a kind the walk or the sum must get right."""
    if kind == "halves":   # weights 1 and exact half-unit ties against the running sum
        a = g.normal(0, 1, n).astype(np.float32)
        e = g.integers(-8, 8, n).astype(np.float64)
        w = np.where(g.random(n) < 0.5, 2.0**e, 1.5 * 2.0**(e - 23)).astype(np.float32)
        return a, w
    if kind == "crossing":   # few buckets, growing weights: many binades inside one bucket
        a = np.sort(g.normal(0, 1, n))[::-1].astype(np.float32)
        w = (np.geomspace(1e-6, 1e3, n) * g.uniform(0.5, 1.5, n)).astype(np.float32)[::-1].copy()
        return a, w
    if kind == "denormal":   # sums below 2^-126, where the grid no longer follows the binade
        a = g.normal(0, 1, n).astype(np.float32)
        w = (g.uniform(0, 1, n) * 1e-40).astype(np.float32)
        w[g.integers(0, n, 3)] = g.choice([1e-45, 1e-38, 0.0])
        return a, w
    if kind == "nonfinite":   # -inf, NaN, +inf logits are never candidates (their w is garbage)
        a = g.normal(0, 3, n).astype(np.float32)
        u = g.random(n)
        a[u < 0.05] = -np.inf
        a[(u >= 0.05) & (u < 0.08)] = np.nan
        a[(u >= 0.08) & (u < 0.09)] = np.inf
        w = _plain_expf(np.where(np.isfinite(a), a - a[np.isfinite(a)].max(), -np.inf) / 7)
        w[~np.isfinite(a)] = g.choice([0.0, 1.0, 1e30], int(np.count_nonzero(~np.isfinite(a))))
        return a, w
    if kind == "ties":   # quarter steps: long runs of equal logits and weights
        a = (np.round(g.normal(0, 3, n) * 4) / 4).astype(np.float32)
    elif kind == "zeros":   # signed zeros among denormal logits (one key), weights near 1
        a = (g.normal(0, 1, n) * 1e-39).astype(np.float32)
        a[g.random(n) < 0.2] = -0.0
        a[g.random(n) < 0.2] = 0.0
    else:   # "flat"
        a = g.normal(0, 3, n).astype(np.float32)
    t = F(g.choice([100.0, 7.0, 1.5]))
    w = _plain_expf(((a - a.max()) / t).astype(np.float32))
    return a, w


@given(st.sampled_from(["flat", "ties", "halves", "crossing", "denormal", "nonfinite", "zeros"]),
       st.integers(0, 2**32), st.sampled_from([3, 100, 2000, 20000]), st.sampled_from([1, 2, 7, 64, 4096]),
       st.sampled_from([0.1, 0.5, 0.9, 0.99, 1.0]), st.booleans())
def test_bucket_top_p_equals_the_sorted_loops(kind, seed, n, buckets, top_p, approx):
    # Kept set, sum bits and walk picks against the sorted loops, with exact weights or with
    # approximations inside the certificate's bound (relative 2^-20, the worst case at its edge).
    g = np.random.default_rng(seed)
    a, w = _bucket_case(kind, g, n)
    fin = np.isfinite(a)
    total = _plain_sum(np.where(fin, w, F(0)))
    rel = 2.0**-20 if approx else 0.0
    wa = w
    if approx:
        wa = (w.astype(np.float64) * (1 + rel * g.choice([-1.0, 1.0, 0.999, g.uniform(-1, 1)], n))).astype(np.float32)
    rs = [F(u) * total for u in g.random(6).astype(np.float32)] + [F(0), total]
    _check_buckets(a, w, total, top_p, rs, buckets, wa=wa, rel=rel)


class _BucketsAlways:
    """The bucket branch for every min_p 0, top_p < 1 selection (its size threshold set to 0)."""

    def __enter__(self):
        self.old = _core()._bucket_top_p_min_kept()
        _core()._set_bucket_top_p_min_kept(0.0)

    def __exit__(self, *exc):
        _core()._set_bucket_top_p_min_kept(self.old)


@given(st.integers(0, 2**32), st.sampled_from([129280, 20000, 3001, 200]),
       st.sampled_from(["flat", "peaked", "ties", "heavy", "nonfinite", "few", "denormal", "tinyrange", "sparse"]),
       st.sampled_from([100.0, 7.0, 1.5, 1.0, 0.25]), st.sampled_from([0.99, 0.95, 0.9, 0.5, 0.1]))
def test_sampler_bucket_branch_equals_plain_reference(seed, n, kind, t, top_p):
    # Every min_p 0, top_p < 1 selection through the bucket branch: picks, RNG states and
    # probabilities() bits against the plain reference.
    logits = _vocab_logits(seed, n, kind)
    with _BucketsAlways():
        before = _core()._bucket_top_p_selections()
        for draw in range(3):
            a, b = Rng(seed + draw), Rng(seed + draw)
            assert sample(logits, t, 0, top_p, 0.0, a) == plain_sample(logits, t, 0, top_p, 0.0, b)
            assert a.state == b.state
        got = probabilities(logits, t, 0, top_p, 0.0)
        # the branch decided (it steps aside only for equal logits, no finite logit, no stop)
        kept = _plain_kept(logits, t, 0, top_p, 0.0)
        fin = logits[np.isfinite(logits)]
        if kept[0] == "walk" and fin.min() < fin.max() and len(kept[1]) < fin.size:
            assert _core()._bucket_top_p_selections() == before + 4
    want = plain_probabilities(logits, t, 0, top_p, 0.0)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("kind", ["flat", "peaked"])
@pytest.mark.parametrize("t, top_p", [(100.0, 0.9), (100.0, 0.5), (7.0, 0.9), (100.0, 0.99)])
def test_sampler_bucket_branch_at_its_default_threshold(kind, t, top_p):
    # The bench's rows at the default threshold (at least 40,000 kept tokens: the branch runs,
    # decided by top_p * total at T 100, by the estimate from the top-p weight threshold at T 7).
    logits = _vocab_logits(11, 129_280, kind)
    assert _core()._bucket_top_p_min_kept() == 40000.0
    before = _core()._bucket_top_p_selections()
    for draw in range(4):
        a, b = Rng(draw), Rng(draw)
        assert sample(logits, t, 0, top_p, 0.0, a) == plain_sample(logits, t, 0, top_p, 0.0, b)
        assert a.state == b.state
    got, want = probabilities(logits, t, 0, top_p, 0.0), plain_probabilities(logits, t, 0, top_p, 0.0)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert _core()._bucket_top_p_selections() == before + 5   # every call took the branch


@pytest.mark.parametrize("kind", ["flat", "peaked", "nonfinite", "ties"])
def test_sampler_bucket_branch_with_two_sampler_threads(kind):
    # With two sampler threads the total's approximate weights come from the pool's pass
    # (binade_sum_avx512.cpp, total_parallel): the bucket branch reads them the same way.
    from ds4.sampling import set_sampler_threads

    logits = _vocab_logits(5, 129_280, kind)
    set_sampler_threads(2)
    try:
        with _BucketsAlways():
            before = _core()._bucket_top_p_selections()
            for t, top_p in ((100.0, 0.9), (3.0, 0.95), (1.0, 0.5)):
                for draw in range(2):
                    a, b = Rng(draw), Rng(draw)
                    assert sample(logits, t, 0, top_p, 0.0, a) == plain_sample(logits, t, 0, top_p, 0.0, b)
                    assert a.state == b.state
            assert _core()._bucket_top_p_selections() == before + 6
    finally:
        set_sampler_threads(1)


# ---- the fourth round of issue 14: a certified exponential, reciprocal arguments at T != 1 -------


def _exp_weights_match_scalar_on(name: str, count: int) -> None:
    """exp_weights bit for bit the scalar evaluation on tests/data/<name> (hex float bits, one a
    line, ``count`` of them), each argument filling a whole vector of 8."""
    path = Path(__file__).parent / "data" / name
    bits = np.array([int(line, 16) for line in path.read_text().split()], dtype=np.uint32)
    assert bits.size == count
    x = np.repeat(bits.view(np.float32), 8)
    got, want = _core()._exp_weights(x).view(np.uint32), _scalar_exp_weights(x).view(np.uint32)
    assert np.array_equal(got, want), f"{np.count_nonzero(got != want) // 8} arguments differ"


def test_exp_weights_near_float_midpoints():
    # exp_weights' AVX-512 build takes a cheaper double evaluation wherever it can certify the
    # float rounding (csrc/sampling/exp_certified_avx512.h; docs/sampling.md). These are all 1,040
    # arguments in [-87, 0] whose exact double lies within 2^10 double ulps of a float rounding
    # midpoint, where a certificate too narrow or an evaluation less accurate shows first; each
    # fills a whole vector of 8 (an uncertain neighbour would send the vector to the exact path).
    # Bit for bit the scalar evaluation. Caught (tried): the certificate's window cut from 2^13 to
    # 2^4 ulps (27 of 1,040 differ), a degree-4 polynomial (96), ln2/16's low part dropped (199).
    # (Every float argument in [-105, 0] was checked once: scripts/check_exp_certified.cpp.)
    _exp_weights_match_scalar_on("exp_near_midpoints.txt", 1040)


def test_exp_weights_around_the_certificates_window():
    # The certified evaluation is a degree-4 polynomial within 2^-38.5 of exp(x), so it certifies
    # only lanes at least 2^15 double ulps from a float rounding midpoint (docs/sampling.md,
    # "Seventh round"). These are 3,000 arguments of [-87, 0] whose exact double lies 2^11 to 2^17
    # ulps from one, 500 per binade of that distance (scripts/gen_exp_near_window.cpp): the lanes
    # the certificate decides nearest its edge. Each fills a vector of 8. Bit for bit the scalar
    # evaluation; caught (tried): the window cut to 2^14 ulps (24 of 3,000 differ), Taylor's
    # degree-4 coefficients in place of the fitted ones (151), ln2/16 rounded to 40 bits in the
    # reduction (205).
    _exp_weights_match_scalar_on("exp_near_window.txt", 3000)


def _approximates() -> bool:
    """Whether this build's sums approximate weights (the AVX-512 sampling loops run here)."""
    probe = np.linspace(-10, 0, 1000, dtype=np.float32)
    return not np.array_equal(_core()._approx_exp_weights(probe), _core()._exp_weights(probe))


def _rcp_case(t, kind, seed, n=129_280):
    logits = _vocab_logits(seed, n, kind)
    fin = logits[np.isfinite(logits)]
    return logits, F(fin.max()), F(fin.min())


@pytest.mark.parametrize("t", [100.0, 7.0, 3.0, 1.5, 0.7])
def test_reciprocal_argument_weights_stay_within_their_bound(t):
    # At T != 1 the whole vocabulary's approximate weights take the argument as
    # fl(fl(a - m) * fl(1/t)) instead of fl(fl(a - m) / t) when the arguments span at most 4; the
    # certificate then uses _reciprocal_weight_rel, which must bound approx(x') against the exact
    # weight of the divided argument. Arguments here reach -4, the widest allowed; a span just
    # above it gets 0 (no reciprocal). Measured: up to 0.65 * 2^-20 against a bound of 2 * 2^-20
    # (2^-20 plus 4 * 2^-24 * span, on a 2^-23 grid; the proof's margin: docs/sampling.md).
    core = _core()
    g = np.random.default_rng(int(t * 10))
    m = F(g.normal(0, 3))
    span = F(3.99 * t)
    a = np.concatenate([m - g.uniform(0, 1, 400_000) * span, m - (1 - g.uniform(0, 1e-3, 100_000)) * span,
                        [m, m - span]]).astype(np.float32)
    lowest = F(a.min())
    rel = core._reciprocal_weight_rel(m, F(t), lowest)
    if not _approximates():
        assert rel == 0   # a build without the AVX-512 sampling loops: no approximations, no reciprocal
        return
    assert 0 < rel <= 2.25 * core._approx_weight_rel()
    assert core._reciprocal_weight_rel(m, F(t), F(m - 4.01 * t)) == 0
    assert core._reciprocal_weight_rel(m, F(1), lowest) == 0
    d = (a - m).astype(np.float32)
    x_exact = (d / F(t)).astype(np.float32)
    x_rcp = (d * (F(1) / F(t))).astype(np.float32)
    exact = core._exp_weights(x_exact).astype(np.float64)
    err = np.abs(core._approx_exp_weights(x_rcp).astype(np.float64) - exact) / exact
    assert err.max() <= rel
    assert err.max() > 0.5 * core._approx_weight_rel()


@pytest.mark.parametrize("kind", ["flat", "peaked", "heavy", "nonfinite", "denormal", "ties"])
@pytest.mark.parametrize("t", [100.0, 7.0, 1.5])
def test_reciprocal_total_and_walk_are_the_plain_loops(kind, t):
    # The whole vocabulary's total and walk with reciprocal-argument approximations return the
    # plain loops' values over the exact weights of the divided arguments, bit for bit; with rel 0
    # (a span too wide) they divide. A certificate too narrow for those approximations (2^-26)
    # does give a different total on T 100's flat logits: the comparison can see the difference.
    core = _core()
    seed = 1400 + int(t)
    logits, m, lowest = _rcp_case(t, kind, seed)
    rel = core._reciprocal_weight_rel(m, F(t), lowest)
    d = (logits - m).astype(np.float32)
    x = np.where(np.isfinite(logits), (d / F(t)).astype(np.float32), -np.inf).astype(np.float32)
    w = core._exp_weights(x)
    total = _plain_sum(w)
    assert _f32_bits_equal(core._binade_logit_total_rcp(logits, m, F(t), lowest, rel), total), (kind, t, rel)
    g = np.random.default_rng(seed)
    for r in (F(1e-30), F(g.random()) * total, F(g.random()) * total, total, F(g.random() * 1e-3) * total):
        run = np.cumsum(np.concatenate([[F(r)], -w]).astype(np.float32), dtype=np.float32)[1:]
        hit = np.flatnonzero(run <= 0)
        assert core._binade_logit_walk_rcp(logits, m, F(t), lowest, rel, F(r)) == (int(hit[0]) if hit.size else -1)
    if kind == "flat" and t == 100.0 and _approximates():
        assert rel > 0
        assert not _f32_bits_equal(core._binade_logit_total_rcp(logits, m, F(t), lowest, F(2.0**-26)), total)


def test_reciprocal_total_divides_for_exact_weights():
    # Only the approximations take the reciprocal: a term the certificate leaves open, and the
    # plain loop of a short tail, use the exact weight of the divided argument. Two-token
    # vocabularies run entirely through that path, and their sums see a one-ulp change of the
    # second weight half the time. Caught (tried): exact weights of the reciprocal argument.
    core = _core()
    g = np.random.default_rng(33)
    for t in (100.0, 7.0):
        diffs = 0
        for l in (g.uniform(-3, 0, 1500) * t).astype(np.float32):
            logits = np.array([0.0, l], dtype=np.float32)
            rel = core._reciprocal_weight_rel(F(0), F(t), F(l))
            x = np.array([0.0, l / F(t)], dtype=np.float32)
            diffs += not _f32_bits_equal(core._binade_logit_total_rcp(logits, F(0), F(t), F(l), rel),
                                         _plain_sum(core._exp_weights(x)))
        assert diffs == 0, (t, diffs)


@pytest.mark.parametrize("shape", ["overflowing_range", "subnormal_range", "two_finite", "huge_and_tiny"])
def test_sampler_bucket_branch_at_extreme_ranges(shape):
    # Logit ranges the bucket index must survive: hi - lo overflowing (not bucketed: the sorted
    # path), a range of subnormals (the scale clamped to the largest float), two finite logits
    # among -inf/NaN, and logits far apart with near-equal ones in between.
    g = np.random.default_rng(9)
    n = 20_000
    if shape == "overflowing_range":
        logits = g.normal(0, 3, n).astype(np.float32)
        logits[[5, 77]] = [3e38, -3e38]
    elif shape == "subnormal_range":
        logits = (g.integers(-40, 40, n) * np.float32(1e-45)).astype(np.float32)
    elif shape == "two_finite":
        logits = np.full(n, -np.inf, dtype=np.float32)
        logits[g.random(n) < 0.3] = np.nan
        logits[[10, 12000]] = [1.0, 0.5]
    else:
        logits = g.normal(0, 1e-3, n).astype(np.float32)
        logits[[3, 4]] = [1e30, -1e30]
    with _BucketsAlways(), np.errstate(over="ignore"):   # (-3e38 - 3e38 is -inf, in numpy as in fl)
        for t, top_p in ((100.0, 0.9), (1.0, 0.5), (1e30, 0.99)):
            for draw in range(3):
                a, b = Rng(draw), Rng(draw)
                assert sample(logits, t, 0, top_p, 0.0, a) == plain_sample(logits, t, 0, top_p, 0.0, b)
                assert a.state == b.state
            got = probabilities(logits, t, 0, top_p, 0.0)
            want = plain_probabilities(logits, t, 0, top_p, 0.0)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 4000), st.sampled_from([1e-30, 1e-6, 1e-3, 0.05, 1.0, 3.0, 1e3, 1e30]),
       st.sampled_from(["normal", "ties", "positive", "nonfinite"]))
def test_radix_sort_is_the_sorted_order(seed, m, scale, kind):
    # The sorted branches' order (logit descending, equal logits by id ascending; -0.0 equals 0.0)
    # from the radix sort, whatever number of digits and passes the list's length and key span
    # choose (docs/sampling.md, "Fifth round"): lengths up to 4000 and spans from a few to 2^32 key
    # values. (The digit width cannot change the order: the passes run until the key's bits are
    # covered. Caught, tried: the last digit's pass dropped, which this test and the next fail.)
    g = np.random.default_rng(seed)
    x = g.normal(0, 1, m) * scale
    if kind == "ties":
        x = np.round(x / scale * 4) * scale / 4
    elif kind == "positive":
        x = 10 + np.abs(x)
    elif kind == "nonfinite":
        u = g.random(m)
        x[u < 0.1] = -np.inf
        x[(u >= 0.1) & (u < 0.15)] = np.nan
    x = x.astype(np.float32)
    got = _core()._sorted_finite_ids(x)
    ids = np.flatnonzero(np.isfinite(x))
    want = ids[np.lexsort((ids, -(x[ids].astype(np.float64) + 0.0)))]
    assert np.array_equal(got, want), (m, scale, kind)


@pytest.mark.parametrize("m", [96, 200, 700, 1500, 3000, 7000])
def test_radix_sort_over_every_key_span(m):
    # Spans of the keys from a few bits to 32 (logits on one side of 0 over 1e-5 .. 1e3, and both
    # sides), so every digit split the sort can choose runs, at lengths around its switch points.
    g = np.random.default_rng(m)
    for lo, span in [(10, 1e-5), (10, 1e-3), (10, 0.05), (10, 1.0), (10, 3.0), (10, 30.0), (1000, 1e3),
                     (-1, 2.0), (1e-30, 1e-25)]:
        x = (lo + g.random(m) * span).astype(np.float32)
        x[g.integers(0, m, m // 10)] = x[0]   # ties
        got = _core()._sorted_finite_ids(x)
        want = np.lexsort((np.arange(m), -(x.astype(np.float64) + 0.0)))
        assert np.array_equal(got, want), (m, lo, span)
