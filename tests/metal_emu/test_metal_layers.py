"""Layer kernels on the emulator against ds4.reference (which the CPU layers match):
RMS norm, RoPE, SwiGLU, attention with sinks."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ds4.metal_emu import ops
from ds4.reference import attention as ref_attn, moe as ref_moe, numerics as ref_num, rope as ref_rope
from ds4.reference.numerics import logf
from metal_bounds import attention_bound

U = 2.0**-24
FAST = settings(max_examples=12, deadline=None)


@pytest.mark.parametrize("weighted", [False, True])
@FAST
@given(data=st.data())
def test_rms_norm(emu, weighted, data):
    """The CPU sums squares in double, the kernel in float (per thread, then two simd_sum trees):
    the sum's relative error is at most n*u, which moves the scale 1/sqrt(mean + eps) by at most
    n*u/2, plus a few roundings of the scale and the products: |gpu - cpu| <= (n/2 + 4)*u*|cpu|."""
    n = data.draw(st.integers(1, 700))
    rows = data.draw(st.integers(1, 3))
    threads = data.draw(st.sampled_from([32, 50, 96, 256]))    # 50: a partial second simdgroup
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = (rng.standard_normal((rows, n)) * 2.0 ** rng.integers(-20, 20)).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32) if weighted else None
    got = ops.rms_norm(ops.checked(emu), x, w, 1e-6, threads=threads)
    want = np.stack([ref_num.rms_norm(r, w, 1e-6) if weighted else ref_num.rms_norm_no_weight(r, 1e-6) for r in x])
    assert (np.abs(got - want) <= (n / 2 + 4) * U * np.abs(want) + 1e-37).all()


def _rope_case(data):
    n_rot = data.draw(st.sampled_from([8, 64]))
    head_dim = n_rot + data.draw(st.sampled_from([0, 64]))
    yarn = data.draw(st.booleans())
    p = ref_rope.RopeParams(n_rot, 10000.0 if not yarn else 160000.0, 0.0625 if yarn else 1.0, 1.0 if yarn else 0.0,
                            1.0, 65536 if yarn else 0)
    if yarn:
        p = ref_rope.RopeParams(n_rot, p.freq_base, p.freq_scale, 1.0,
                                float(np.float32(1.0) / (np.float32(1.0) + np.float32(0.1) * logf(np.float32(16.0)))),
                                65536)
    return p, head_dim


@FAST
@given(data=st.data())
def test_rope_tail(emu, data):
    """Angles are built by the CPU's successive multiplications (same bits); the emulator's
    sin/cos are the C library's, as on the CPU, so results agree to the last bit here. On a GPU
    sin/cos differ by a few ulps: the stated bound, 8u*(|x0|+|x1|), allows that."""
    p, head_dim = _rope_case(data)
    n_head, rows = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2))
    pos0 = data.draw(st.sampled_from([0, 1, 37, 4096, 1_000_000]))
    inverse = data.draw(st.booleans())
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((rows, n_head * head_dim)).astype(np.float32)
    low, high = ref_rope.yarn_corr_dims(p) if p.ext_factor else (np.float32(0), np.float32(0))
    ts = np.float32(np.power(np.float64(np.float32(p.freq_base)), np.float64(np.float32(-2.0 / p.n_rot))))
    got = ops.rope_tail(ops.checked(emu), x, n_head, head_dim, p.n_rot, pos0, freq_scale=p.freq_scale,
                        ext_factor=p.ext_factor, attn_factor=p.attn_factor, corr_low=float(low), corr_high=float(high),
                        theta_scale=float(ts), mscale_ext=float(np.float32(1) + np.float32(0.1) * logf(np.float32(1) / np.float32(p.freq_scale))),
                        inverse=inverse)
    want = np.stack([ref_rope.rope_tail(x[r], n_head, head_dim, p, pos0 + r, inverse) for r in range(rows)])
    pair = np.abs(want).reshape(rows, n_head, head_dim // 2, 2).sum(-1).repeat(2, -1).reshape(want.shape)
    assert (np.abs(got - want) <= 8 * U * pair).all()


@FAST
@given(data=st.data())
def test_swiglu(emu, data):
    """exp may differ by a few ulps on a GPU; here it is the C library's. Bound: 8u*|cpu|."""
    n = data.draw(st.integers(1, 300))
    clamp = data.draw(st.sampled_from([0.0, 7.0]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    g = (rng.standard_normal(n) * 5).astype(np.float32)
    u = (rng.standard_normal(n) * 5).astype(np.float32)
    got = ops.swiglu(ops.checked(emu), g, u, clamp, 0.5)
    want = (ref_moe.swiglu(g, u, clamp) * np.float32(0.5)).astype(np.float32)
    assert (np.abs(got - want) <= 8 * U * np.abs(want) + 1e-38).all()


def _attn_case(data, n_head, head_dim):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    raw_cap = data.draw(st.integers(1, 9))
    n_raw = data.draw(st.integers(1, raw_cap))
    raw_first = data.draw(st.integers(0, raw_cap - 1))
    n_comp = data.draw(st.integers(0, 11))
    q = rng.standard_normal(n_head * head_dim).astype(np.float32)
    raw = rng.standard_normal((raw_cap, head_dim)).astype(np.float32)
    comp = rng.standard_normal((n_comp, head_dim)).astype(np.float32)
    sinks = (rng.standard_normal(n_head) * 3).astype(np.float32)
    mask = (rng.random(n_comp) < 0.6).astype(np.uint8) if n_comp and data.draw(st.booleans()) else None
    return q, raw, n_raw, raw_first, comp, mask, sinks


def _attn_ref(q, raw, n_raw, raw_first, comp, mask, sinks, n_head, head_dim):
    live = raw[[(raw_first + r) % raw.shape[0] for r in range(n_raw)]]
    allowed = mask.astype(bool) if mask is not None else None
    return ref_attn.attend(q, live, comp, allowed, sinks, n_head, head_dim), live


@FAST
@given(data=st.data())
def test_attention_decode(emu, data):
    n_head = data.draw(st.integers(1, 3))
    head_dim = data.draw(st.sampled_from([32, 64, 192, 256]))    # 192, 256: the tiny models
    q, raw, n_raw, raw_first, comp, mask, sinks = _attn_case(data, n_head, head_dim)
    sgs = data.draw(st.sampled_from([1, 2, 4]))
    got = ops.attention(ops.checked(emu), q, raw, n_raw, raw_first, comp, mask, sinks, n_head, head_dim, sgs)
    want, live = _attn_ref(q, raw, n_raw, raw_first, comp, mask, sinks, n_head, head_dim)
    assert (np.abs(got - want) <= attention_bound(q, live, comp, mask, n_head, head_dim)).all()


def test_attention_bound_catches_a_dropped_row(emu):
    """Leaving out one of 12 rows (an off-by-one in the ring or the mask) must fail the bound."""
    rng = np.random.default_rng(5)
    n_head, head_dim = 2, 64
    q = rng.standard_normal(n_head * head_dim).astype(np.float32) * 0.2
    raw = rng.standard_normal((8, head_dim)).astype(np.float32)
    comp = rng.standard_normal((4, head_dim)).astype(np.float32)
    sinks = np.zeros(n_head, np.float32)
    got = ops.attention(ops.checked(emu), q, raw, 8, 3, comp, None, sinks, n_head, head_dim)
    want, live = _attn_ref(q, raw, 8, 3, comp, None, sinks, n_head, head_dim)
    bound = attention_bound(q, live, comp, None, n_head, head_dim)
    assert (np.abs(got - want) <= bound).all()
    dropped, _ = _attn_ref(q, raw, 7, 3, comp, None, sinks, n_head, head_dim)
    assert (np.abs(dropped - want) > bound).any()
    mask = np.array([1, 1, 0, 1], np.uint8)
    masked = ops.attention(ops.checked(emu), q, raw, 8, 3, comp, mask, sinks, n_head, head_dim)
    assert (np.abs(masked - want) > bound).any()
