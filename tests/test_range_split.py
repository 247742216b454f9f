"""The thread pool's range cut (csrc/common/range_split.h): the even split, and the tapered split
the weight-streaming products use so a job ends with short ranges (docs/kernels.md, "Decode glue").

Every index must land in exactly one range (results depend on it), the cut must depend only on its
arguments (never on timing), and the tapered cut must keep every range at most a 1/(2*threads)
share of what is left (or min_chunk): that bound is what shortens the caller's wait for the other
thread's last range, so a tapered cut that degenerates to the even one fails it."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given
from hypothesis import strategies as st

import ds4._core as core
from test_quant_blocks import activation, random_weights


@pytest.fixture
def restore_threads():
    before = core.threads()
    yield
    core.set_threads(before)


def even_tasks(n, threads, min_chunk, rpt):
    if threads <= 1:
        return 1
    return min(rpt * threads, max(1, n // max(min_chunk, 1)))


def check_cover(b, n):
    assert b[0] == 0 and b[-1] == n
    assert all(x < y for x, y in zip(b, b[1:])), "ranges must be non-empty and in order"


cuts = st.tuples(st.integers(1, 200_000), st.integers(1, 8), st.integers(1, 600), st.integers(1, 16))


@given(cuts)
def test_even_split_is_the_old_formula(c):
    n, threads, min_chunk, rpt = c
    b = core._split_bounds(n, threads, min_chunk, rpt, False)
    k = even_tasks(n, threads, min_chunk, rpt)
    assert b == [n * i // k for i in range(k + 1)]


@given(cuts)
def test_tapered_split_covers_once_and_ends_short(c):
    n, threads, min_chunk, rpt = c
    b = core._split_bounds(n, threads, min_chunk, rpt, True)
    check_cover(b, n)
    k = even_tasks(n, threads, min_chunk, rpt)
    if k == 1:
        assert b == [0, n]
        return
    even_len = -(-n // k)
    lens = [y - x for x, y in zip(b, b[1:])]
    for x, ln in zip(b, lens):
        left = n - x
        assert ln <= even_len, "never longer than the even split's ranges"
        # The taper: a range is at most 1/(2*threads) of what is left, or min_chunk.
        assert ln <= max(min_chunk, -(-left // (2 * threads))), (x, ln, left)
        assert ln >= min(min_chunk, left), "ranges stay at least min_chunk"
    assert all(a >= c for a, c in zip(lens, lens[1:])), "lengths never grow"
    assert len(b) - 1 <= k + 64 * threads + 64, "a bounded number of extra ranges"


def test_tapered_split_ends_with_short_ranges():
    # The output head on `bench` at 2 threads: 16 ranges of ~8.8 MB per thread in the even split;
    # tapered, the last range is one min_chunk (64 KiB of rows).
    n, min_chunk = 129_280, 15
    even = core._split_bounds(n, 2, min_chunk, 16, False)
    tap = core._split_bounds(n, 2, min_chunk, 16, True)
    assert even[-1] - even[-2] > 250 * min_chunk
    assert tap[-1] - tap[-2] <= min_chunk
    assert tap[1] - tap[0] == -(-n // 32)


@pytest.mark.parametrize("tapered", [False, True])
@pytest.mark.parametrize("threads", [1, 2, 3, 5])
def test_pool_runs_each_range_of_the_cut_once(threads, tapered, restore_threads):
    core.set_threads(threads)
    for n, min_chunk, rpt in ((1, 1, 4), (7, 3, 4), (1000, 1, 4), (50_000, 15, 16), (123, 200, 4)):
        ran = core._pool_ranges(n, min_chunk, rpt, tapered)
        b = core._split_bounds(n, threads, min_chunk, rpt, tapered)
        if even_tasks(n, threads, min_chunk, rpt) == 1:
            assert ran == [(0, n)]
        else:
            assert ran == list(zip(b, b[1:]))


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.F16, Q.Q4_K], ids=lambda q: q.name)
def test_tapered_products_bit_identical_across_thread_counts(qtype, restore_threads):
    # Large enough that the tapered cut differs from the even one (many 64 KiB units).
    n, rows = 4096, 700
    raw = random_weights(qtype, n, rows, 3)
    x = activation(n, 4, "normal")
    core.set_threads(1)
    want = core.matvec(int(qtype), raw, (n, rows), x)
    for t in (2, 3, 4):
        core.set_threads(t)
        np.testing.assert_array_equal(core.matvec(int(qtype), raw, (n, rows), x), want)
