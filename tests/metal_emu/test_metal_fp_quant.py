"""FP8 / FP4 round trips on the emulator: bit-identical to ds4.reference (which the CPU layers
match bit for bit), at the exponent and rounding-tie corner cases. Exact equality is the check,
so any wrong bit fails."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ds4.metal_emu import ops
from ds4.reference import fp4 as ref4, fp8 as ref8

FAST = settings(max_examples=15, deadline=None)


def _probe(emu, kernel, v, *extra):
    v = np.ascontiguousarray(v, np.float32)
    out = np.zeros_like(v)
    emu.dispatch(kernel, buffers=[v, out, *extra], grid=(v.size, 1, 1), threads=(64, 1, 1), grid_is_threads=True)
    return out


def _pow2_cases():
    # Every exponent the scales can take, with the smallest and largest mantissas (where log2f
    # rounds onto an integer), plus random values.
    e = np.arange(-126, 128)
    mant = np.concatenate([np.arange(0, 64), (1 << 23) - 1 - np.arange(0, 8)])
    bits = ((e[:, None] + 127) << 23 | mant[None, :]).astype(np.uint32).reshape(-1)
    rng = np.random.default_rng(0)
    rnd = rng.integers(1 << 23, 255 << 23, size=20000, dtype=np.uint32)
    return np.concatenate([bits, rnd]).view(np.float32)


@pytest.mark.parametrize("qmax", [1.0, 448.0, 6.0])
def test_pow2_scale_matches_log2f_rounding(emu, qmax):
    amax = _pow2_cases()
    if qmax != 1.0:
        amax = amax[(amax / np.float32(qmax)) >= np.float32(2.0**-126)]
    with np.errstate(over="ignore"):
        want = ref8.pow2_scale(amax, qmax)
    got = _probe(emu, "probe_pow2_scale", amax, np.array([qmax], np.float32))
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, f"{bad.size} differ, e.g. amax={amax[bad[:3]]} got {got[bad[:3]]} want {want[bad[:3]]}"


def test_e4m3_and_e2m1_rounding_at_every_tie(emu):
    codes8 = ref8.E4M3_VALUES
    mids8 = (codes8[:-1] + codes8[1:]) / 2
    v8 = np.concatenate([codes8, mids8, np.nextafter(mids8, 0), np.nextafter(mids8, 1000), [448.0, 500.0, 1e-30]])
    v8 = np.concatenate([v8, -v8]).astype(np.float32)
    assert (_probe(emu, "probe_e4m3", v8).view(np.uint32) == ref8.e4m3_round(v8).view(np.uint32)).all()
    codes4 = ref4.E2M1_VALUES
    mids4 = (codes4[:-1] + codes4[1:]) / 2
    v4 = np.concatenate([codes4, mids4, np.nextafter(mids4, 0), np.nextafter(mids4, 10), [6.0, 7.0, 1e-30]])
    v4 = np.concatenate([v4, -v4]).astype(np.float32)
    assert (_probe(emu, "probe_e2m1", v4).view(np.uint32) == ref4.e2m1_round(v4).view(np.uint32)).all()


def _rows(data, n):
    rows = data.draw(st.integers(1, 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((rows, n)).astype(np.float32)
    scale = np.float32(2.0 ** data.draw(st.sampled_from([-40, -12, 0, 5, 20])))
    x *= scale
    if data.draw(st.booleans()):
        x[:, ::7] = 0.0                              # zeros and exact code values
        x[:, 1::11] = np.float32(448.0) * scale
    return x


@FAST
@given(data=st.data())
def test_fp8_kv_roundtrip_is_bit_exact(emu, data):
    n_rot = data.draw(st.sampled_from([0, 64]))
    head_dim = 64 * data.draw(st.integers(1, 3)) + n_rot
    x = _rows(data, head_dim)
    got = ops.fp8_kv_roundtrip(ops.checked(emu), x, n_rot)
    want = np.stack([ref8.fp8_kv_roundtrip(r, n_rot) for r in x])
    assert got.tobytes() == want.tobytes()


@FAST
@given(data=st.data())
def test_fp4_roundtrip_and_indexer_step_are_bit_exact(emu, data):
    x = _rows(data, 128)
    run = ops.checked(emu)
    assert ops.fp4_roundtrip(run, x).tobytes() == np.stack([ref4.fp4_roundtrip(r) for r in x]).tobytes()
    assert ops.indexer_qat(run, x).tobytes() == ref4.indexer_qat(x).tobytes()
