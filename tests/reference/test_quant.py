"""Activation quantisation (Q8_0 act, Q8_K) and the quantised matvec of ds4.reference.quant."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize as gguf_quantize
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from ds4.reference import quant

finite = st.floats(-1e4, 1e4, allow_nan=False, width=32)


def test_q8_0_act_hand_values():
    # amax = 127 gives d = 1 exactly, so x*id = x and rint's half-even rule is visible.
    x = np.zeros(32, np.float32)
    x[:6] = [127.0, 2.5, 3.5, -2.5, -0.5, 1.49]
    d, q = quant.quantize_q8_0_act(x)
    assert d.dtype == np.float32 and d[0] == 1.0
    assert q[0, :6].tolist() == [127, 2, 4, -2, 0, 1]


def test_q8_0_act_scale_is_not_rounded_to_f16():
    x = np.zeros(32, np.float32)
    x[0] = 1.0
    d, _ = quant.quantize_q8_0_act(x)
    assert d[0] == np.float32(1.0) / np.float32(127.0)
    assert d[0] != np.float32(np.float16(d[0]))  # 1/127 is not an f16 value: the scale stays f32


def test_q8_0_act_zero_block():
    d, q = quant.quantize_q8_0_act(np.zeros(64, np.float32))
    assert d.tolist() == [0.0, 0.0] and not q.any()


@given(arrays(np.float32, st.sampled_from([32, 96, 256]), elements=finite))
def test_q8_0_act_round_trip_bound(x):
    # a block whose amax/127 is subnormal has 1/d = inf (upstream too): outside the domain
    amax = np.abs(x.reshape(-1, 32)).max(axis=1)
    assume(np.all((amax == 0) | (amax > 1e-30)))
    d, q = quant.quantize_q8_0_act(x)
    back = quant.dequantize_q8_0_act(d, q).reshape(-1, 32)
    err = np.abs(back - x.reshape(-1, 32).astype(np.float64))
    # half a step plus float32 slack from forming x*id in float32 (relative 2^-23 of amax)
    bound = d.astype(np.float64)[:, None] * (0.5 + 1e-5)
    assert np.all(err <= bound + 1e-30)
    assert np.all(np.abs(q.astype(int)) <= 127)


def test_q8_k_first_max_and_sign_flip():
    x = np.zeros(256, np.float32)
    x[3], x[7] = -2.0, 2.0  # equal magnitude: the first one (negative) is "max"
    d, q, _ = quant.quantize_q8_k(x)
    # iscale = -127/-2 = 63.5, d = 1/63.5
    assert d[0] == np.float32(1.0) / np.float32(63.5)
    assert q[0, 3] == -127 and q[0, 7] == 127  # iscale*max == -127 always
    x[3], x[7] = 2.0, -2.0
    d, q, _ = quant.quantize_q8_k(x)
    assert q[0, 3] == -127 and q[0, 7] == 127 and d[0] < 0


def test_q8_k_zero_block():
    d, q, bs = quant.quantize_q8_k(np.zeros(512, np.float32))
    assert not d.any() and not q.any() and not bs.any()


@given(arrays(np.float32, st.sampled_from([256, 512]), elements=finite))
def test_q8_k_bsums_and_round_trip(x):
    amax = np.abs(x.reshape(-1, 256)).max(axis=1)
    assume(np.all((amax == 0) | (amax > 1e-30)))  # -127/max must stay finite
    d, q, bs = quant.quantize_q8_k(x)
    assert bs.dtype == np.int16 and bs.shape == (x.size // 256, 16)
    assert np.array_equal(bs.astype(int), q.reshape(-1, 16, 16).astype(int).sum(axis=2))
    back = quant.dequantize_q8_k(d, q).reshape(-1, 256)
    step = np.abs(d.astype(np.float64))[:, None]
    assert np.all(np.abs(back - x.reshape(-1, 256)) <= step * (0.5 + 1e-5) + 1e-30)


def test_act_type_for():
    assert quant.act_type_for(T.Q8_0) == T.Q8_0
    assert quant.act_type_for(T.Q2_K) == T.Q8_K
    assert quant.act_type_for(T.IQ2_XXS) == T.Q8_K
    assert quant.act_type_for(T.Q4_K) == T.Q8_K
    assert quant.act_type_for(T.F16) == T.F32
    assert quant.act_type_for(T.F32) == T.F32


def _naive_q8_0_matvec(raw, rows, cols, x):
    """Upstream formula: Σ_blocks f16(wd)·xd·(exact integer block sum), in Python floats."""
    xd, xq = quant.quantize_q8_0_act(x)
    out = []
    for r in range(rows):
        acc = 0.0
        for b in range(cols // 32):
            blk = raw[r, b * 34:(b + 1) * 34]
            wd = float(blk[:2].view(np.float16)[0])
            wq = blk[2:].view(np.int8).astype(int)
            isum = int((wq * xq[b].astype(int)).sum())
            acc += wd * float(xd[b]) * isum
        out.append(acc)
    return np.array(out)


@given(st.integers(0, 2**32 - 1), st.sampled_from([(3, 32), (5, 64), (2, 256)]))
def test_q8_0_matvec_equals_integer_block_sums(seed, shape):
    rows, cols = shape
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    raw = gguf_quantize(w, T.Q8_0)
    x = rng.standard_normal(cols).astype(np.float32)
    y = quant.matvec(T.Q8_0, raw, [cols, rows], x)
    ref = _naive_q8_0_matvec(raw, rows, cols, x)
    # both are (nearly) exact sums of the same products; only the final float32 cast may differ
    assert y.dtype == np.float32 and y.shape == (rows,)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
    ys = quant.matmul(T.Q8_0, raw, [cols, rows], np.stack([x, 2 * x]))
    assert np.array_equal(ys[0], y)


def _random_q2_k(rng, rows, cols):
    nb = rows * cols // 256
    raw = rng.integers(0, 256, size=(nb, 84), dtype=np.uint8)
    raw[:, 80:82] = np.full(nb, 0.01, np.float16).view(np.uint8).reshape(nb, 2)  # d
    raw[:, 82:84] = np.full(nb, 0.002, np.float16).view(np.uint8).reshape(nb, 2)  # dmin
    return raw.reshape(rows, -1)


def test_q2_k_matvec_uses_q8_k_activation():
    rng = np.random.default_rng(1)
    rows, cols = 4, 512
    raw = _random_q2_k(rng, rows, cols)
    x = rng.standard_normal(cols).astype(np.float32)
    y = quant.matvec(T.Q2_K, raw, [cols, rows], x)
    w = quant.dequantize(T.Q2_K, raw, [cols, rows])
    d, q, _ = quant.quantize_q8_k(x)
    ref = [sum(float(w[r, i]) * float(d[i // 256]) * int(q[i // 256, i % 256]) for i in range(cols))
           for r in range(rows)]
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-7)  # float64 sums in different order
    # and it is not the float-activation product (the quantisation really happened)
    assert not np.array_equal(y, (w.astype(np.float64) @ x).astype(np.float32))


def test_dequantize_shapes_and_errors():
    w = np.arange(64, dtype=np.float32).reshape(2, 32)
    assert np.array_equal(quant.dequantize(T.F32, w, [32, 2]), w)
    assert np.array_equal(quant.dequantize(T.F16, w.astype(np.float16), [32, 2]), w)
    with pytest.raises(ValueError):
        quant.dequantize(T.F32, w, [32, 3])
