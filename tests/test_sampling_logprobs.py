"""Log-probabilities in the core (csrc/sampling/logprobs*, docs/sampling.md "Log-probabilities").

The log-sum-exp is not computed in upstream's order, so it is checked against its stated bound
(logprobs.h): lse within kLogprobSumRel + 2u ln(S) + u |lse| of M + ln(exact S), u = 2^-53. The
reference sums math.exp over the same double differences with math.fsum (glibc's exp errs by less
than one ulp, at most 2u relative; fsum rounds once: S_ref within 3u) and takes ln(S_ref) in
Decimal (40 digits, no further error that matters). A float32 logprob must then be the float the
reference's value rounds to, except where that value lies within the two bounds (plus the
roundings of forming the difference) of a float32 rounding midpoint: those cases are counted, and a
deliberate lse error of 2^-30 relative must be caught. The top k must equal the numpy
implementation's ids (ds4.reference.logprobs, python/ds4/reference/logprobs.py) exactly; every check runs on each SIMD path.
"""

from __future__ import annotations

import math
import threading
from decimal import Decimal, getcontext

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ds4._core as core
from ds4.reference import logprobs as numpy_ref
from ds4.errors import InvalidArgumentError
from ds4.sampling import TokenLogprob, log_softmax, token_and_top_logprobs, token_logprob, top_logprobs
from test_kernels_matvec import simd_path

F = np.float32
U = 2.0 ** -53
TERM_REL, SUM_REL = core._logprob_bounds()
PATHS = list(core.simd_paths())   # each has its build (logprobs_{generic,avx2,avx512,neon}.cpp)
N_VOCAB = 129280

getcontext().prec = 40


# ---- the reference and the float32 check ------------------------------------------------------


def _reference(a: np.ndarray):
    """(lse as a Decimal, S_ref) from math.exp + math.fsum over the finite logits."""
    fin = a[np.isfinite(a)].astype(np.float64)
    m = float(fin.max())
    s = math.fsum(math.exp(x) for x in (fin - m).tolist())   # the core's differences, bit for bit
    return Decimal(m) + Decimal(s).ln(), s


def _lse_bound(lse: float, s: float) -> float:
    """logprobs.h's bound on the core's lse, plus the reference's 3u."""
    return SUM_REL + 2 * U * math.log(s) + U * abs(lse) + 3.01 * U


def _check_float32(a: np.ndarray, ids, got, ref_lse: Decimal, s: float, lse: float):
    """(count of reference values within the window of a float32 midpoint, [(id, got, want)] that
    differ outside it). ``got``: float32 logprobs of the finite logits ``a[ids]``."""
    ids = np.asarray(ids, dtype=np.int64)
    got = np.asarray(got, dtype=F)
    hi = float(ref_lse)
    lo = float(ref_lse - Decimal(hi))
    l64 = a[ids].astype(np.float64)
    x = (l64 - hi) - lo   # the reference value, two roundings from the exact difference
    # the core's error (lse bound + rounding its difference) and the reference's (3u + its roundings)
    w = _lse_bound(lse, s) + U * np.abs(x) + U * np.abs(l64 - hi) + U * np.abs(x) + 2.0 ** -100
    with np.errstate(over="ignore"):   # beyond float32: -inf, as the core's cast
        want = x.astype(F)
    up = (want.astype(np.float64) + np.nextafter(want, F(np.inf)).astype(np.float64)) / 2
    dn = (want.astype(np.float64) + np.nextafter(want, F(-np.inf)).astype(np.float64)) / 2
    near = np.minimum(np.abs(x - up), np.abs(x - dn)) <= w
    bad = [(int(i), float(g), float(t)) for i, g, t, nr in zip(ids, got, want, near) if g != t and not nr]
    return int(np.count_nonzero(near)), bad


def _float32_logprobs(a: np.ndarray, lse: float) -> np.ndarray:
    """(float)((double)l - lse) for every logit, as the core forms it."""
    with np.errstate(over="ignore"):
        return (a.astype(np.float64) - lse).astype(F)


