"""The LinearGroup op (several weights over one input, the input prepared once per activation
type): on every backend each member's output is bit-identical to that backend's own Linear of the
member (same kernels, same per-row order, docs/architecture.md), and meets Linear's check against
the CPU scalar reference. Groups mix weight types, so one group needs up to three activation forms
(floats for F32/F16/BF16, Q8_0-act, Q8_K): reusing one form for another type changes the results.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import assume, given, settings, strategies as st

import ds4.errors
from _ops import BACKENDS, REFERENCE, assert_exact, assert_matches, floats, weight

WEIGHT_TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q2_K, Q.Q4_K, Q.IQ2_XXS)
BATCH = st.sampled_from([1, 2, 3, 7, 64])             # decode, small odd batches, a GEMM-sized batch
MAX_MEMBERS = 8
backends = pytest.mark.parametrize("name,h", BACKENDS)


def _members(types, rows, n, seed):
    return [(weight(t, n, r, seed + i), int(t), n, r) for i, (t, r) in enumerate(zip(types, rows))]


def _check_group(name, h, members, x):
    got = h.linear_group(members, x)
    assert len(got) == len(members)
    for i, (w, t, n, r) in enumerate(members):
        what = f"linear_group member {i} ({Q(t).name}, {r} rows) on {name}"
        assert_exact(got[i], h.linear(w, t, n, r, x), what)
        assert_matches("linear", name, got[i], REFERENCE.linear(w, t, n, r, x))


@backends
@settings(max_examples=20, deadline=None, derandomize=True)
@given(types=st.lists(st.sampled_from(WEIGHT_TYPES), min_size=1, max_size=MAX_MEMBERS),
       rows=st.lists(st.integers(1, 40), min_size=MAX_MEMBERS, max_size=MAX_MEMBERS),
       blocks=st.integers(1, 2), nb=BATCH, seed=st.integers(0, 2**16))
def test_linear_group(name, h, types, rows, blocks, nb, seed):
    assume(all(h.supports("linear_group", int(t)) for t in types))
    n = 256 * blocks                                   # a whole block of every type
    x = floats(np.random.default_rng(seed), nb, n)
    _check_group(name, h, _members(types, rows, n, seed), x)


@backends
@settings(max_examples=10, deadline=None, derandomize=True)
@given(types=st.lists(st.sampled_from(WEIGHT_TYPES), min_size=2, max_size=5),
       rows=st.lists(st.integers(1, 1200), min_size=5, max_size=5), seed=st.integers(0, 2**16))
def test_linear_group_decode_split(name, h, types, rows, seed):
    """One token, members of up to 1200 rows: the CPU's single dispatch cuts each member into
    ~64 KiB units (Q8_0 at n=256: 240 rows, F16 128, Q2_K 780), so the threads' ranges start and
    end inside members and across member boundaries."""
    assume(all(h.supports("linear_group", int(t)) for t in types))
    x = floats(np.random.default_rng(seed), 1, 256)
    _check_group(name, h, _members(types, rows, 256, seed), x)


def test_linear_group_two_quantised_forms_share_nothing():
    """A group of a Q8_0 and a Q8_K member next to each other (the pair a shared-form bug mixes up):
    each equals its own linear, on the reference path and every CPU path."""
    rng = np.random.default_rng(7)
    x = floats(rng, 1, 512)
    members = _members([Q.Q8_0, Q.Q4_K, Q.F16, Q.IQ2_XXS, Q.Q8_0], [33, 17, 9, 40, 300], 512, 3)
    for p in BACKENDS:
        name, h = p.values
        if h is not None and name.startswith("cpu-"):
            _check_group(name, h, members, x)


def test_linear_group_rejects_bad_members():
    h = REFERENCE
    x = floats(np.random.default_rng(1), 2, 64)
    ok = (weight(Q.Q8_0, 64, 5, 0), int(Q.Q8_0), 64, 5)
    wide = (weight(Q.Q8_0, 96, 5, 0), int(Q.Q8_0), 96, 5)
    with pytest.raises(ds4.errors.InvalidArgumentError, match="linear_group"):
        h.linear_group([ok, wide], x)
    with pytest.raises(ds4.errors.InvalidArgumentError, match="more than 8"):
        h.linear_group([ok] * (MAX_MEMBERS + 1), x)
    assert h.linear_group([], x) == []


def test_linear_group_same_bits_for_any_thread_count():
    """The single decode dispatch splits the units differently for each pool size; no output may
    change (default SIMD path, 1 to 5 threads, against one-thread separate linears)."""
    import ds4._core as core

    rng = np.random.default_rng(11)
    x = floats(rng, 1, 512)
    members = _members([Q.F16, Q.Q8_0, Q.Q2_K, Q.F32, Q.BF16, Q.Q4_K, Q.IQ2_XXS], [700, 500, 900, 130, 260, 333, 1000],
                       512, 5)
    one = core.OpHarness("cpu", "", 1)
    want = [one.linear(w, t, n, r, x) for w, t, n, r in members]
    for threads in (1, 2, 3, 5):
        got = core.OpHarness("cpu", "", threads).linear_group(members, x)
        for i in range(len(members)):
            assert_exact(got[i], want[i], f"member {i} at {threads} threads")
