"""Hyper-connection kernels against ds4.reference.hc. The weighted sum and the post step add in
the CPU's order (bit-identical). The split uses exp (the C library's in the emulator, so the
split is bit-identical here too); a GPU's exp may differ by a few ulps and Sinkhorn's ~2*iters
normalisations carry that along: bound 32u*|cpu| + 1e-9 (the eps floor)."""

import numpy as np
from hypothesis import given, settings, strategies as st

from ds4.metal_emu import ops
from ds4.reference import hc as ref

U = 2.0**-24
FAST = settings(max_examples=12, deadline=None)


@FAST
@given(data=st.data())
def test_hc_split_sinkhorn(emu, data):
    n = data.draw(st.sampled_from([2, 4]))
    iters = data.draw(st.sampled_from([1, 3, 20]))
    tokens = data.draw(st.integers(1, 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    mix = (rng.standard_normal((tokens, 2 * n + n * n)) * 3).astype(np.float32)
    scale = rng.standard_normal(3).astype(np.float32)
    base = rng.standard_normal(2 * n + n * n).astype(np.float32)
    got = ops.hc_split(ops.checked(emu), mix, scale, base, n, iters, 1e-6)
    for t in range(tokens):
        s = ref.hc_split(mix[t], scale, base, n, iters, 1e-6)
        want = np.concatenate([s.pre, s.post, s.comb.reshape(-1)])
        assert (np.abs(got[t] - want) <= 32 * U * np.abs(want) + 1e-9).all()


@FAST
@given(data=st.data())
def test_hc_weighted_sum_and_post_are_bit_exact(emu, data):
    n, n_embd, tokens = 4, data.draw(st.integers(1, 100)), data.draw(st.integers(1, 2))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    H = rng.standard_normal((tokens, n, n_embd)).astype(np.float32)
    block = rng.standard_normal((tokens, n_embd)).astype(np.float32)
    splits = [ref.hc_split(rng.standard_normal(24).astype(np.float32), np.ones(3, np.float32),
                           np.zeros(24, np.float32), n, 3, 1e-6) for _ in range(tokens)]
    split = np.stack([np.concatenate([s.pre, s.post, s.comb.reshape(-1)]) for s in splits])
    run = ops.checked(emu)
    x = ops.hc_weighted_sum(run, H, split, n, n_embd)
    out = ops.hc_post(run, block, H, split, n)
    for t in range(tokens):
        assert x[t].tobytes() == ref.hc_weighted_sum(H[t], splits[t].pre).tobytes()
        assert out[t].tobytes() == ref.hc_post(block[t], H[t], splits[t]).reshape(-1).tobytes()


def test_hc_collapse_composes_to_the_reference(emu):
    """Output-head collapse from kernels: plain RMS norm of the flat streams, the F32 mix
    projection (matvec), the stream weights, the weighted sum. Bounds: the norm's (n/2+4)u and the
    mat-vec's 2*n*u*S relative, carried through the sigmoid (slope <= 1/4) and the weighted sum."""
    from ds4.reference.numerics import rms_norm_no_weight, sigmoid

    n, n_embd = 4, 64
    rng = np.random.default_rng(2)
    H = rng.standard_normal((n, n_embd)).astype(np.float32)
    fn = (rng.standard_normal((n, n * n_embd)) * 0.05).astype(np.float32)
    scale = np.array([0.7], np.float32)
    base = rng.standard_normal(n).astype(np.float32)
    run = ops.checked(emu)
    flat = ops.rms_norm(run, H.reshape(1, -1), None, 1e-6)
    pre = ops.matvec(run, 0, fn.view(np.uint8), (n * n_embd, n), ops.quantize_act(run, 0, flat))
    split = ops.hc_collapse_weights(run, pre, scale, base, n, 1e-6)
    got = ops.hc_weighted_sum(run, H.reshape(1, -1), split, n, n_embd)[0]
    flat_ref = rms_norm_no_weight(H.reshape(-1), 1e-6)
    w_ref = (sigmoid((fn.astype(np.float64) @ flat_ref).astype(np.float32) * scale[0] + base) + np.float32(1e-6))
    want = ref.hc_weighted_sum(H, w_ref.astype(np.float32))
    S = np.abs(fn).astype(np.float64) @ np.abs(flat_ref)
    dw = 0.25 * abs(scale[0]) * (2 * n * n_embd * U * S + (n * n_embd / 2 + 4) * U * S) + 8 * U
    assert (np.abs(got - want) <= np.abs(H).T @ dw + 4 * n * U * np.abs(want) + 1e-30).all()
