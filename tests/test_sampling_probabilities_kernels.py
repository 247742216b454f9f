"""probabilities()' whole-vocabulary kernels against numpy, on every SIMD path (docs/sampling.md, "Ninth round").

* `exp_weights_of_logits` evaluates the exact weights straight from the logits, the argument
  fl(fl(a - m) / t) (-inf for a non-finite logit) taken inside the exponential's loop: bit for bit
  `exp_weights` of `shifted_args`, and the scalar transcription of exp_weights.inc.
* `scale_weights` is each weight over the total, float(double(w) * inv): bit for bit numpy's double
  product rounded to float, in place (as probabilities() runs it) or not, for every tail length of
  the vector loop.

Both vector builds handle 8 entries per step and leave n % 8 to a tail, so the lengths cover every
remainder.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ds4._core as core
from test_kernels_matvec import simd_path
from test_sampling import _scalar_exp_weights

F = np.float32
PATHS = [p for p in core.simd_paths() if p != "neon"]
SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, 2.5, -3.25, 1e-40, -1e-40, 7.0, -7.0, 1.0000001, 0.99999994,
           -30.0, -87.5, -104.9, -110.0, -1e30]
NONFINITE = [np.inf, -np.inf, np.nan]


def _shifted(a, m, t):
    """fl(fl(a - m) / t) in float32 (dividing by 1 is exact), -inf where a is not finite."""
    with np.errstate(invalid="ignore", over="ignore"):
        x = (a - F(m)).astype(F)
        if t != 1.0:
            x = (x / F(t)).astype(F)
    return np.where(np.isfinite(a), x, F(-np.inf)).astype(F)


def _bits(v):
    return np.asarray(v, dtype=F).view(np.uint32)


def _logit_arrays(finite: bool):
    pool = SPECIAL if finite else SPECIAL + NONFINITE
    short = st.lists(st.sampled_from(pool), min_size=0, max_size=40)
    normal = st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 300), st.sampled_from([0.5, 3.0, 30.0]))
    return st.one_of(short.map(lambda v: np.array(v, dtype=F)),
                     normal.map(lambda s: (np.random.default_rng(s[0]).normal(0, s[2], s[1])).astype(F)))


def _check_weights_of_logits(a, t, all_finite):
    fin = a[np.isfinite(a)]
    m = float(fin.max()) if fin.size else 0.0
    want = _scalar_exp_weights(_shifted(a, m, t))
    for path in PATHS:
        with simd_path(path):
            got = core._exp_weights_of_logits(a, m, t, all_finite)
            via_args = core._exp_weights(core._shifted_args(a, m, t)[0])
        assert np.array_equal(_bits(got), _bits(want)), (path, a[_bits(got) != _bits(want)][:4], t)
        assert np.array_equal(_bits(got), _bits(via_args)), path


@settings(max_examples=120, deadline=None)
@given(a=_logit_arrays(finite=True), t=st.sampled_from([1.0, 0.7, 3.0, 100.0, 0.05]))
def test_exp_weights_of_finite_logits(a, t):
    _check_weights_of_logits(a, t, all_finite=True)


@settings(max_examples=120, deadline=None)
@given(a=_logit_arrays(finite=False), t=st.sampled_from([1.0, 0.7, 100.0]))
def test_exp_weights_of_logits_with_nonfinite_entries(a, t):
    _check_weights_of_logits(a, t, all_finite=bool(np.isfinite(a).all()))


@pytest.mark.parametrize("t", [1.0, 0.7, 100.0])
def test_exp_weights_of_logits_over_a_vocabulary(t):
    # A length with a tail of 5, arguments over the whole exponential's range (the certified and the
    # exact evaluations, the zero weights below -105) and a sprinkle of non-finite logits.
    g = np.random.default_rng(9)
    a = np.concatenate([g.normal(0, 3, 60_000), g.uniform(-120 * t, 0, 9_005)]).astype(F)
    a[g.choice(a.size, 50, replace=False)] = g.choice(NONFINITE, 50)
    assert a.size % 8 == 5
    _check_weights_of_logits(a, t, all_finite=False)
    fin = a[np.isfinite(a)]
    _check_weights_of_logits(fin[: fin.size // 8 * 8 + 3], t, all_finite=True)


def _scaled(w, inv):
    return (np.asarray(w, dtype=F).astype(np.float64) * np.float64(inv)).astype(F)


WEIGHTS = [0.0, 1.0, 0.5, 0.75, 1e-45, 1.2e-38, 3e-39, 0.99999994, 2.0**-20, 0.3, 0.1]


@settings(max_examples=150, deadline=None)
@given(w=st.lists(st.sampled_from(WEIGHTS) | st.floats(0, 1, width=32), min_size=0, max_size=40),
       total=st.sampled_from([1.0, 3.0, 26.123, 129_280.0, 0.75, 1e-30, 7.0e37]), in_place=st.booleans())
def test_scale_weights_is_the_double_product(w, total, in_place):
    w = np.array(w, dtype=F)
    inv = 1.0 / float(F(total))
    for path in PATHS:
        with simd_path(path):
            got = core._scale_weights(w, inv, in_place)
        assert np.array_equal(_bits(got), _bits(_scaled(w, inv))), (path, w, total)


@pytest.mark.parametrize("total", [1.0, 3.0, 26.123457, 129_280.0])
def test_scale_weights_over_a_whole_binade(total):
    # Every float in [0.5, 1) and a sample of every binade below, in place, against numpy: the
    # double product's rounding to float is taken on every mantissa, including the ones whose
    # product lies nearest a float rounding midpoint.
    g = np.random.default_rng(3)
    w = np.concatenate([np.arange(0x3F000000, 0x3F800000, dtype=np.uint32).view(F),
                        g.integers(0, 0x3F800000, 200_003, dtype=np.uint32).view(F)])
    inv = 1.0 / float(F(total))
    got = core._scale_weights(w, inv, True)
    want = _scaled(w, inv)
    assert np.array_equal(_bits(got), _bits(want)), f"{np.count_nonzero(_bits(got) != _bits(want))} differ"


def _plain_sum_from(s, w):
    """s = fl(s + w[i]) in order, from the s given."""
    return np.cumsum(np.concatenate([[F(s)], np.asarray(w, dtype=F)]), dtype=F)[-1]


@pytest.mark.parametrize("kind", ["flat", "peaked", "equal", "halves", "tiny"])
def test_binade_seq_sum_from_carried_over_pieces(kind):
    # probabilities() sums the whole vocabulary's exact weights piece by piece, the running sum
    # carried from one call to the next: every piece boundary, and the one-call sum, must be the
    # plain loop's. Weights of the kinds that make the binade sums take their other paths: binade
    # crossings early in a sum, exact half-unit ties (2^-24 after a 1), runs of equal weights, and
    # weights so small the sum stays below the model's range for a while.
    g = np.random.default_rng(len(kind))
    n = 20_000
    if kind == "flat":
        w = np.exp(g.normal(0, 3, n) - 13.0)
    elif kind == "peaked":
        x = g.normal(0, 2, n)
        x[g.choice(n, 40, replace=False)] += g.uniform(6, 14, 40)
        w = np.exp(x - x.max())
    elif kind == "equal":
        w = np.ones(n)
    elif kind == "halves":
        w = np.full(n, 2.0**-24)
        w[::1000] = 1.0
    else:
        w = np.exp(g.uniform(-100, -60, n))
    w = w.astype(F)
    cuts = np.sort(np.concatenate([[0, n], g.integers(0, n, 12), np.arange(0, n, 2048)]))
    for start in (0.0, 1.5, 3e-20, float(F(2**24 - 3) * F(2.0**-20))):
        s, want = F(start), F(start)
        for a, b in zip(cuts[:-1], cuts[1:]):
            s = F(core._binade_seq_sum_from(w[a:b], s))
            want = _plain_sum_from(want, w[a:b])
            assert s.view(np.uint32) == want.view(np.uint32), (kind, start, a, b)
        assert F(core._binade_seq_sum_from(w, F(start))).view(np.uint32) == _plain_sum_from(start, w).view(np.uint32)


@pytest.mark.parametrize("below", [1, 2, 37, 126, 127, 128, 200])
def test_binade_seq_sum_from_at_the_top_of_a_binade(below):
    # A carried sum `below` units under 2^24 of its unit, then 256 terms of 0.75 and 1.25 units (one
    # unit each), the first chunk of 128 ending in 0.75, 1.25: the unit count may not reach 2^24
    # (there the grid doubles and the terms' order decides the rounding). The whole-chunk loop
    # carries the count as an integer and must stop below that top: at below = 127 the first chunk
    # counts 2^24 + 1 units where the plain loop ends at 2^24 + 2.
    g = np.random.default_rng(below)
    w = np.where(g.random(256) < 0.5, 0.75, 1.25).astype(F)
    w[126:128] = (0.75, 1.25)
    for u in (F(1.0), F(2.0**-30)):
        s = F(2**24 - below) * u
        got = F(core._binade_seq_sum_from((w * u).astype(F), s))
        assert got.view(np.uint32) == _plain_sum_from(s, (w * u).astype(F)).view(np.uint32)


@pytest.mark.parametrize("above", [127, 128, 129, 300])
def test_binade_seq_walk_at_the_floor_of_a_binade(above):
    # A walk from 2^23 + `above` units over 127 terms of one unit and one of 1.4, then a term of
    # 2^23 - 0.5 units: the whole-chunk loop may take a chunk only while r stays above 2^23 units
    # after it (below 2^23 the grid is finer). At above = 128 the chunk's count lands on 2^23 while
    # the plain walk is at 2^23 - 0.5, which the next term then takes exactly to 0.
    w = np.concatenate([np.ones(127), [1.4, 2**23 - 0.5], np.ones(200)]).astype(F)
    for u in (F(1.0), F(2.0**-30)):
        r = F(2**23 + above) * u
        ws = (w * u).astype(F)
        run = np.cumsum(np.concatenate([[r], -ws]), dtype=F)[1:]
        hit = np.flatnonzero(run <= 0)
        want = int(hit[0]) if hit.size else -1
        assert core._binade_seq_walk(ws, r) == want, (above, u)
