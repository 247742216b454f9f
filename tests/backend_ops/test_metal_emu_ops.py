"""The metal-emu backend's host (csrc/backend/metal: argument structs, buffer offsets, grids,
scratch, batching) against the CPU scalar reference, with the per-kernel bounds of docs/metal.md
"Numerics" (derivations in tests/metal_bounds.py and next to each check), at odd shapes: rows that
fill part of a mat-vec simdgroup or of a 32x32 mat-mat tile, token counts past a tile edge, norm
rows that fill part of a simdgroup, and every value of each function constant the ported ops use
(FC_NORM_WEIGHTED, FC_DEQ_TYPE). Each bound is shown to catch the error it must catch.

test_ops_vs_cpu.py runs the same ops on metal-emu with the suite's NMSE checks; this file holds
metal-emu to the kernels' own (tighter, per-element) bounds. Where no clang exists the emulator
cannot be built and these tests skip saying so.
"""

from __future__ import annotations


import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given, settings, strategies as st

import ds4
import ds4._core as core
from _ops import REFERENCE, assert_exact, floats, weight
from metal_bounds import U, check_bound, matmul_bound, matvec_bound

MV_TYPES = (Q.F32, Q.F16, Q.Q8_0, Q.Q2_K, Q.Q4_K, Q.IQ2_XXS)
FEW = settings(max_examples=6, deadline=None, derandomize=True)


def _emu_info():
    return next(b for b in ds4.available_backends() if b.name == "metal-emu")


pytestmark = pytest.mark.skipif(not _emu_info().available, reason=_emu_info().reason)


@pytest.fixture(scope="module")
def emu():
    ds4.backends.load_metal_emu()
    return core.OpHarness("metal-emu", "", 1)


def _elems(q: Q) -> int:
    return {Q.F32: 1, Q.F16: 1, Q.Q8_0: 32}.get(q, 256)


# ---- Linear: mat-vec (one token) and mat-mat (more) --------------------------------------------

@pytest.mark.parametrize("qtype", MV_TYPES, ids=lambda q: q.name)
@FEW
@given(blocks=st.integers(1, 3), rows=st.sampled_from([1, 5, 8, 13, 33]), nb=st.sampled_from([1, 2, 33]),
       seed=st.integers(0, 2**16))
def test_linear_within_kernel_bounds(emu, qtype, blocks, rows, nb, seed):
    """rows 5/13: part of a simdgroup's 4 rows and of a threadgroup's 8; 33: a second 32-row tile
    with one row; nb 33: a second 32-token tile with one token. One token runs matvec (bound
    2*B*u*S), more run matmul ((n+B+10)*u*S)."""
    n = _elems(qtype) * blocks * (8 if qtype in (Q.F32, Q.F16) else 1)
    w = weight(qtype, n, rows, seed)
    x = floats(np.random.default_rng(seed), nb, n)
    got = emu.linear(w, int(qtype), n, rows, x)
    want = REFERENCE.linear(w, int(qtype), n, rows, x)
    bound = (matvec_bound if nb == 1 else matmul_bound)(qtype, w, n, rows, x)
    check_bound(got, want, bound)


@pytest.mark.parametrize("nb", [1, 3], ids=["matvec", "matmul"])
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K], ids=lambda q: q.name)
def test_linear_bound_catches_one_code_step(emu, qtype, nb):
    """One weight code of row 0 one step off moves row 0 by about S/n: beyond both bounds, while
    the other rows (same weights) still pass."""
    n, rows = 2 * _elems(qtype), 5
    w = weight(qtype, n, rows, 7)
    x = floats(np.random.default_rng(8), nb, n)
    bad = w.copy()
    bad[2 if qtype == Q.Q8_0 else 16] ^= 1
    got = emu.linear(bad, int(qtype), n, rows, x)
    want = REFERENCE.linear(w, int(qtype), n, rows, x)
    bound = (matvec_bound if nb == 1 else matmul_bound)(qtype, w, n, rows, x)
    with pytest.raises(AssertionError, match="max err/bound"):
        check_bound(got, want, bound)
    check_bound(got[:, 1:], want[:, 1:], bound[:, 1:])


