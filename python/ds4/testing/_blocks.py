"""Seeded random weights in ggml block formats (docs/model.md §4.1), scaled to a target std.

Q8_0 is quantised from gaussian weights (gguf.quants). gguf cannot quantise Q2_K, Q4_K or IQ2_XXS,
so for those we draw valid random blocks directly: random codes with f16 block scales chosen so the
dequantised weights have roughly the requested standard deviation and mean close to zero.
"""

from __future__ import annotations

import numpy as np

from ..gguf_header import GGMLType

__all__ = ["random_q8_0", "random_q2_k", "random_q4_k", "random_iq2_xxs", "random_quant"]

QK_K = 256


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype("<f2").view(np.uint8).reshape(*x.shape, 2)


def random_q8_0(rng: np.random.Generator, rows: int, cols: int, std: float) -> np.ndarray:
    """[rows, cols/32*34] bytes: gaussian(0, std) weights quantised to Q8_0 (chunked: bounded memory)."""
    from gguf import quants

    out = np.empty((rows, cols // 32 * 34), dtype=np.uint8)
    step = max(1, (1 << 22) // cols)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        w = (rng.standard_normal((r1 - r0, cols), dtype=np.float32) * np.float32(std))
        out[r0:r1] = quants.quantize(w, GGMLType.Q8_0)
    return out


def random_q2_k(rng: np.random.Generator, n_blocks: int, std: float) -> np.ndarray:
    """[n_blocks, 84] Q2_K blocks. Each 16-weight group has scale sc in 4..10 and min m=round(1.5 sc)
    with dmin = d, so w = d(sc q - m) ~ d sc (q - 1.5): zero-mean, E[w^2] ~ 65 d^2."""
    sc = rng.integers(4, 11, size=(n_blocks, 16), dtype=np.uint8)
    m = np.minimum(np.rint(1.5 * sc), 15).astype(np.uint8)
    qs = rng.integers(0, 256, size=(n_blocks, 64), dtype=np.uint8)
    d = np.full(n_blocks, std / np.sqrt(65.0), dtype=np.float32) * rng.uniform(0.8, 1.2, n_blocks).astype(np.float32)
    out = np.empty((n_blocks, 84), dtype=np.uint8)
    out[:, 0:16] = sc | (m << 4)
    out[:, 16:80] = qs
    out[:, 80:82] = _f16_bytes(d)
    out[:, 82:84] = _f16_bytes(d)
    return out


def pack_q4_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Pack 8 six-bit scales and mins per block into ggml's 12-byte Q4_K layout."""
    n = sc.shape[0]
    s = np.empty((n, 12), dtype=np.uint8)
    s[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    return s


def random_q4_k(rng: np.random.Generator, n_blocks: int, std: float) -> np.ndarray:
    """[n_blocks, 144] Q4_K blocks. Sub-block scale sc in 20..40, min m = round(7.5 sc / 8) with
    dmin = 8 d, so w ~ d sc (q - 7.5): zero-mean, E[w^2] ~ 933 * 21.25 d^2."""
    sc = rng.integers(20, 41, size=(n_blocks, 8), dtype=np.uint8)
    m = np.rint(7.5 * sc / 8.0).astype(np.uint8)
    d = np.full(n_blocks, std / np.sqrt(933.0 * 21.25), dtype=np.float32) * rng.uniform(0.8, 1.2, n_blocks).astype(np.float32)
    out = np.empty((n_blocks, 144), dtype=np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:4] = _f16_bytes(d * 8)
    out[:, 4:16] = pack_q4_k_scales(sc, m)
    out[:, 16:144] = rng.integers(0, 256, size=(n_blocks, 128), dtype=np.uint8)
    return out


def random_iq2_xxs(rng: np.random.Generator, n_blocks: int, std: float) -> np.ndarray:
    """[n_blocks, 66] IQ2_XXS blocks. Every bit pattern of the 64 code bytes is valid (grid
    indices are bytes, sign indices 7-bit, the scale 4-bit); E[w^2] ~ 85.25/16 * 552 d^2 (552: mean square of the grid bytes, measured)."""
    d = np.full(n_blocks, std / np.sqrt(85.25 / 16 * 552), dtype=np.float32) * rng.uniform(0.8, 1.2, n_blocks).astype(np.float32)
    out = np.empty((n_blocks, 66), dtype=np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:66] = rng.integers(0, 256, size=(n_blocks, 64), dtype=np.uint8)
    return out


_BLOCK_FNS = {
    GGMLType.Q2_K: (random_q2_k, 84),
    GGMLType.Q4_K: (random_q4_k, 144),
    GGMLType.IQ2_XXS: (random_iq2_xxs, 66),
}


def random_quant(rng: np.random.Generator, type_id: int, dims: tuple[int, ...], std: float) -> np.ndarray:
    """Bytes of a random tensor of ggml ``dims`` in k-quant/i-quant ``type_id``, shaped as gguf
    expects: reversed dims with ne0 replaced by its byte width."""
    fn, size = _BLOCK_FNS[GGMLType(type_id)]
    ne0 = dims[0]
    rows = 1
    for d in dims[1:]:
        rows *= d
    blocks = fn(rng, rows * (ne0 // QK_K), std)
    return blocks.reshape(*reversed(dims[1:]), ne0 // QK_K * size)
