"""The indexer's O(n log k) top-k equals upstream's repeated strict-max scans exactly."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ds4 import _core

NEG = np.float32(-1.0e30)


def upstream_scan(scores: np.ndarray, k: int) -> np.ndarray:
    """docs/model.md §3.6 step 6 literally: k scans taking the first strictly greatest unchosen row."""
    allowed = np.zeros(len(scores), bool)
    for _ in range(k):
        best, best_score = 0, NEG
        for c, v in enumerate(scores):
            if not allowed[c] and v > best_score:
                best, best_score = c, v
        allowed[best] = True
    return allowed


values = st.sampled_from([0.0, 1.0, -1.0, 2.5, -0.0, float(NEG), -2e30, float("nan"), 3.0])


@given(scores=st.lists(st.one_of(values, st.floats(-10, 10, width=32)), min_size=2, max_size=40),
       k=st.integers(1, 12))
def test_matches_upstream_scan(scores: list[float], k: int) -> None:
    s = np.array(scores, np.float32)
    k = min(k, len(s) - 1)
    assert np.array_equal(_core._select_top_k(s, k).astype(bool), upstream_scan(s, k))


def test_large_random() -> None:
    s = np.random.default_rng(0).integers(-50, 50, 3000).astype(np.float32)   # many ties
    assert np.array_equal(_core._select_top_k(s, 512).astype(bool), upstream_scan(s, 512))
