"""AttentionBlock (several query tokens at once, prefill) against the per-token Attention op and
against the numpy reference (ds4.reference.attention.attend).

The op's contract (backend/ops.h): query j of a block sees what Attention gives it right after the
block's rows 0..j were pushed onto the raw ring. ``per_token`` below replays exactly that with the
per-token op: it pushes the fresh rows one by one onto a copy of the ring and calls
``attention`` for each query. On the CPU backend the blocked op keeps every query's float order
(docs/kernels.md "Attention"), so the two agree bit for bit on every SIMD path; the numpy
reference accumulates in float64, so it gets NMSE_FLOAT (the reason is in _ops.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ds4._core as core
from ds4.reference.attention import attend as reference_attend
from _ops import NMSE_FLOAT, assert_exact, assert_nmse, floats, nmse

PATHS = core.simd_paths()
FEW = settings(max_examples=25, deadline=None, derandomize=True)


def ring_windows(raw_cap: int, n_raw: int, raw_first: int, nq: int):
    """For each query j: (ring after pushing fresh rows 0..j, its n_raw, its raw_first) as slot
    bookkeeping: a list of (slot -> ('ring', i) | ('fresh', f)) plus the live window."""
    slots = [("ring", s) for s in range(raw_cap)]
    first, live = raw_first, n_raw
    out = []
    for j in range(nq):
        nxt = (first + live) % raw_cap
        slots[nxt] = ("fresh", j)
        if live < raw_cap:
            live += 1
        else:
            first = (first + 1) % raw_cap
        out.append((list(slots), live, first))
    return out


def per_token(h, q, raw, n_raw, raw_first, fresh, comp, n_comp, mask, sinks, n_head, head_dim, mask_first,
              late=None):
    """The block's expected output from the per-token op. late=j reads query j's oldest window row
    one ring slot late (a perturbation the checks must catch)."""
    raw_cap = raw.shape[0]
    out = []
    for j, (slots, live, first) in enumerate(ring_windows(raw_cap, n_raw, raw_first, q.shape[0])):
        ring = np.stack([raw[i] if kind == "ring" else fresh[i] for kind, i in slots])
        if late == j and live > 1:
            ring[first] = ring[(first + 1) % raw_cap]
        m = mask[j, :n_comp[j]].copy() if mask is not None and j >= mask_first else None
        out.append(h.attention(q[j], ring, live, first, comp[:n_comp[j]], m, sinks, n_head, head_dim)[0])
    return np.stack(out)


def reference(q, raw, n_raw, raw_first, fresh, comp, n_comp, mask, sinks, n_head, head_dim, mask_first):
    """The numpy reference, query by query on its window (oldest first) and visible rows."""
    raw_cap = raw.shape[0]
    out = []
    for j, (slots, live, first) in enumerate(ring_windows(raw_cap, n_raw, raw_first, q.shape[0])):
        window = np.stack([raw[i] if kind == "ring" else fresh[i]
                           for kind, i in (slots[(first + r) % raw_cap] for r in range(live))])
        allowed = mask[j, :n_comp[j]].astype(bool) if mask is not None and j >= mask_first else None
        out.append(reference_attend(q[j], window, comp[:n_comp[j]], allowed, sinks, n_head, head_dim))
    return np.stack(out)


@st.composite
def blocks(draw, max_heads=8, dims=(64, 72, 512)):
    """A block of queries at a drawn position: ring fill and wrap, block longer than the ring,
    compression boundaries (n_comp steps where (pos + 1) % ratio == 0) and the indexer switching
    on inside the block (mask_first)."""
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    n_head = draw(st.integers(1, max_heads))
    head_dim = draw(st.sampled_from(dims))
    raw_cap = draw(st.integers(1, 40))
    n_raw = draw(st.integers(0, raw_cap))
    raw_first = draw(st.integers(0, raw_cap - 1))
    nq = draw(st.integers(1, 20))
    ratio = draw(st.sampled_from([4, 8]))
    pos0 = draw(st.integers(0, 40))
    c0 = draw(st.integers(0, 30))
    n_comp = [c0 + sum((pos0 + k + 1) % ratio == 0 for k in range(j + 1)) for j in range(nq)]
    masked = draw(st.booleans())
    mask_first = draw(st.integers(0, nq)) if masked else nq
    stride = max(1, n_comp[-1] + draw(st.integers(0, 3)))
    mask = (rng.random((nq, stride)) < 0.5).astype(np.uint8) if masked else None
    args = (floats(rng, nq, n_head * head_dim), floats(rng, raw_cap, head_dim), n_raw, raw_first,
            floats(rng, nq, head_dim), floats(rng, n_comp[-1], head_dim), n_comp, mask,
            floats(rng, n_head), n_head, head_dim, mask_first)
    return args


@pytest.mark.parametrize("path", PATHS)
@FEW
@given(args=blocks())
def test_block_equals_per_token_bit_for_bit(path, args):
    """Every query of a block: the per-token op's bits (same SIMD path, same float order)."""
    h = core.OpHarness("cpu", path, 2)
    assert_exact(h.attention_block(*args), per_token(h, *args), f"attention_block on cpu-{path}")


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=10, deadline=None, derandomize=True)
@given(args=blocks(max_heads=6, dims=(64, 512)))
def test_block_matches_numpy_reference(path, args):
    h = core.OpHarness("cpu", path, 2)
    assert_nmse(h.attention_block(*args), reference(*args), NMSE_FLOAT, f"attention_block on cpu-{path}")


