"""GroupedOutputA for one token: the CPU backend runs the G group products as one pool dispatch
(matvec_group over G parts, each with its own quantised input), so each group's output must still
be exactly that backend's own Linear of the group's rows on the group's slice of the heads (the
same kernel, the same per-row order, wherever the thread split falls). Shapes are large enough
that the ~64 KiB units of one group are split between threads and ranges cross group boundaries.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given, settings, strategies as st

import ds4._core as core
from _ops import BACKENDS, REFERENCE, assert_exact, assert_matches, floats, weight

# Every CPU SIMD path at 3 threads too: with 2 threads a range boundary can fall in fewer places.
HARNESSES = BACKENDS + [pytest.param(f"cpu-{p}-3t", core.OpHarness("cpu", p, 3), id=f"cpu-{p}-3t")
                        for p in core.simd_paths()]


def _block(q: Q) -> int:
    return 256 if q in (Q.Q2_K, Q.Q4_K, Q.IQ2_XXS) else 32


@pytest.mark.parametrize("name,h", HARNESSES)
@pytest.mark.parametrize("qtype", (Q.Q8_0, Q.F16, Q.BF16, Q.Q4_K), ids=lambda q: q.name)
@settings(max_examples=4, deadline=None, derandomize=True)
@given(groups=st.integers(1, 8), rank=st.integers(1, 260), blocks=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_grouped_output_a_decode_equals_linear_per_group(name, h, qtype, groups, rank, blocks, seed):
    if h is None:
        pytest.skip("backend not available")
    gd = _block(qtype) * blocks
    w = weight(qtype, gd, groups * rank, seed)
    heads = floats(np.random.default_rng(seed), 1, groups * gd)
    got = h.grouped_output_a(w, int(qtype), gd, groups, rank, heads)
    assert got.shape == (1, groups * rank)
    rows = w.reshape(groups * rank, -1)
    for g in range(groups):
        wg = np.ascontiguousarray(rows[g * rank:(g + 1) * rank]).reshape(-1)
        x = np.ascontiguousarray(heads[:, g * gd:(g + 1) * gd])
        what = f"grouped_output_a group {g} of {groups} ({qtype.name}, rank {rank}, {gd} wide) on {name}"
        assert_exact(got[:, g * rank:(g + 1) * rank], h.linear(wg, int(qtype), gd, rank, x), what)
    assert_matches("grouped_output_a", name, got, REFERENCE.grouped_output_a(w, int(qtype), gd, groups, rank, heads))
