"""Random *valid* weight blocks for the kernel tests (and tests of the generator itself).

"Valid" means every f16/bf16/f32 scale or value is finite; every other byte is free, so codes,
packed scales, grid indices and sign indices cover their whole range. Scale modes push the f16
scales to the extremes (zero, subnormal, largest finite) and some blocks are all-zero.
Other test modules import these helpers (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from hypothesis import given, strategies as st

WEIGHT_TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q2_K, Q.Q4_K, Q.IQ2_XXS)
QUANT_TYPES = (Q.Q8_0, Q.Q2_K, Q.Q4_K, Q.IQ2_XXS)

# Byte offsets of the f16 scale fields inside one block: (d offsets, dmin offsets).
SCALE_FIELDS = {
    Q.Q8_0: ((0,), ()),
    Q.Q2_K: ((80,), (82,)),
    Q.Q4_K: ((0,), (2,)),
    Q.IQ2_XXS: ((0,), ()),
}

SCALE_MODES = ("normal", "zero", "subnormal", "huge", "mixed", "zero_blocks")

_F16_MAX = 0x7BFF  # 65504
_F16_MIN_SUB = 0x0001


def block_size(qtype: Q) -> tuple[int, int]:
    """(elements, bytes) per block."""
    return GGML_QUANT_SIZES[Q(qtype)]


def tensor_bytes(qtype: Q, n: int, rows: int) -> int:
    be, bb = block_size(qtype)
    return n // be * bb * rows


def _f16_scales(rng: np.random.Generator, count: int, mode: str) -> np.ndarray:
    if mode == "zero":
        return np.zeros(count, np.uint16)
    if mode == "subnormal":
        return rng.integers(_F16_MIN_SUB, 0x0400, size=count, dtype=np.uint16)
    if mode == "huge":
        return rng.integers(0x7800, _F16_MAX + 1, size=count, dtype=np.uint16)
    # A realistic spread: |d| in about [2^-14, 2^2], random sign bit.
    vals = (np.exp2(rng.uniform(-14, 2, size=count)) * rng.choice([-1.0, 1.0], size=count)).astype(np.float16)
    out = vals.view(np.uint16).copy()
    if mode == "mixed":
        pick = rng.integers(0, 4, size=count)
        out = np.where(pick == 1, np.uint16(0), out)
        out = np.where(pick == 2, rng.integers(1, 0x400, size=count, dtype=np.uint16), out)
        out = np.where(pick == 3, np.uint16(_F16_MAX), out)
    return out.astype(np.uint16)


def random_weights(qtype: Q, n: int, rows: int, seed: int, mode: str = "normal") -> np.ndarray:
    """uint8 bytes of a [rows x n] tensor of `qtype` with finite values everywhere."""
    qtype = Q(qtype)
    rng = np.random.default_rng(seed)
    total = rows * n
    if qtype == Q.F32:
        return (rng.standard_normal(total) * np.exp2(rng.integers(-8, 8, size=total))).astype(np.float32).view(np.uint8)
    if qtype == Q.F16:
        bits = _f16_scales(rng, total, "mixed" if mode in ("mixed", "huge", "subnormal") else "normal")
        return bits.view(np.uint8)
    if qtype == Q.BF16:
        # Any sign and mantissa; exponents within 2^+-40 (plus zeros/subnormals) so that products
        # with the test activations stay far from float32 overflow.
        sign = rng.integers(0, 2, size=total, dtype=np.uint16) << 15
        exp = rng.integers(127 - 40, 127 + 41, size=total).astype(np.uint16)
        if mode in ("mixed", "subnormal", "zero_blocks"):
            exp = np.where(rng.random(total) < 0.25, np.uint16(0), exp).astype(np.uint16)
        mant = rng.integers(0, 128, size=total, dtype=np.uint16)
        return (sign | (exp << 7) | mant).astype(np.uint16).view(np.uint8)
    be, bb = block_size(qtype)
    nblocks = total // be
    raw = rng.integers(0, 256, size=(nblocks, bb), dtype=np.uint8)
    d_off, m_off = SCALE_FIELDS[qtype]
    for off in d_off + m_off:
        raw[:, off : off + 2] = _f16_scales(rng, nblocks, mode if mode != "zero_blocks" else "normal").view(
            np.uint8
        ).reshape(nblocks, 2)
    if mode == "zero_blocks":
        raw[rng.random(nblocks) < 0.5] = 0
    return raw.reshape(-1)


def split_scales(qtype: Q, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two copies of the bytes: one with every dmin zeroed (the d part), one with every d zeroed
    (minus the min part). Their dequantisations bound the float error of a `d*isum - dmin*summs`
    combination (see test_kernels_matvec)."""
    qtype = Q(qtype)
    be, bb = block_size(qtype)
    d_off, m_off = SCALE_FIELDS.get(qtype, ((), ()))
    blocks = raw.reshape(-1, bb)
    d_part, m_part = blocks.copy(), blocks.copy()
    for off in m_off:
        d_part[:, off : off + 2] = 0
    for off in d_off:
        m_part[:, off : off + 2] = 0
    return d_part.reshape(-1), m_part.reshape(-1)


