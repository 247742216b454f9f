"""The KV compressor: slots, pooling, emission schedule, two-lane overlap, shift, reset (docs/model.md §3.7)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ds4.reference.compressor import CompressorWeights, compressor_pool, compressor_step, compressor_write
from ds4.reference.fp8 import fp8_kv_roundtrip
from ds4.reference.numerics import NEG, rms_norm
from ds4.reference.rope import rope_params, rope_tail
from ds4.reference.state import CompressorState
from ds4.shape import FLASH

from gguf import GGMLQuantizationType
from ds4.reference.weights import Tensor


def f32_tensor(name, values):
    v = np.ascontiguousarray(values, dtype=np.float32)
    return Tensor(name, GGMLQuantizationType.F32, tuple(reversed(v.shape)), v)

HD = 192  # attention-width lane in these tests (FP8 path); n_rot 64
N_EMBD = 32


def _weights(ratio, hd, seed=0, ape_scale=0.3):
    rng = np.random.default_rng(seed)
    width = (2 if ratio == 4 else 1) * hd
    return CompressorWeights(
        f32_tensor("kv", rng.standard_normal((width, N_EMBD)) * 0.3),
        f32_tensor("gate", rng.standard_normal((width, N_EMBD)) * 0.3),
        f32_tensor("ape", rng.standard_normal((ratio, width)) * ape_scale),
        f32_tensor("norm", 1 + 0.1 * rng.standard_normal(hd)),
    )


def _run(ratio, n_tokens, hd=HD, seed=0):
    w = _weights(ratio, hd, seed)
    st_ = CompressorState(ratio, hd)
    rope = rope_params(FLASH, ratio)
    rng = np.random.default_rng(seed + 1)
    xs = rng.standard_normal((n_tokens, N_EMBD)).astype(np.float32)
    rows = [compressor_step(st_, w, xs[p], p, rope, HD, 1e-6) for p in range(n_tokens)]
    return w, st_, xs, rows


@pytest.mark.parametrize("ratio", [4, 128])
def test_row_emitted_exactly_at_ratio_boundaries(ratio):
    n = 2 * ratio + 3
    _, _, _, rows = _run(ratio, n)
    emitted = [p for p, r in enumerate(rows) if r is not None]
    assert emitted == [p for p in range(n) if (p + 1) % ratio == 0]


def test_initial_state():
    for ratio, hd in ((4, 512), (128, 512), (4, 128)):
        s = CompressorState(ratio, hd)
        coff = 2 if ratio == 4 else 1
        assert s.kv.shape == (coff * ratio, coff * hd) and not s.kv.any()
        assert np.all(s.score == NEG)


def _softmax_pool(scores, kvs):
    """Per-dimension softmax-weighted mean over candidates (axis 0), in double."""
    s = scores.astype(np.float64)
    w = np.exp(s - s.max(axis=0))
    return (w * kvs).sum(axis=0) / w.sum(axis=0)


def test_ratio128_pooling_is_per_dimension_softmax():
    w, st_, xs, rows = _run(128, 128)
    kv = xs.astype(np.float64) @ w.kv.values.T.astype(np.float64)
    sc = xs.astype(np.float64) @ w.gate.values.T.astype(np.float64) + w.ape.values
    pooled = _softmax_pool(sc, kv)
    # compare through the rest of the pipeline computed independently
    y = rms_norm(pooled.astype(np.float32), w.norm.values, 1e-6)
    y = fp8_kv_roundtrip(rope_tail(y, 1, HD, rope_params(FLASH, 128), 0), 64)
    # FP8 keeps 3 mantissa bits: a 1e-6 pooling difference can flip one code (2^-4 relative)
    np.testing.assert_allclose(rows[127], y, rtol=2**-3, atol=1e-3)
    np.testing.assert_allclose(compressor_pool(st_), pooled, rtol=1e-5, atol=1e-6)


def test_identical_scores_pool_to_the_mean():
    s = CompressorState(128, 64)
    rng = np.random.default_rng(0)
    s.kv[:] = rng.standard_normal(s.kv.shape).astype(np.float32)
    s.score[:] = 0.75
    np.testing.assert_allclose(compressor_pool(s), s.kv.mean(axis=0), rtol=1e-5, atol=1e-6)


def test_empty_pool_is_zero():
    s = CompressorState(128, 64)
    s.kv[:] = 5.0
    assert not compressor_pool(s).any()  # every score NEG (<= -5e29): output 0


def test_ratio4_two_lanes_and_shift():
    w, st_, xs, rows = _run(4, 8)
    kv = xs.astype(np.float64) @ w.kv.values.T.astype(np.float64)
    sc = xs.astype(np.float64) @ w.gate.values.T.astype(np.float64) + np.tile(w.ape.values, (2, 1))
    # first window (tokens 0..3): the previous lane is empty, so only second halves pool
    first = _softmax_pool(sc[0:4, HD:], kv[0:4, HD:])
    # second window (tokens 4..7): first halves of tokens 0..3 and second halves of 4..7
    second = _softmax_pool(np.concatenate([sc[0:4, :HD], sc[4:8, HD:]]),
                           np.concatenate([kv[0:4, :HD], kv[4:8, HD:]]))
    # pooling before each shift, step by step on a fresh state
    s2 = CompressorState(4, HD)
    for p in range(4):
        compressor_write(s2, w, xs[p], p)
    np.testing.assert_allclose(compressor_pool(s2), first, rtol=1e-5, atol=1e-6)
    s2 = CompressorState(4, HD)
    for p in range(4):
        compressor_step(s2, w, xs[p], p, rope_params(FLASH, 4), HD, 1e-6)
    for p in range(4, 8):
        compressor_write(s2, w, xs[p], p)
    np.testing.assert_allclose(compressor_pool(s2), second, rtol=1e-5, atol=1e-6)
    # after the shift the "previous" rows 0..3 hold tokens 4..7, rows 4..7 keep the same values
    np.testing.assert_allclose(st_.kv[:4], kv[4:8], rtol=1e-5, atol=1e-6)
    assert np.array_equal(st_.kv[4:], st_.kv[:4]) and np.array_equal(st_.score[4:], st_.score[:4])
    r = rope_params(FLASH, 4)
    for row, pooled, p in ((rows[3], first, 3), (rows[7], second, 7)):
        y = rms_norm(pooled.astype(np.float32), w.norm.values, 1e-6)
        y = fp8_kv_roundtrip(rope_tail(y, 1, HD, r, p + 1 - 4), 64)  # RoPE at p+1-ratio
        np.testing.assert_allclose(row, y, rtol=2**-3, atol=1e-3)


def test_ape_goes_to_scores_only():
    w = _weights(128, 64)
    w.ape = f32_tensor("ape", np.full((128, 64), 3.0))
    s = CompressorState(128, 64)
    x = np.ones(N_EMBD, np.float32)
    compressor_step(s, w, x, 5, rope_params(FLASH, 128), 512, 1e-6)
    # float64-accumulated products vs numpy's float32 matvec: a few float32 ulps
    np.testing.assert_allclose(s.kv[5], w.kv.values @ x, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(s.score[5], w.gate.values @ x + 3.0, rtol=1e-6, atol=1e-6)
    assert np.all(s.score[np.arange(128) != 5] == NEG)


def test_indexer_width_lane_gets_hadamard_fp4():
    from ds4.reference.fp4 import E2M1_VALUES
    _, _, _, rows = _run(4, 4, hd=128)
    row = rows[3]
    # each 32-block is E2M1 codes times a power of two (FP4), including the RoPE'd half
    for b in range(4):
        blk = row[b * 32:(b + 1) * 32]
        scale = 2.0 ** np.ceil(np.log2(np.abs(blk).max() / 6.0))
        assert np.all(np.isin(np.abs(blk / scale), E2M1_VALUES))


@given(st.integers(0, 600), st.sampled_from([4, 128]))
def test_finish_prefill_resets_unwritten_slots(n, ratio):
    s = CompressorState(ratio, 8)
    s.kv[:] = 1.0
    s.score[:] = 2.0
    s.finish_prefill(n)
    rem = n % ratio
    reset = np.zeros(s.kv.shape[0], bool)
    if ratio == 4:
        reset[4 + rem:8] = True
    else:
        reset[rem:] = True
    assert np.all(s.kv[reset] == 0) and np.all(s.score[reset] == NEG)
    assert np.all(s.kv[~reset] == 1) and np.all(s.score[~reset] == 2)
