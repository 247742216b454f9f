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
