"""The sampler's whole-vocabulary scans (csrc/sampling/scan*.cpp) against numpy, on every SIMD path.

The vector builds handle 16 entries per step and hand the last n % 16 to the scalar loops, so these
tests draw short arrays (0..70 entries: empty, tail only, whole vectors plus every tail length) from a
small pool of values. The pool makes the edge cases common: entries exactly at the floor / the tie
value (the comparisons are >= and == there, > for "above"), ±inf, NaN, negative zero and subnormals.
Every function but `mass_in` (an estimate summed in another order by the vector build) must equal
numpy's result exactly; docs/sampling.md says what each one is for.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ds4._core as core
from test_kernels_matvec import simd_path

F = np.float32
PATHS = [p for p in core.simd_paths() if p != "neon"]
POOL = [0.0, -0.0, 1.0, -1.0, 0.5, 2.5, -3.25, 1e-40, -1e-40, 3.0e38, -3.0e38,
        np.inf, -np.inf, np.nan, 7.0, -7.0, 1.0000001, 0.99999994]


arrays = st.one_of(st.lists(st.sampled_from(POOL), min_size=0, max_size=20),
                   st.lists(st.sampled_from(POOL), min_size=16, max_size=70)).map(lambda v: np.array(v, dtype=F))
probe = st.sampled_from([x for x in POOL if np.isfinite(x)])


def _ids(mask):
    return np.flatnonzero(mask).astype(np.int32)


@settings(max_examples=150, deadline=None)
@given(a=arrays, floor=probe)
def test_collect_finite_at_least(a, floor):
    want = _ids(np.isfinite(a) & (a >= F(floor)))
    for path in PATHS:
        with simd_path(path):
            ids, vals = core._collect_finite_at_least(a, floor)
        np.testing.assert_array_equal(ids, want, err_msg=path)
        np.testing.assert_array_equal(vals.view(np.uint32), a[want].view(np.uint32), err_msg=path)


@settings(max_examples=150, deadline=None)
@given(a=arrays, v=probe, limit=st.integers(0, 40))
def test_collect_above_and_tied(a, v, limit):
    above = _ids(np.isfinite(a) & (a > F(v)))
    tied = _ids(a == F(v))[:limit]
    for path in PATHS:
        with simd_path(path):
            got_above, vals, got_tied = core._collect_above_and_tied(a, v, limit)
        np.testing.assert_array_equal(got_above, above, err_msg=path)
        np.testing.assert_array_equal(vals.view(np.uint32), a[above].view(np.uint32), err_msg=path)
        np.testing.assert_array_equal(got_tied, tied, err_msg=path)


def test_floor_and_tie_exactly_at_every_position():
    """An entry equal to the floor (kept) or the tie value (tied, not above) at every position of
    the vector part and of each tail length, among just-smaller neighbours that must be left out."""
    below = np.nextafter(F(2.5), F(-np.inf))
    for n in range(1, 48):
        for pos in range(n):
            a = np.full(n, below, dtype=F)
            a[pos] = F(2.5)
            for path in PATHS:
                with simd_path(path):
                    ids, _ = core._collect_finite_at_least(a, 2.5)
                    above, _, tied = core._collect_above_and_tied(a, 2.5, 4)
                assert ids.tolist() == [pos], (path, n, pos)
                assert above.tolist() == [] and tied.tolist() == [pos], (path, n, pos)


@settings(max_examples=150, deadline=None)
@given(a=arrays)
def test_finite_max(a):
    fin = a[np.isfinite(a)]
    want = (F(fin.max()) if fin.size else F(-np.inf), fin.size, F(fin.min()) if fin.size else F(np.inf))
    for path in PATHS:
        with simd_path(path):
            hi, count, lo = core._finite_max(a)
        assert count == want[1], path
        # max/min of -0.0 and 0.0 may return either zero: compare values, and bits otherwise
        assert F(hi) == want[0] and F(lo) == want[2], (path, hi, lo, want)


@settings(max_examples=150, deadline=None)
@given(a=arrays, m=probe, t=st.sampled_from([1.0, 0.8, 100.0, 0.05, 3.0]))
def test_shifted_args(a, m, t):
    fin = np.isfinite(a)
    with np.errstate(all="ignore"):
        want = np.where(fin, (a - F(m)) / F(t), F(-np.inf)).astype(F)
    for path in PATHS:
        with simd_path(path):
            x, count = core._shifted_args(a, m, t)
        assert count == int(fin.sum()), path
        np.testing.assert_array_equal(x.view(np.uint32), want.view(np.uint32), err_msg=path)


weights = st.lists(st.sampled_from([0.0, 1e-40, 0.25, 0.5, 0.75, 1.0, 3.0]), min_size=0, max_size=70)


@settings(max_examples=150, deadline=None)
@given(w=weights.map(lambda v: np.array(v, dtype=F)), total=st.sampled_from([1.0, 3.0, 10.0]),
       bound=st.sampled_from([0.0, 0.05, 0.1, 0.25, 1.0]))
def test_first_ratio_below(w, total, bound):
    with np.errstate(all="ignore"):
        below = np.flatnonzero((w / F(total)) < F(bound))
    below = below[below >= 1]
    want = int(below[0]) if below.size else w.size
    for path in PATHS:
        with simd_path(path):
            assert core._first_ratio_below(w, total, bound) == want, path


@settings(max_examples=150, deadline=None)
@given(w=weights.map(lambda v: np.array(v, dtype=F)), lo=st.sampled_from([0.0, 0.25, 0.5]),
       hi=st.sampled_from([0.5, 1.0, 10.0]), step=st.integers(1, 4))
def test_mass_in(w, lo, hi, step):
    blocks = [w[b:b + 16] for b in range(0, w.size, 16 * step)]
    terms = np.concatenate(blocks) if blocks else np.zeros(0, F)
    terms = terms[(terms >= F(lo)) & (terms < F(hi))].astype(np.float64)
    want = float(terms.sum()) * step
    # the vector build sums each lane in float32: at most 70/16 + 16 rounded adds of 2^-24 each
    tol = 2.0**-20 * float(terms.sum()) * step
    for path in PATHS:
        with simd_path(path):
            got = core._mass_in(w, lo, hi, step)
        assert abs(got - want) <= tol, (path, got, want)


@pytest.mark.parametrize("path", PATHS)
def test_mass_in_catches_a_dropped_tail(path):
    """A tolerance that lets a whole dropped entry through would test nothing: one 0.25 in the
    tail is ~2 % of this mass."""
    w = np.full(20, 0.75, dtype=F)
    w[19] = 0.25
    with simd_path(path):
        got = core._mass_in(w, 0.0, 1.0, 1)
    want = 19 * 0.75 + 0.25
    assert abs(got - want) <= 2.0**-20 * want
    assert abs((got - 0.25) - want) > 2.0**-20 * want


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("step", [1, 2, 3, 4])
def test_mass_in_over_many_blocks(path, step):
    """Long enough for the vector build's four chains (four sampled blocks per iteration) and the
    remainder after them. Quarter-integer weights keep every float32 partial sum exact, so the
    estimate must equal the float64 sum of the sampled blocks: a block read twice or skipped is
    caught (tried: the fourth chain reading the third's block)."""
    g = np.random.default_rng(step)
    for blocks in (4, 5, 7, 16, 23):
        for extra in (0, 5, 15):
            w = g.choice(np.array([0.0, 0.25, 0.5, 1.0, 2.0, 3.75], F), 16 * step * blocks + extra)
            start = 0
            terms = []
            while start + 16 <= w.size:
                terms.append(w[start:start + 16])
                start += 16 * step
            terms.append(w[start:])   # the scalar tail: every entry from there
            terms = np.concatenate(terms)
            want = float(terms[(terms >= 0.5) & (terms < 3.0)].astype(np.float64).sum()) * step
            with simd_path(path):
                got = core._mass_in(w, 0.5, 3.0, step)
            assert got == want, (path, step, blocks, extra, got, want)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(64, 700),
       density=st.sampled_from([0.0, 0.003, 0.03, 0.3, 1.0]))
def test_collect_finite_at_least_over_many_groups(seed, n, density):
    """The vector build tests four vectors (64 entries) per branch and stores all four when any
    passes: long arrays where whole groups pass nothing, a few entries or everything, with inf and
    NaN among them. Caught (tried): the ids not advanced by all 64 over a group that passes nothing."""
    g = np.random.default_rng(seed)
    a = np.where(g.random(n) < density, F(3.0), F(1.0)).astype(F)
    a[g.random(n) < 0.01] = np.nan
    a[g.random(n) < 0.01] = np.inf
    a[g.random(n) < 0.01] = F(2.0)   # exactly at the floor: kept
    want = _ids(np.isfinite(a) & (a >= F(2.0)))
    for path in PATHS:
        with simd_path(path):
            ids, vals = core._collect_finite_at_least(a, 2.0)
        np.testing.assert_array_equal(ids, want, err_msg=path)
        np.testing.assert_array_equal(vals.view(np.uint32), a[want].view(np.uint32), err_msg=path)