# ---- the per-term exponential ----------------------------------------------------------------


def _exp_args(n: int, seed: int) -> np.ndarray:
    g = np.random.default_rng(seed)
    ln2_16 = math.log(2) / 16
    k = g.integers(-13000, 1, n // 4)
    return np.concatenate([
        -g.uniform(0, 600, n // 4), -g.uniform(0, 1, n // 4), -g.exponential(5, n // 4),
        k * ln2_16 + g.uniform(-1e-12, 1e-12, k.size),   # the reduction's edges (|r| near 0 and ln2/32)
        (k - 0.5) * ln2_16, [0.0, -0.0, -600.0, -1e-300, -5e-324, -ln2_16 / 2]]).clip(-600, 0)


@pytest.mark.parametrize("path", PATHS)
def test_exp_term_within_bound(path):
    d = _exp_args(4000, 3)
    with simd_path(path):
        got = core._logprob_exp(d)
    worst = max(abs((Decimal(float(g)) - Decimal(float(x)).exp()) / Decimal(float(x)).exp())
                for g, x in zip(got, d))
    assert float(worst) <= TERM_REL, f"{path}: {float(worst) / U:.3f} u"


# ---- the log-sum-exp and the float32 logprobs over the whole vocabulary -----------------------


def _vocab(kind: str, seed: int = 0) -> np.ndarray:
    g = np.random.default_rng(seed)
    if kind == "peaked":   # bench/sampling.py's language-model shape
        base = g.normal(0, 2, N_VOCAB)
        base[g.choice(N_VOCAB, 40, replace=False)] += g.uniform(6, 14, 40)
        return base.astype(F)
    if kind == "flat":
        return g.normal(0, 3, N_VOCAB).astype(F)
    if kind == "equal":
        return np.full(N_VOCAB, 1.5, dtype=F)
    if kind == "wide":     # beyond the clamp (-600) and across many binades
        return g.uniform(-2000, 40, N_VOCAB).astype(F)
    if kind == "specials":  # NaN and +-inf never count
        a = g.normal(3, 4, N_VOCAB).astype(F)
        idx = g.choice(N_VOCAB, 3000, replace=False)
        a[idx[:1000]], a[idx[1000:2000]], a[idx[2000:]] = np.nan, np.inf, -np.inf
        return a
    if kind == "large":    # |lse| ~ 1e4: its own rounding dominates the bound
        return (1e4 + g.normal(0, 3, N_VOCAB)).astype(F)
    if kind == "odd":      # a length that is no multiple of the vector steps
        return g.normal(-5, 6, N_VOCAB - 37).astype(F)
    raise ValueError(kind)


KINDS = ["peaked", "flat", "equal", "wide", "specials", "large", "odd"]


@pytest.mark.parametrize("kind", KINDS)
def test_sum_within_bound(kind):
    """The compensated sum alone, to its own (tighter) bound: kLogprobSumRel plus the reference's 3u."""
    a = _vocab(kind)
    _, s = _reference(a)
    for path in PATHS:
        with simd_path(path):
            got = core._logprob_sum(a)
        assert abs(got - s) <= (SUM_REL + 3.01 * U) * s, (path, (got - s) / s / U)


@pytest.mark.parametrize("kind", KINDS)
def test_lse_and_float32_logprobs_against_reference(kind):
    a = _vocab(kind)
    ref, s = _reference(a)
    fin = np.flatnonzero(np.isfinite(a))
    for path in PATHS:
        with simd_path(path):
            lse = core._logsumexp(a)
            lse_top, top, tok = core.top_logprobs(a, 20, int(fin[7]))
        assert lse_top == lse
        assert abs(Decimal(lse) - ref) <= Decimal(_lse_bound(lse, s)), (path, float(Decimal(lse) - ref) / U)
        every = _float32_logprobs(a[fin], lse)
        near, bad = _check_float32(a, fin, every, ref, s, lse)
        assert not bad, (path, len(bad), bad[:5])
        assert near < max(10, fin.size // 1000), (path, near)   # the window is narrow
        # the core's own float32 values are that formula's
        assert [p for _, _, p in top] == [float(x) for x in _float32_logprobs(a[[i for i, _, _ in top]], lse)]
        assert tok == float(_float32_logprobs(a[fin[7:8]], lse)[0])
        # a perturbation of 2^-30 relative in lse is caught (it moves each value by ~1/64 of a float32
        # step, so it needs many distinct values to flip some; "equal" has one)
        if abs(lse) >= 1 and np.unique(a[fin]).size > 1000:
            _, caught = _check_float32(a, fin, _float32_logprobs(a[fin], lse * (1 + 2.0 ** -30)), ref, s, lse)
            assert len(caught) > 0


def test_float32_check_counts_midpoints():
    """Over whole vocabularies every core value equals the reference's float32 (`not bad`), and the
    midpoint exemption stays rare: the window is so narrow that on these seeds no value falls in it
    (0 of 387,840 here), so the equality above covers every value."""
    total = 0
    for seed in range(3):
        a = np.random.default_rng(seed).normal(0, 2, N_VOCAB).astype(F)
        ref, s = _reference(a)
        lse = core._logsumexp(a)
        near, bad = _check_float32(a, np.arange(a.size), _float32_logprobs(a, lse), ref, s, lse)
        assert not bad
        total += near
    assert total < 50   # at most ~1e-4 of 387,840 values may be exempted


# ---- the top k against numpy -----------------------------------------------------------------

POOL = [0.0, -0.0, 1.0, -1.0, 0.5, 2.5, -3.25, 1e-40, 3.0e38, -3.0e38, np.inf, -np.inf, np.nan, 7.0, -7.0,
        1.0000001, 0.99999994]

small = st.one_of(
    st.lists(st.sampled_from(POOL), min_size=1, max_size=40),
    st.lists(st.floats(-50, 50, width=32) | st.sampled_from(POOL), min_size=1, max_size=600),
    st.integers(1, 700).flatmap(lambda n: st.lists(st.just(2.5), min_size=n, max_size=n)),   # all equal
).map(lambda v: np.array(v, dtype=F))


def _same_as_numpy(a: np.ndarray, k: int, path: str):
    with simd_path(path):
        lse, top, _ = core.top_logprobs(a, k, -1)
    want = numpy_ref.top_ids(a, k)
    assert [i for i, _, _ in top] == want, (path, k)
    if lse is None:
        assert not np.isfinite(a).any() and top == []
        return
    assert [v for _, v, _ in top] == [float(a[i]) for i in want]
    if a.size <= 600:
        ref, s = _reference(a)
        assert abs(Decimal(lse) - ref) <= Decimal(_lse_bound(lse, s))
        _, bad = _check_float32(a, want, [p for _, _, p in top], ref, s, lse)
        assert not bad


@settings(max_examples=300, deadline=None)
@given(a=small, k=st.integers(1, 20) | st.integers(21, 800))
def test_top_k_equals_numpy_small(a, k):
    for path in PATHS:
        _same_as_numpy(a, k, path)


def _big(seed: int, shape: str) -> np.ndarray:
    g = np.random.default_rng(seed)
    if shape == "ties":        # few distinct values: ties at the floor
        return g.integers(-20, 5, N_VOCAB).astype(F)
    if shape == "sorted":      # ascending: the top is all in the last block
        return np.sort(g.normal(0, 3, N_VOCAB)).astype(F)
    if shape == "sparse":      # mostly -inf: fewer finite blocks than k
        a = np.full(N_VOCAB, -np.inf, dtype=F)
        a[g.choice(N_VOCAB, 15, replace=False)] = g.normal(0, 1, 15)
        return a
    if shape == "poisoned":    # NaN and +inf above every finite logit
        a = g.normal(0, 3, N_VOCAB).astype(F)
        a[g.choice(N_VOCAB, 500, replace=False)] = np.nan
        a[g.choice(N_VOCAB, 500, replace=False)] = np.inf
        return a
    if shape == "equal":
        return np.full(N_VOCAB, -0.0, dtype=F)
    return g.normal(0, 2, N_VOCAB).astype(F)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), shape=st.sampled_from(["ties", "sorted", "sparse", "poisoned", "equal", "normal"]),
       k=st.integers(1, 20) | st.sampled_from([128, 600, 5000]))
def test_top_k_equals_numpy_whole_vocabulary(seed, shape, k):
    a = _big(seed, shape)
    for path in PATHS:
        _same_as_numpy(a, k, path)


# ---- the Python API --------------------------------------------------------------------------


def test_api_values_are_the_cores():
    a = _vocab("specials")
    lse = core._logsumexp(a)
    fin = np.flatnonzero(np.isfinite(a))
    chosen, tops = token_and_top_logprobs(a, int(fin[3]), 20)
    assert tops == top_logprobs(a, 20)
    assert chosen == token_logprob(a, int(fin[3]))
    assert chosen.logprob == float(_float32_logprobs(a[fin[3:4]], lse)[0])
    assert all(isinstance(t, TokenLogprob) for t in tops) and len(tops) == 20
    assert [t.id for t in tops] == numpy_ref.top_ids(a, 20)
    ls = log_softmax(a)
    assert np.array_equal(ls[fin], a[fin].astype(np.float64) - lse)
    assert np.all(ls[~np.isfinite(a)] == -np.inf)


def test_api_edges():
    a = np.array([1.0, np.nan, np.inf, -np.inf, 0.5], dtype=F)
    for bad in (1, 2, 3):   # a token whose logit is not finite: upstream's -1e30
        assert token_logprob(a, bad).logprob == -1.0e30
        assert token_and_top_logprobs(a, bad, 3)[0].logprob == -1.0e30
    assert [t.id for t in top_logprobs(a, 10)] == [0, 4]   # fewer than k finite: fewer entries
    assert top_logprobs(a, 0) == [] and top_logprobs(a, -3) == []
    assert token_and_top_logprobs(a, 0, 0)[1] == [] and token_and_top_logprobs(a, 0, -1)[1] == []
    none = np.array([np.nan, -np.inf, np.inf], dtype=F)
    assert top_logprobs(none, 5) == []
    assert np.all(log_softmax(none) == -np.inf)
    for call in (lambda: token_logprob(none, 0), lambda: token_and_top_logprobs(none, 0, 5)):
        with pytest.raises(InvalidArgumentError, match="finite"):
            call()
    for call in (lambda: token_logprob(a, 5), lambda: token_logprob(a, -1), lambda: token_and_top_logprobs(a, 5, 2)):
        with pytest.raises(InvalidArgumentError, match="out of range"):
            call()
    for bad in (np.zeros((2, 3), F), np.zeros(0, F)):
        for call in (lambda: top_logprobs(bad, 2), lambda: token_logprob(bad, 0), lambda: log_softmax(bad),
                     lambda: token_and_top_logprobs(bad, 0, 2)):
            with pytest.raises(InvalidArgumentError, match="1-D"):
                call()
    # other dtypes are converted (float64 logits, as the perplexity rows are)
    assert top_logprobs(np.array([0.0, 2.0, 1.0]), 2) == top_logprobs(np.array([0.0, 2.0, 1.0], F), 2)
    assert top_logprobs(a, 10**12) == top_logprobs(a, 2)


def test_threads_share_nothing():
    """Each thread has its own scratch; calls release the GIL, so they may overlap."""
    arrays = [_vocab(k, 1) for k in ("peaked", "flat", "specials", "wide")]
    want = [(core._logsumexp(a), top_logprobs(a, 20)) for a in arrays]
    errors = []

    def work(j):
        for _ in range(20):
            a = arrays[j % len(arrays)]
            if (core._logsumexp(a), top_logprobs(a, 20)) != want[j % len(arrays)]:
                errors.append(j)

    threads = [threading.Thread(target=work, args=(j,)) for j in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