def test_matmul_bound_catches_a_token_in_the_wrong_row(emu):
    """A host error in the token stride (act_bytes / y_stride) moves whole rows: two tokens swapped
    in the output must fail the mat-mat bound."""
    n, rows = 64, 9
    w = weight(Q.Q8_0, n, rows, 3)
    x = floats(np.random.default_rng(4), 3, n)
    got = emu.linear(w, int(Q.Q8_0), n, rows, x)
    want = REFERENCE.linear(w, int(Q.Q8_0), n, rows, x)
    bound = matmul_bound(Q.Q8_0, w, n, rows, x)
    check_bound(got, want, bound)
    with pytest.raises(AssertionError, match="max err/bound"):
        check_bound(got[[1, 0, 2]], want, bound)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.F16, Q.Q4_K], ids=lambda q: q.name)
@pytest.mark.parametrize("nb", [1, 3])
def test_grouped_output_a_within_kernel_bounds(emu, qtype, nb):
    """Each group is a Linear on the weight rows g*rank.. (bound at a byte offset) and the heads'
    group g (activation rows G*act_bytes apart): the Linear bound per group; a group bound at the
    wrong offset would read another group's rows and fail it."""
    G, rank, gd = 3, 5, 2 * _elems(qtype) * (8 if qtype == Q.F16 else 1)
    w = weight(qtype, gd, G * rank, 11)
    heads = floats(np.random.default_rng(12), nb, G * gd)
    got = emu.grouped_output_a(w, int(qtype), gd, G, rank, heads)
    want = REFERENCE.grouped_output_a(w, int(qtype), gd, G, rank, heads)
    row_bytes = w.size // (G * rank)
    bound_of = matvec_bound if nb == 1 else matmul_bound
    for g in range(G):
        wg = w[g * rank * row_bytes:(g + 1) * rank * row_bytes]
        bound = bound_of(qtype, wg, gd, rank, heads[:, g * gd:(g + 1) * gd])
        check_bound(got[:, g * rank:(g + 1) * rank], want[:, g * rank:(g + 1) * rank], bound)
        if G > 1:
            other = (g + 1) % G
            with pytest.raises(AssertionError):
                check_bound(got[:, other * rank:(other + 1) * rank], want[:, g * rank:(g + 1) * rank], bound)


# ---- Embedding: bit-identical, every FC_DEQ_TYPE ------------------------------------------------

@pytest.mark.parametrize("qtype", MV_TYPES, ids=lambda q: q.name)
def test_embed_tokens_hc_is_bit_identical(emu, qtype):
    """The tile loaders dequantise with the CPU's expressions: every value is the CPU's."""
    n_embd = _elems(qtype) * (2 if _elems(qtype) > 1 else 40)
    w = weight(qtype, n_embd, 41, 5)
    args = (w, int(qtype), n_embd, 41, [0, 40, 7, 7, 13], 4)
    assert_exact(emu.embed_tokens_hc(*args), REFERENCE.embed_tokens_hc(*args), f"embed {qtype.name}")


# ---- Norms ----------------------------------------------------------------------------------------

@FEW
@given(n=st.sampled_from([1, 7, 33, 64, 700]), nb=st.integers(1, 3), weighted=st.booleans(), seed=st.integers(0, 2**16))
def test_rms_norm_within_bound(emu, n, nb, weighted, seed):
    """Both FC_NORM_WEIGHTED values; n 7/33/700: partial simdgroups. The CPU sums squares in
    double, the kernel in float (per thread, then two simd_sum trees): the sum's relative error is
    at most n*u, which moves 1/sqrt(mean + eps) by at most n*u/2, plus a few roundings of the scale
    and the products: |gpu - cpu| <= (n/2 + 4)*u*|cpu|."""
    rng = np.random.default_rng(seed)
    x = floats(rng, nb, n, scale=float(2.0 ** rng.integers(-20, 20)))
    w = floats(rng, n) if weighted else None
    want = REFERENCE.rms_norm(x, w, 1e-6)
    check_bound(emu.rms_norm(x, w, 1e-6), want, (n / 2 + 4) * U * np.abs(want) + 1e-37)


