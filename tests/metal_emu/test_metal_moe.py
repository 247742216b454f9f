"""Routed-expert mat-vec and the router on the emulator against the CPU (ds4._core) and the CPU's
routing rules."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given, settings, strategies as st

import ds4._core as core
from ds4.metal_emu import ops
from ds4.reference.numerics import softplus
from test_quant_blocks import activation, random_weights
from test_metal_quant import _bound, _check

U = 2.0**-24
FAST = settings(max_examples=10, deadline=None)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q2_K, Q.Q4_K, Q.IQ2_XXS, Q.F16, Q.BF16], ids=lambda q: q.name)
@FAST
@given(data=st.data())
def test_matvec_experts_matches_cpu(emu, qtype, data):
    """Each slot is a mat-vec of one expert: the mat-vec bound (test_quant) per slot."""
    elems = {Q.F16: 32, Q.BF16: 32, Q.Q8_0: 32}.get(qtype, 256)
    n = elems * data.draw(st.integers(1, 2))
    rows, n_expert = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 5))
    k = data.draw(st.integers(1, 4))
    shared = data.draw(st.booleans())
    seed = data.draw(st.integers(0, 2**32 - 1))
    raw = random_weights(qtype, n, rows * n_expert, seed)
    ids = np.random.default_rng(seed).integers(0, n_expert, size=k).astype(np.int32)
    x = activation(n, seed ^ 3, "normal", batch=1 if shared else k)
    run = ops.checked(emu)
    got = ops.matvec_experts(run, int(qtype), raw, (n, rows, n_expert), ids, ops.quantize_act(run, int(qtype), x))
    want = core.matvec_experts(int(qtype), raw, (n, rows, n_expert), ids, x[0] if shared else x)
    per_expert = raw.reshape(n_expert, -1)
    for s in range(k):
        xs = x[0 if shared else s]
        _check(got[s:s + 1], want[s:s + 1], _bound(qtype, per_expert[ids[s]], n, rows, None, xs))


def test_matvec_experts_bad_id_gives_nan_rows(emu):
    raw = random_weights(Q.Q8_0, 32, 6, 1)
    x = activation(32, 2, "normal")
    run = ops.checked(emu)
    y = ops.matvec_experts(run, int(Q.Q8_0), raw, (32, 3, 2), np.array([1, 7], np.int32), ops.quantize_act(run, 8, x))
    assert np.isfinite(y[0]).all() and np.isnan(y[1]).all()


def _cpu_route(logits, bias, hash_row, n_used, scale):
    """csrc/layers/moe.cpp route_token, in numpy float32."""
    probs = np.sqrt(softplus(logits)).astype(np.float32)
    if hash_row is not None:
        sel = np.asarray(hash_row, np.int64)
    else:
        biased = (probs + (bias if bias is not None else np.float32(0))).astype(np.float32)
        sel = np.array(sorted(range(probs.size), key=lambda e: (-biased[e], e))[:n_used])
    w = probs[sel]
    total = np.float32(0)
    for v in w:
        total = np.float32(total + v)
    total = max(total, np.float32(6.103515625e-5))
    return sel, (w / total * np.float32(scale)).astype(np.float32)


@pytest.mark.parametrize("hashed", [False, True])
@FAST
@given(data=st.data())
def test_router(emu, hashed, data):
    """Selection is exact (ties included). Weights: softplus/sqrt/division may differ by ulps on a
    GPU and the kernel's log1p is Goldberg's log(u)*e/(u-1) (a few ulps): bound 16u*|w|."""
    n_expert, n_used = data.draw(st.sampled_from([8, 20, 64, 256])), data.draw(st.integers(1, 8))
    tokens = data.draw(st.integers(1, 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    logits = (rng.standard_normal((tokens, n_expert)) * data.draw(st.sampled_from([1.0, 12.0]))).astype(np.float32)
    logits[:, ::9] = logits[:, 1:2]                                  # ties
    bias = rng.standard_normal(n_expert).astype(np.float32) * 0.1 if data.draw(st.booleans()) else None
    table = rng.integers(0, n_expert, size=(50, n_used)).astype(np.int32) if hashed else None
    ids = rng.integers(0, 50, size=tokens).astype(np.int32) if hashed else None
    sel, w = ops.router(ops.checked(emu), logits, bias, table, ids, n_used, 1.5)
    for t in range(tokens):
        want_sel, want_w = _cpu_route(logits[t], bias, table[ids[t]] if hashed else None, n_used, 1.5)
        assert np.array_equal(sel[t], want_sel)
        assert (np.abs(w[t] - want_w) <= 16 * U * np.abs(want_w)).all()


@pytest.mark.parametrize("gtype", [Q.Q2_K, Q.IQ2_XXS, Q.Q4_K], ids=lambda q: q.name)
def test_routed_experts_composition(emu, gtype):
    """The device chain against the CPU's, stage by stage. Activation quantisation is
    discontinuous, so the end result is compared on the GPU's own mid rows: the CPU's down experts
    (which quantise the same floats to the same bytes) summed in slot order, within the sum of
    the slots' mat-vec bounds. Gate and up are checked with the mat-vec bound, mid against the
    reference SwiGLU of the device's own gate/up rows (8u, as test_swiglu)."""
    from ds4.reference.moe import swiglu as ref_swiglu

    n_embd, n_ff, n_expert, n_used = 256, 512, 6, 3
    dtype_ = Q.Q2_K if gtype == Q.IQ2_XXS else gtype
    rng = np.random.default_rng(int(gtype))
    gate = random_weights(gtype, n_embd, n_ff * n_expert, 1)
    up = random_weights(gtype, n_embd, n_ff * n_expert, 2)
    down = random_weights(dtype_, n_ff, n_embd * n_expert, 3)
    x = activation(n_embd, 4, "normal")
    sel = rng.choice(n_expert, n_used, replace=False).astype(np.int32)
    w = rng.random(n_used).astype(np.float32)
    trace = {}
    out = ops.routed_experts(ops.checked(emu), int(gtype), int(dtype_), gate, up, down, n_embd, n_ff, n_expert, x, sel,
                             w, 10.0, trace)
    g_cpu = core.matvec_experts(int(gtype), gate, (n_embd, n_ff, n_expert), sel, x)
    u_cpu = core.matvec_experts(int(gtype), up, (n_embd, n_ff, n_expert), sel, x)
    gate_e, up_e = gate.reshape(n_expert, -1), up.reshape(n_expert, -1)
    for s in range(n_used):
        _check(trace["gate"][s:s + 1], g_cpu[s:s + 1], _bound(gtype, gate_e[sel[s]], n_embd, n_ff, None, x))
        _check(trace["up"][s:s + 1], u_cpu[s:s + 1], _bound(gtype, up_e[sel[s]], n_embd, n_ff, None, x))
    for s in range(n_used):
        want_mid = (ref_swiglu(trace["gate"][s], trace["up"][s], 10.0) * w[s]).astype(np.float32)
        assert (np.abs(trace["mid"][s] - want_mid) <= 8 * U * np.abs(want_mid) + 1e-38).all()
    down_e = down.reshape(n_expert, -1)
    d_cpu = core.matvec_experts(int(dtype_), down, (n_ff, n_embd, n_expert), sel, trace["mid"])
    want = np.zeros(n_embd, np.float32)
    bound = np.zeros(n_embd)
    for s in range(n_used):
        want = (want + d_cpu[s]).astype(np.float32)
        bound += _bound(dtype_, down_e[sel[s]], n_ff, n_embd, None, trace["mid"][s])[0]
    bound += 2 * n_used * U * np.abs(d_cpu).sum(axis=0)
    _check(out[None], want[None], bound[None])
