"""Each layer test's tolerance is tight enough to catch the smallest bug of its kernel: the
kernel's result checked against a reference with one deliberate slip must fail the same bound
that the correct reference passes."""

import numpy as np

from ds4.metal_emu import ops
from ds4.reference import compressor as ref_comp, hc as ref_hc, moe as ref_moe, numerics as ref_num, rope as ref_rope
from types import SimpleNamespace

U = 2.0**-24


def _passes(got, want, bound):
    return bool((np.abs(got.astype(np.float64) - want) <= bound).all())


def test_rms_norm_bound_sees_an_off_by_one_mean(emu):
    n = 700
    x = np.random.default_rng(1).standard_normal((1, n)).astype(np.float32)
    got = ops.rms_norm(ops.checked(emu), x, None, 1e-6)[0]
    want = ref_num.rms_norm_no_weight(x[0], 1e-6)
    bound = (n / 2 + 4) * U * np.abs(want)
    slip = x[0] / np.sqrt((x[0].astype(np.float64) ** 2).sum() / (n - 1) + 1e-6)   # mean over n-1
    assert _passes(got, want, bound) and not _passes(got, slip, bound)


def test_rope_bound_sees_a_position_off_by_one(emu):
    p = ref_rope.RopeParams(64, 10000.0)
    x = np.random.default_rng(2).standard_normal(128).astype(np.float32)
    ts = np.float32(np.power(np.float64(np.float32(p.freq_base)), np.float64(np.float32(-2.0 / p.n_rot))))
    got = ops.rope_tail(ops.checked(emu), x, 1, 128, 64, 1000, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0,
                        corr_low=0.0, corr_high=0.0, theta_scale=float(ts), mscale_ext=1.0)[0]
    pair = lambda v: np.abs(v).reshape(-1, 2).sum(-1).repeat(2)
    want = ref_rope.rope_tail(x, 1, 128, p, 1000)
    slip = ref_rope.rope_tail(x, 1, 128, p, 1001)
    assert _passes(got, want, 8 * U * pair(want)) and not _passes(got, slip, 8 * U * pair(want))


def test_swiglu_bound_sees_a_missing_clamp(emu):
    rng = np.random.default_rng(3)
    g, u = (rng.standard_normal((2, 64)) * 10).astype(np.float32)
    got = ops.swiglu(ops.checked(emu), g, u, 7.0)
    want = ref_moe.swiglu(g, u, 7.0)
    slip = ref_moe.swiglu(g, u, 0.0)
    bound = 8 * U * np.abs(want) + 1e-38
    assert _passes(got, want, bound) and not _passes(got, slip, bound)


def test_hc_split_bound_sees_one_sinkhorn_round_less(emu):
    rng = np.random.default_rng(4)
    mix = (rng.standard_normal(24) * 3).astype(np.float32)
    scale, base = np.ones(3, np.float32), rng.standard_normal(24).astype(np.float32)
    got = ops.hc_split(ops.checked(emu), mix[None], scale, base, 4, 20, 1e-6)[0]
    flat = lambda s: np.concatenate([s.pre, s.post, s.comb.reshape(-1)])
    want = flat(ref_hc.hc_split(mix, scale, base, 4, 20, 1e-6))
    slip = flat(ref_hc.hc_split(mix, scale, base, 4, 19, 1e-6))
    bound = 32 * U * np.abs(want) + 1e-9
    assert _passes(got, want, bound) and not _passes(got, slip, bound)


def test_pool_bound_sees_a_dropped_frontier_row(emu):
    rng = np.random.default_rng(5)
    kv = rng.standard_normal((8, 64)).astype(np.float32)
    score = rng.standard_normal((8, 64)).astype(np.float32)
    got = ops.compressor_pool_state(ops.checked(emu), kv, score, 32, 4)
    want = ref_comp.compressor_pool(SimpleNamespace(ratio=4, head_dim=32, kv=kv, score=score))
    dropped = score.copy()
    dropped[3] = -1e30                                  # previous window's last row never written
    slip = ref_comp.compressor_pool(SimpleNamespace(ratio=4, head_dim=32, kv=kv, score=dropped))
    bound = (2 * 4 + 16) * U * np.abs(kv).max()
    assert _passes(got, want, bound) and not _passes(got, slip, bound)