@FEW
@given(n_head=st.integers(1, 5), head_dim=st.sampled_from([16, 96, 512]), nb=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_head_rms_norm_within_bound(emu, n_head, head_dim, nb, seed):
    """A head is a row of head_dim (the plain norm, in place): the RMS bound with n = head_dim."""
    x = floats(np.random.default_rng(seed), nb, n_head * head_dim)
    want = REFERENCE.head_rms_norm(x, n_head, head_dim, 1e-6)
    check_bound(emu.head_rms_norm(x, n_head, head_dim, 1e-6), want, (head_dim / 2 + 4) * U * np.abs(want) + 1e-37)


def test_rms_norm_bound_catches_a_wrong_scale_or_weight(emu):
    """The bound is a few hundred ulps at n = 700: a scale off by 1e-4 (an eps or a mean over the
    wrong count), another row's scale, or the unweighted form where the weighted one was asked for
    all fail it."""
    rng = np.random.default_rng(1)
    n = 700
    x, w = floats(rng, 2, n), floats(rng, n)
    want = REFERENCE.rms_norm(x, w, 1e-6)
    bound = (n / 2 + 4) * U * np.abs(want) + 1e-37
    got = emu.rms_norm(x, w, 1e-6)
    check_bound(got, want, bound)
    for bad in (got * (1 + 1e-4), got[::-1] * (np.abs(x[::-1]).sum() / np.abs(x).sum()),
                emu.rms_norm(x, None, 1e-6)):
        with pytest.raises(AssertionError, match="max err/bound"):
            check_bound(bad, want, bound)


# ---- SwiGLU and the exact small ops ---------------------------------------------------------------

@FEW
@given(n=st.integers(1, 300), nb=st.integers(1, 3), clamp=st.sampled_from([0.0, 1.0, 10.0]),
       scale=st.sampled_from([0.25, 1.5]), seed=st.integers(0, 2**16))
def test_swiglu_within_8_ulps(emu, n, nb, clamp, scale, seed):
    """The CPU's stable sigmoid; only exp can differ on a GPU (by ulps): 8u relative."""
    rng = np.random.default_rng(seed)
    g, u = floats(rng, nb, n, scale=5.0), floats(rng, nb, n, scale=5.0)
    want = REFERENCE.swiglu(g, u, clamp, scale)
    got = emu.swiglu(g, u, clamp, scale)
    check_bound(got, want, 8 * U * np.abs(want) + 1e-37)
    with pytest.raises(AssertionError, match="max err/bound"):   # 16 ulps on one value: caught
        bad = got.copy()
        i = int(np.argmax(np.abs(want)))
        bad.reshape(-1)[i] *= 1 + 16 * U
        check_bound(bad, want, 8 * U * np.abs(want) + 1e-37)


@FEW
@given(n=st.integers(1, 300), nb=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_small_ops_are_bit_identical(emu, n, nb, seed):
    """add, fill, copy, the f16 store and argmax compute the CPU's values exactly."""
    rng = np.random.default_rng(seed)
    a, b = floats(rng, nb, n), floats(rng, nb, n, scale=float(2.0 ** rng.integers(-20, 18)))
    assert_exact(emu.add(a, b), REFERENCE.add(a, b), "add")
    assert_exact(emu.fill(n, nb, 0.1), REFERENCE.fill(n, nb, 0.1), "fill")
    assert_exact(emu.copy(a), REFERENCE.copy(a), "copy")
    assert_exact(emu.store_row_f16(b), REFERENCE.store_row_f16(b), "store_row_f16")
    row = np.round(a[0] * 2).astype(np.float32)
    assert emu.argmax(row) == REFERENCE.argmax(row)


# ---- Weight types without kernels, thread orders --------------------------------------------------

def test_bf16_weights_are_refused_cleanly(emu):
    """No Metal kernel reads BF16: supports() says so and the op raises instead of computing."""
    assert not emu.supports("linear", int(Q.BF16))
    w = weight(Q.BF16, 32, 2, 1)
    with pytest.raises(ds4.UnsupportedModelError, match="BF16"):
        emu.linear(w, int(Q.BF16), 32, 2, floats(np.random.default_rng(0), 1, 32))


@pytest.mark.parametrize("order", ["reverse", "shuffle:7"])
def test_thread_orders_give_identical_results(emu, order, monkeypatch):
    """The ops' dispatches under reversed and shuffled thread and threadgroup orders
    (DS4_METAL_EMU_ORDER, read when a device is created) give the same bits as in order: no op of
    this host depends on an order the GPU does not guarantee."""
    monkeypatch.setenv("DS4_METAL_EMU_ORDER", order)
    other = core.OpHarness("metal-emu", "", 1)
    rng = np.random.default_rng(2)
    w = weight(Q.Q4_K, 256, 9, 2)
    x = floats(rng, 3, 256)
    for call in (lambda h: h.linear(w, int(Q.Q4_K), 256, 9, x[:1]), lambda h: h.linear(w, int(Q.Q4_K), 256, 9, x),
                 lambda h: h.rms_norm(x, x[0], 1e-6), lambda h: h.head_rms_norm(x, 4, 64, 1e-6),
                 lambda h: h.swiglu(x, x * 2, 1.0, 1.5), lambda h: h.argmax(x[1])):
        assert_exact(np.atleast_1d(call(other)), np.atleast_1d(call(emu)), order)


@pytest.mark.parametrize("cap", [32, 64])
def test_pipelines_capped_below_the_host_defaults(emu, cap):
    """maxTotalThreadsPerThreadgroup below what the host prefers (Apple GPUs lower it for
    register-heavy kernels): the host sizes threadgroups within the cap — fewer simdgroups per
    mat-vec group and norm, mat-vec instead of the 128-thread mat-mat — with the same results
    within the same bounds (the mat-vec bound where the mat-vec ran)."""
    from ds4 import metal_emu

    lib = metal_emu.load()
    before = lib.max_threads_per_threadgroup
    lib.set_max_threads_per_threadgroup(cap)
    try:
        capped = core.OpHarness("metal-emu", "", 1)     # its pipelines report the cap
        rng = np.random.default_rng(cap)
        n, rows = 512, 13
        w = weight(Q.Q4_K, n, rows, cap)
        x = floats(rng, 3, n)
        check_bound(capped.linear(w, int(Q.Q4_K), n, rows, x), REFERENCE.linear(w, int(Q.Q4_K), n, rows, x),
                    matvec_bound(Q.Q4_K, w, n, rows, x))
        y = floats(rng, 2, 700)
        want = REFERENCE.rms_norm(y, None, 1e-6)
        check_bound(capped.rms_norm(y, None, 1e-6), want, (700 / 2 + 4) * U * np.abs(want) + 1e-37)
        assert capped.argmax(y[0]) == REFERENCE.argmax(y[0])
    finally:
        lib.set_max_threads_per_threadgroup(before)


def test_a_failed_dispatch_is_a_ds4_error_naming_the_kernel(emu):
    """A dispatch the emulator refuses (here: the runtime's thread cap lowered after the pipelines
    reported theirs, so the host's threadgroup is too large) surfaces as a ds4 error naming the
    kernel, raised where the stream waits; the stream then works again."""
    from ds4 import metal_emu

    lib = metal_emu.load()
    x = floats(np.random.default_rng(0), 2, 700)
    emu.rms_norm(x, None, 1e-6)                  # pipelines created under the default cap
    before = lib.max_threads_per_threadgroup
    lib.set_max_threads_per_threadgroup(64)
    try:
        with pytest.raises(ds4.errors.Ds4Error, match="rms_norm_f32"):
            emu.rms_norm(x, None, 1e-6)
    finally:
        lib.set_max_threads_per_threadgroup(before)
    assert_exact(emu.rms_norm(x, None, 1e-6), emu.rms_norm(x, None, 1e-6), "after the failure")
