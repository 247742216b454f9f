"""The metal-emu backend's attention, indexer, RoPE and router ops (csrc/backend/metal/ops_*.cpp)
against the CPU scalar reference with the per-kernel bounds of docs/metal.md "Numerics"
(derivations in tests/metal_bounds.py and next to each check), at shapes that matter: a raw ring
that wraps, partial simdgroups of rows, masked and unmasked compressed rows, head_dim up to the
kernel's 512. Each bound is shown to catch the error it must catch.

The ops these kernels compute bit-identically (HC post, compressor store/shift, FP8, top-k mask,
router selections) are held to bits by test_ops_vs_cpu.py (_ops.METAL_EXACT_OPS). The composite
ops (HC pre / collapse, compressor pool) chain several bounded steps; test_ops_vs_cpu.py holds them
to NMSE_FLOAT (measured margins in _ops.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ds4
import ds4._core as core
from _ops import REFERENCE, assert_exact, floats, rope, router_args
from metal_bounds import U, attention_bound, indexer_scores_bound

FEW = settings(max_examples=8, deadline=None, derandomize=True)


def _emu_info():
    return next((b for b in ds4.available_backends() if b.name == "metal-emu"), None)


pytestmark = pytest.mark.skipif(not (_emu_info() and _emu_info().available),
                                reason=_emu_info().reason if _emu_info() else "no metal-emu backend in this build")


@pytest.fixture(scope="module")
def emu():
    ds4.backends.load_metal_emu()
    return core.OpHarness("metal-emu", "", 1)


# ---- attention --------------------------------------------------------------------------------

def _attention(h, rng, n_head, head_dim, raw_cap, n_raw, raw_first, n_comp, masked):
    q = floats(rng, n_head * head_dim, scale=0.3)
    raw, comp = floats(rng, raw_cap, head_dim), floats(rng, n_comp, head_dim)
    mask = (rng.random(n_comp) < 0.5).astype(np.uint8) if masked else None
    sinks = floats(rng, n_head, scale=2.0)
    args = (q, raw, n_raw, raw_first, comp, mask, sinks, n_head, head_dim)
    live = raw[[(raw_first + r) % raw_cap for r in range(n_raw)]]
    return h.attention(*args).reshape(-1), REFERENCE.attention(*args).reshape(-1), (q, live, comp, mask), args


@FEW
@given(n_head=st.integers(1, 5), head_dim=st.sampled_from([32, 64, 256, 512]), raw_cap=st.integers(1, 130),
       fill=st.floats(0, 1), first=st.integers(0, 300), n_comp=st.integers(0, 70), masked=st.booleans(),
       seed=st.integers(0, 2**16))
def test_attention_within_bound(emu, n_head, head_dim, raw_cap, fill, first, n_comp, masked, seed):
    """Rows split over 4 simdgroups (counts not a multiple of 4), the ring read from raw_first
    around its end, masks skipping rows of some simdgroups only."""
    n_raw = max(1, int(round(fill * raw_cap)))
    got, want, (q, live, comp, mask), _ = _attention(emu, np.random.default_rng(seed), n_head, head_dim, raw_cap,
                                                     n_raw, first % raw_cap, n_comp, masked and n_comp > 0)
    bound = attention_bound(q, live, comp, mask, n_head, head_dim)
    assert (np.abs(got.astype(np.float64) - want) <= bound).all()


def test_attention_bound_catches_a_ring_off_by_one_and_a_dropped_mask_row(emu):
    rng = np.random.default_rng(3)
    got, want, (q, live, comp, mask), args = _attention(emu, rng, 4, 64, 12, 10, 5, 9, True)
    bound = attention_bound(q, live, comp, mask, 4, 64)
    assert (np.abs(got - want) <= bound).all()
    a = list(args)
    a[3] = 6                                                        # the window read one slot late
    assert (np.abs(REFERENCE.attention(*a).reshape(-1) - want) > bound).any()
    a = list(args)
    m = mask.copy()
    m[np.flatnonzero(m)[0]] = 0                                     # one selected row left out
    a[5] = m
    assert (np.abs(REFERENCE.attention(*a).reshape(-1) - want) > bound).any()


# ---- indexer scores ---------------------------------------------------------------------------

def _indexer(h, rng, n_head, n_rows, pos):
    args = (floats(rng, n_head * 128), floats(rng, n_head), floats(rng, n_rows, 128), n_head, 128, 64, pos,
            rope(64, 4))
    return h.indexer_scores(*args), REFERENCE.indexer_scores(*args), args


def _scores_bound(ref, rows, n_head):
    _, q, hw = ref
    dots = np.maximum(rows.astype(np.float64) @ q.reshape(n_head, 128).T.astype(np.float64), 0)
    return indexer_scores_bound(q.reshape(-1), rows, hw.reshape(-1), dots, n_head, 128)


@FEW
@given(n_head=st.integers(1, 8), n_rows=st.integers(1, 75), pos=st.integers(0, 10**6), seed=st.integers(0, 2**16))
def test_indexer_scores_within_bound(emu, n_head, n_rows, pos, seed):
    """Odd row counts leave the last threadgroup's second simdgroup idle. The prepared queries
    (RoPE, Hadamard, FP4) and the scaled head weights are bit-identical; the scores differ by the
    per-head dot order only."""
    got, want, args = _indexer(emu, np.random.default_rng(seed), n_head, n_rows, pos)
    assert_exact(got[1], want[1], "prepared queries")
    assert_exact(got[2], want[2], "scaled head weights")
    bound = _scores_bound(want, args[2], n_head)
    assert (np.abs(got[0].reshape(-1).astype(np.float64) - want[0].reshape(-1)) <= bound).all()


def test_indexer_bound_catches_a_wrong_head_weight(emu):
    got, want, args = _indexer(emu, np.random.default_rng(9), 4, 40, 77)
    bound = _scores_bound(want, args[2], 4)
    a = list(args)
    w = a[1].copy()
    w[2] *= 1.001                                                   # one head weight 0.1 % off
    a[1] = w
    wrong = REFERENCE.indexer_scores(*a)[0].reshape(-1)
    assert (np.abs(got[0].reshape(-1) - want[0].reshape(-1)) <= bound).all()
    assert (np.abs(wrong - want[0].reshape(-1)) > bound).any()


# ---- RoPE -------------------------------------------------------------------------------------

def _pair_bound(want, n_head, head_dim, n_rot):
    """8u*(|x0|+|x1|) per rotated element (sin/cos ulps on a GPU; the emulator's are the C
    library's, so here the results are identical); the non-rotated dims must not move at all."""
    w = np.abs(want.astype(np.float64)).reshape(want.shape[0], n_head, head_dim)
    tail = w[..., head_dim - n_rot:].reshape(want.shape[0], n_head, n_rot // 2, 2).sum(-1).repeat(2, -1)
    b = np.zeros_like(w)
    b[..., head_dim - n_rot:] = 8 * U * tail
    return b.reshape(want.shape)


@FEW
@given(n_head=st.integers(1, 4), n_rot=st.sampled_from([2, 8, 64]), ratio=st.sampled_from([0, 4, 128]),
       pos0=st.integers(0, 2**20), nb=st.sampled_from([1, 3]), inverse=st.booleans(), seed=st.integers(0, 2**16))
def test_rope_tail_within_bound(emu, n_head, n_rot, ratio, pos0, nb, inverse, seed):
    head_dim = n_rot + 64
    x = floats(np.random.default_rng(seed), nb, n_head * head_dim)
    args = (x, n_head, head_dim, n_rot, pos0, rope(n_rot, ratio), inverse)
    got, want = emu.rope_tail(*args), REFERENCE.rope_tail(*args)
    assert (np.abs(got.astype(np.float64) - want) <= _pair_bound(want, n_head, head_dim, n_rot)).all()


def test_rope_bound_catches_the_next_position(emu):
    x = floats(np.random.default_rng(1), 2, 2 * 128)
    args = [x, 2, 128, 64, 1000, rope(64, 4), False]
    want = REFERENCE.rope_tail(*args)
    assert (np.abs(emu.rope_tail(*args) - want) <= _pair_bound(want, 2, 128, 64)).all()
    args[4] = 1001
    assert (np.abs(REFERENCE.rope_tail(*args) - want) > _pair_bound(want, 2, 128, 64)).any()


# ---- router -----------------------------------------------------------------------------------

@FEW
@given(n_expert=st.sampled_from([8, 16, 256]), n_used=st.integers(1, 8), nb=st.sampled_from([1, 3, 33]),
       mode=st.sampled_from(["topk", "bias", "hash"]), seed=st.integers(0, 2**16))
def test_router_within_bound(emu, n_expert, n_used, nb, mode, seed):
    """Selections exact (rank counting = the CPU's insertion top-k, lower id first on ties); weights
    within 16u*|w| (sqrt(softplus) ulps through the normalisation)."""
    args = router_args(np.random.default_rng(seed), nb, n_expert, n_used, mode)
    (sel, w), (rsel, rw) = emu.router(*args), REFERENCE.router(*args)
    assert_exact(sel, rsel, "router selections")
    assert (np.abs(w.astype(np.float64) - rw) <= 16 * U * np.abs(rw)).all()


def test_router_bound_catches_a_slot_missing_from_the_normalisation(emu):
    rng = np.random.default_rng(4)
    logits = floats(rng, 2, 16, scale=3.0)
    sel, w = emu.router(logits, [1, 2], None, None, 6, 1.5)
    _, rw = REFERENCE.router(logits, [1, 2], None, None, 6, 1.5)
    assert (np.abs(w - rw) <= 16 * U * np.abs(rw)).all()
    short = rw * (rw.sum(1, keepdims=True) / (rw.sum(1, keepdims=True) - rw[:, -1:]))   # sum over 5 of 6 slots
    assert (np.abs(short - rw) > 16 * U * np.abs(rw)).any()


def test_router_refuses_a_hash_row_outside_the_experts(emu):
    table = np.zeros((4, 2), np.int32)
    table[3, 1] = 9
    with pytest.raises(ds4.errors.Ds4Error, match="expert 9"):
        emu.router(floats(np.random.default_rng(0), 1, 8), [3], None, table, 2, 1.0)


@pytest.mark.parametrize("cap", [32, 64])
def test_pipelines_capped_below_the_host_defaults(emu, cap):
    """maxTotalThreadsPerThreadgroup below the host's preferred sizes: attention and indexer
    scoring run fewer simdgroups per threadgroup, the one-thread-per-element kernels smaller
    groups; same results within the same bounds (selections, masks and FP8 exact)."""
    from ds4 import metal_emu

    lib = metal_emu.load()
    before = lib.max_threads_per_threadgroup
    lib.set_max_threads_per_threadgroup(cap)
    try:
        capped = core.OpHarness("metal-emu", "", 1)
        rng = np.random.default_rng(cap)
        got, want, (q, live, comp, mask), _ = _attention(capped, rng, 3, 256, 20, 17, 9, 13, True)
        assert (np.abs(got - want) <= attention_bound(q, live, comp, mask, 3, 256)).all()
        got, want, args = _indexer(capped, rng, 4, 37, 123)
        assert (np.abs(got[0].reshape(-1) - want[0].reshape(-1)) <= _scores_bound(want, args[2], 4)).all()
        s = floats(rng, 300)
        assert_exact(capped.top_k_mask(s, 16), REFERENCE.top_k_mask(s, 16), "top-k mask")
        kv, score = floats(rng, 8, 256), floats(rng, 8, 256)
        for g, w in zip(capped.compressor_shift(kv, score, 128), REFERENCE.compressor_shift(kv, score, 128)):
            assert_exact(g, w, "compressor shift")
        logits = floats(rng, 3, 16, scale=3.0)
        assert_exact(capped.router(logits, [0, 1, 2], None, None, 4, 1.5)[0],
                     REFERENCE.router(logits, [0, 1, 2], None, None, 4, 1.5)[0], "router selections")
    finally:
        lib.set_max_threads_per_threadgroup(before)
