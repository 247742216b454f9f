"""The several-rows decode kernels (dot_kernels.h DotRowsFn: Q2_K and IQ2_XXS on the avx512 and
avx512vnni paths, docs/kernels.md) where their batching changes: matvec hands them runs of up to
16 rows, they reduce up to 32 (row, block) partials per batch (32 / blocks-per-row rows), rows of
more than 16 blocks go to the single-row kernel, and matvec_experts runs stop at an expert's last
row and at a thread's range. Every output must equal the scalar kernel's (value equality: the
integer block sums and per-block float expressions are the scalar ones; a block with d == 0 may
give -0.0 on one path and +0.0 on another).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given, settings, strategies as st

import ds4._core as core
from test_kernels_matvec import PATHS, simd_path
from test_quant_blocks import ACT_PATTERNS, activation, random_weights

ROWS_TYPES = (Q.Q2_K, Q.IQ2_XXS)
# blocks per row: 1, 2, 4 (the routed experts of `bench` / `small`), uneven batch splits (3, 5),
# the longest batched row (16) and the first single-row one (17)
BLOCKS = (1, 2, 3, 4, 5, 8, 16, 17)


def _threads(n):
    before = core.threads()
    core.set_threads(n)
    return before


@pytest.mark.parametrize("qtype", ROWS_TYPES, ids=lambda q: q.name)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_rows_kernels_equal_scalar(qtype, data):
    n = 256 * data.draw(st.sampled_from(BLOCKS))
    rows, n_expert = data.draw(st.integers(1, 70)), data.draw(st.integers(1, 3))
    raw = random_weights(qtype, n, rows * n_expert, data.draw(st.integers(0, 2**32 - 1)),
                         data.draw(st.sampled_from(("normal", "normal", "zero", "subnormal", "huge"))))
    x = activation(n, data.draw(st.integers(0, 2**32 - 1)), data.draw(st.sampled_from(ACT_PATTERNS)))
    ids = np.array(data.draw(st.lists(st.integers(0, n_expert - 1), min_size=1, max_size=6)), np.int32)
    mat = raw.size // n_expert
    before = _threads(data.draw(st.integers(1, 3)))
    try:
        with simd_path("scalar"):
            want = core.matvec(int(qtype), raw[:mat], (n, rows), x)
            want_e = core.matvec_experts(int(qtype), raw, (n, rows, n_expert), ids, x)
        for path in PATHS:
            with simd_path(path):
                np.testing.assert_array_equal(core.matvec(int(qtype), raw[:mat], (n, rows), x), want, err_msg=path)
                np.testing.assert_array_equal(core.matvec_experts(int(qtype), raw, (n, rows, n_expert), ids, x),
                                              want_e, err_msg=path)
    finally:
        core.set_threads(before)


@pytest.mark.parametrize("qtype", ROWS_TYPES, ids=lambda q: q.name)
def test_rows_kernels_catch_one_changed_code(qtype):
    """The comparison above sees a single weight code or sign change: altering one byte of one row's
    codes changes that row's output and no other (so a decoding slip in any one position fails it)."""
    n, rows = 1024, 40
    raw = random_weights(qtype, n, rows, 7)
    x = activation(n, 8, "normal")
    rb = raw.size // rows
    # Q2_K: a byte of qs (offset 16..79), IQ2_XXS: the top byte of a sign word (bits 24..31:
    # sign field 3's high bit and the scale), both of row 21's third block.
    off = 21 * rb + 2 * (84 if qtype == Q.Q2_K else 66) + (16 + 37 if qtype == Q.Q2_K else 2 + 8 * 5 + 7)
    changed = raw.copy()
    changed[off] ^= 0x01 if qtype == Q.Q2_K else 0x08
    for path in PATHS:
        with simd_path(path):
            a = core.matvec(int(qtype), raw, (n, rows), x)
            b = core.matvec(int(qtype), changed, (n, rows), x)
        diff = np.flatnonzero(a != b)
        assert diff.tolist() == [21], (path, diff)