def test_block_of_prefill_shape():
    """The prefill shape of `small`: 16 heads x 512, a full 128-row ring, a block of 16 crossing a
    compression boundary with the indexer on from its fifth query: bit-identical on every path."""
    rng = np.random.default_rng(7)
    nq, n_head, D = 16, 16, 512
    n_comp = [70 + (j + 3) // 4 for j in range(nq)]
    mask = (rng.random((nq, 80)) < 0.4).astype(np.uint8)
    args = (floats(rng, nq, n_head * D), floats(rng, 128, D), 128, 37, floats(rng, nq, D),
            floats(rng, n_comp[-1], D), n_comp, mask, floats(rng, n_head), n_head, D, 4)
    for path in PATHS:
        h = core.OpHarness("cpu", path, 2)
        assert_exact(h.attention_block(*args), per_token(h, *args), f"attention_block on cpu-{path}")


def _fixed_block():
    rng = np.random.default_rng(3)
    nq, n_head, D, cap = 6, 4, 64, 10
    n_comp = [5, 5, 6, 6, 6, 6]
    mask = (rng.random((nq, 6)) < 0.5).astype(np.uint8)
    mask[:, 0] = 1
    return (floats(rng, nq, n_head * D), floats(rng, cap, D), cap, 3, floats(rng, nq, D),
            floats(rng, n_comp[-1], D), n_comp, mask, floats(rng, n_head), n_head, D, 0)


@pytest.mark.parametrize("path", PATHS)
def test_checks_catch_a_row_one_slot_late_and_a_masked_row(path):
    """Both checks above fail on the two mistakes a blocked kernel can make: a query's oldest
    window row read one ring slot late, and one row its mask hides included."""
    h = core.OpHarness("cpu", path, 2)
    args = _fixed_block()
    got = h.attention_block(*args)
    assert_exact(got, per_token(h, *args))
    late = per_token(h, *args, late=2)
    mask = args[7].copy()
    hidden = int(np.flatnonzero(mask[4, :args[6][4]] == 0)[0])
    mask[4, hidden] = 1
    leaked = per_token(h, *args[:7], mask, *args[8:])
    for bad in (late, leaked):
        with pytest.raises(AssertionError):
            assert_exact(got, bad)
        assert nmse(got, bad) > NMSE_FLOAT
    with pytest.raises(AssertionError):
        assert_nmse(got, reference(*args[:7], mask, *args[8:]), NMSE_FLOAT)


def test_bad_arguments_raise():
    h = core.OpHarness("cpu", PATHS[0], 2)
    args = list(_fixed_block())
    args[6] = [5, 4, 6, 6, 6, 6]          # n_comp must not decrease
    with pytest.raises(Exception, match="non-decreasing"):
        h.attention_block(*args)
