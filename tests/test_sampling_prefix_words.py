"""The top-p prefix's packed words (csrc/sampling/bucket_collect*, docs/sampling.md "Ninth round" and
"Tenth round") against numpy, on every SIMD path.

`collect_prefix` writes, for every finite logit >= floor in ascending order, one 32-bit word: the id in
the low `id_bits` and above it the level trunc(min(fl(fl(hi - v) * scale), 2^fine_bits - 1)). The
AVX-512 loop takes the level of a large vocabulary (id_bits + fine_bits = 32) from an unsigned
truncation of fl(fl(hi - v) * fl(scale 2^id_bits)) that saturates instead of clamping; the words must
be the formula's bit for bit, the clamp's edge included (levels at, just under and far over
2^fine_bits - 1), and the vector build hands its last n % 64 entries to the scalar loop.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ds4._core as core
from ds4.errors import InvalidArgumentError
from test_kernels_matvec import simd_path

F = np.float32
PATHS = [p for p in core.simd_paths() if p != "neon"]
FLT_MAX = float(np.finfo(F).max)


def _words(a, floor, hi, scale, id_bits, fine_bits):
    """The formula in float32 numpy arithmetic (each operation rounded once, as the C++ loops)."""
    a = np.asarray(a, dtype=F)
    with np.errstate(over="ignore", invalid="ignore"):
        keep = np.isfinite(a) & (a >= F(floor))
        ids = np.flatnonzero(keep).astype(np.uint64)
        d = (F(hi) - a[keep]) * F(scale)
        level = np.minimum(d, F(2**fine_bits - 1)).astype(np.uint64)
    return ((level << np.uint64(id_bits)) | ids).astype(np.uint32)


def _check(a, floor, hi, scale, id_bits, fine_bits):
    want = _words(a, floor, hi, scale, id_bits, fine_bits)
    finite = bool(np.all(np.isfinite(a)))
    for path in PATHS:
        for all_finite in ((False, True) if finite else (False,)):
            with simd_path(path):
                got = core._collect_prefix(a, floor, hi, scale, id_bits, fine_bits, all_finite)
            np.testing.assert_array_equal(got, want, err_msg=f"{path} all_finite={all_finite} ids={id_bits} "
                                                             f"fine={fine_bits} scale={scale!r}")


def _grid(n, floor, hi, fine_bits, stretch=1.0):
    """The sampler's grid (Sampler::collect_packed sets prefix_grid_), its scale optionally stretched."""
    with np.errstate(over="ignore", divide="ignore"):
        scale = float(F(2**fine_bits) / (F(hi) - F(floor))) * stretch
    return min(scale, FLT_MAX)


POOL = [0.0, -0.0, 1.0, -1.0, 0.5, 2.5, -3.25, 7.0, -7.0, 1.0000001, 0.99999994, 1e-40, -1e-40, 20.0, -20.0,
        np.inf, -np.inf, np.nan]


VALUE = st.one_of(st.sampled_from(POOL), st.floats(-30, 30, width=32))


# (short lists: the scalar loop alone; long ones: groups of 64 for the vector loop, then a tail)
@settings(max_examples=200, deadline=None)
@given(vals=st.one_of(st.lists(VALUE, max_size=70), st.lists(VALUE, min_size=64, max_size=300)),
       q=st.floats(0.0, 1.0), id_bits=st.integers(1, 24), saturating=st.booleans(),
       stretch=st.sampled_from([1.0, 1.0, 0.5, 3.0, 1e6]))
def test_prefix_words_equal_the_formula(vals, q, id_bits, saturating, stretch):
    a = np.array(vals, dtype=F)
    finite = a[np.isfinite(a)]
    if finite.size == 0:
        return _check(a, 0.0, 0.0, 1.0, 10, 16)
    hi = float(finite.max())
    floor = float(np.quantile(finite, q, method="lower"))
    if not floor < hi:
        floor = float(np.nextafter(F(hi), F(-np.inf)))
    # (levels of at most 16 bits, as the sampler's grids: the word's contract; 32 bits in all for
    # the saturating loop, which needs id_bits >= 16)
    id_bits = max(id_bits, int(np.ceil(np.log2(max(a.size, 2)))))
    fine_bits = 32 - id_bits if saturating and id_bits >= 16 else min(16, 32 - id_bits) - (id_bits % 3)
    _check(a, floor, hi, _grid(a.size, floor, hi, fine_bits, stretch), id_bits, fine_bits)


@pytest.mark.parametrize("id_bits", [17, 15, 12])
def test_prefix_words_at_the_clamp(id_bits):
    # Logits whose products land on each side of the largest level 2^fine - 1 and of 2^fine (where
    # the saturating loop's truncation reaches 2^32 when id_bits + fine_bits = 32), and far beyond.
    fine_bits = 32 - id_bits if id_bits >= 16 else 16
    top = 2**fine_bits - 1
    hi, floor = F(3.0), F(-6.0)
    scale = F(2**fine_bits) / (hi - floor)
    targets = [top - 1, top - 0.5, top, top + 0.25, top + 0.5, 2**fine_bits, 2**fine_bits + 1, 2 * 2**fine_bits]
    vals = [hi, floor]
    for t in targets:
        v = hi - F(t) / scale
        vals += [np.nextafter(v, F(-np.inf)), v, np.nextafter(v, F(np.inf))]
    rng = np.random.default_rng(id_bits)
    a = np.concatenate([np.array(vals, dtype=F), rng.uniform(-8, 3, 181).astype(F)])
    a = a[rng.permutation(a.size)]
    _check(a, float(floor), float(hi), float(scale), id_bits, fine_bits)
    # a floor below every logit: each passes, the lowest ones far over the top level
    _check(a, -1e30, float(hi), float(scale), id_bits, fine_bits)


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.95])
def test_prefix_words_of_the_bench_vocabulary(top_p):
    # The sampler's own floor and grid on 129,280 N(0, 3) logits (id_bits 17, fine_bits 15).
    a = np.random.default_rng(14).normal(0, 3, 129_280).astype(F)
    a[::9973] = np.nan
    hi = float(np.nanmax(a))
    d = F(np.log(2.0) * min(24.0, 9.0 - 1.5 * np.log2(1.0 - top_p)))
    floor = float(F(hi) - d)
    _check(a, floor, hi, _grid(a.size, floor, hi, 15), 17, 15)


def test_prefix_words_where_the_scaled_grid_overflows():
    # scale 2^id_bits beyond the float range (a range m - floor of a few ulps): the plain loop's
    # clamp decides, the same words.
    a = np.array([1.0, np.nextafter(F(1.0), F(0.0)), 0.5, 1.0] * 40, dtype=F)
    _check(a, float(np.nextafter(F(1.0), F(0.0))), 1.0, FLT_MAX, 17, 15)
    _check(a, float(np.nextafter(F(1.0), F(0.0))), 1.0, 2.0**120, 17, 15)


def test_prefix_words_reject_bad_grids():
    a = np.zeros(10, dtype=F)
    for args in ((0.0, 1.0, 1.0, 3, 15), (0.0, 1.0, 1.0, 17, 16), (0.0, 1.0, 0.0, 17, 15), (np.inf, 1.0, 1.0, 17, 15),
                 (0.0, 1.0, 1.0, 8, 17)):
        with pytest.raises(InvalidArgumentError):
            core._collect_prefix(a, *args)