# ---- hypothesis strategies -------------------------------------------------------------------


@st.composite
def weight_case(draw, qtype: Q, max_rows: int = 6, max_blocks: int = 4):
    """(raw bytes, n, rows, mode) for a random valid tensor of qtype."""
    be, _ = block_size(qtype)
    per_block = be if be > 1 else 32
    n = per_block * draw(st.integers(1, max_blocks if be > 1 else 8))
    rows = draw(st.integers(1, max_rows))
    mode = draw(st.sampled_from(SCALE_MODES))
    seed = draw(st.integers(0, 2**32 - 1))
    return random_weights(qtype, n, rows, seed, mode), n, rows, mode


ACT_PATTERNS = ("normal", "scaled", "zeros", "one_hot", "ties", "tiny", "mixed_zero_blocks")


def activation(n: int, seed: int, pattern: str, batch: int | None = None) -> np.ndarray:
    """float32 activations (shape [n] or [batch, n]) exercising the quantisers' corner cases."""
    rng = np.random.default_rng(seed)
    shape = (n,) if batch is None else (batch, n)
    x = rng.standard_normal(shape).astype(np.float32)
    if pattern == "scaled":
        x = (x * np.float32(2.0 ** rng.integers(-30, 30))).astype(np.float32)
    elif pattern == "zeros":
        x[...] = 0
    elif pattern == "one_hot":
        x[...] = 0
        x.reshape(-1)[rng.integers(0, x.size)] = rng.choice([-3.5, 7.0, 1e-20])
    elif pattern == "ties":
        # Values on a half-integer grid of the block scale: x*id lands on k+0.5 ties (docs/model.md 4.6).
        x = (rng.integers(-254, 255, size=shape) / 2.0).astype(np.float32)
        x.reshape(-1)[::32] = 127.0
    elif pattern == "tiny":
        x = (x * np.float32(1e-38)).astype(np.float32)  # subnormal inputs
    elif pattern == "mixed_zero_blocks":
        flat = x.reshape(-1, 32)
        flat[rng.random(flat.shape[0]) < 0.5] = 0
    return x


# ---- tests of the generator itself -------------------------------------------------------------


@given(st.sampled_from(WEIGHT_TYPES), st.integers(0, 2**32 - 1), st.sampled_from(SCALE_MODES))
def test_generated_weights_are_finite_and_sized(qtype, seed, mode):
    from ds4.reference.quant import dequantize

    be, _ = block_size(qtype)
    n = 256 if be > 1 else 64
    raw = random_weights(qtype, n, 3, seed, mode)
    assert raw.dtype == np.uint8 and raw.size == tensor_bytes(qtype, n, 3)
    w = dequantize(qtype, raw, (n, 3))
    assert np.isfinite(w).all()
    if mode == "zero" and qtype in QUANT_TYPES:
        assert not w.any()


def test_split_scales_sums_back():
    from ds4.reference.quant import dequantize

    for qtype in (Q.Q2_K, Q.Q4_K):
        raw = random_weights(qtype, 512, 2, 7)
        d_part, m_part = split_scales(qtype, raw)
        w = dequantize(qtype, raw, (512, 2)).astype(np.float64)
        wd = dequantize(qtype, d_part, (512, 2)).astype(np.float64)
        wm = dequantize(qtype, m_part, (512, 2)).astype(np.float64)
        # d*sc*q - dmin*m with each product exact in float64 of float32 inputs, up to float32 rounding.
        np.testing.assert_allclose(wd + wm, w, rtol=1e-6, atol=1e-30)
