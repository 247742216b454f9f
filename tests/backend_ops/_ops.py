"""Backends under test, tolerances (each next to its reason) and input generators."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import ds4
import ds4._core as core
from ds4.backends import load_metal_emu
from _gpu_backends import compared_backends
from test_quant_blocks import random_weights

THREADS = 2

# The reference: the CPU backend on the scalar path (upstream's strict build, bit for bit).
REFERENCE = core.OpHarness("cpu", "scalar", THREADS)


def _backends_under_test() -> list:
    """pytest params (name, harness): every CPU SIMD path, then the backends compared with the CPU
    (tests/_gpu_backends.py: every available GPU backend and metal-emu, skipped with the reason
    where it cannot be built; or exactly those $DS4_TEST_BACKENDS names)."""
    out = [pytest.param(f"cpu-{p}", core.OpHarness("cpu", p, THREADS), id=f"cpu-{p}") for p in core.simd_paths()]
    for name, skip in compared_backends():
        if skip:
            out.append(pytest.param(name, None, id=name, marks=pytest.mark.skip(reason=skip)))
            continue
        if name == "metal-emu":
            load_metal_emu()        # compiles the kernels the first time (cached on disk)
        out.append(pytest.param(name, core.OpHarness(name, "", THREADS), id=name))
    return out


BACKENDS = _backends_under_test()
BACKEND_IDS = [p.id for p in BACKENDS]

# On the CPU backend only the dot products differ between SIMD paths (the quantised row dots of
# quant/, and the float dots of attention and indexer scoring, which use 8 interleaved partial
# sums off the scalar path); every other op runs the same code on every path, so those must be
# bit-identical. A non-CPU backend gets NMSE_FLOAT for its float ops instead.
CPU_PATH_EXACT_OPS = {
    "embed_tokens_hc", "rms_norm", "head_rms_norm", "hc_post", "rope_tail", "fp8_kv_roundtrip",
    "store_row_f16", "compressor_store", "compressor_pool", "compressor_shift", "top_k_mask", "router",
    "swiglu", "add", "fill", "copy", "argmax",
}

# NMSE = sum((got - want)^2) / sum(want^2).
# Float ops whose inputs carry only float32 reassociation differences (a dot of n terms in
# another order: relative error <= n*u, u = 2^-24, and typically sqrt(n)*u, i.e. ~1e-6 for the
# sizes here, so NMSE ~1e-12): 1e-9 leaves 1000x room, while one element of a 256-wide output
# off by 1 % already gives NMSE >= 1e-4 / 256 = 4e-7 (test_tolerances.py shows both sides).
NMSE_FLOAT = 1e-9
# Routed experts re-quantise each slot's SwiGLU output to Q8_K before the down projection: a
# reassociation difference can move a value across a rounding boundary and change it by a whole
# Q8_K step (block max / 127). One such flip in a 64-wide block moves the output by about
# (1/127)^2 / 64 ~ 1e-6 in NMSE; a real bug (wrong expert, weight, clamp, slot order) moves it by
# 1e-3 or more. So 1e-5: above a few flips, far below any structural error.
NMSE_REQUANT = 1e-5
# ds4.reference accumulates attention values in float64 and its matvecs exactly (float64 on the
# dequantised weights), where the engine follows upstream's float32 orders: again reassociation
# error only, relative ~1e-6 per value, so NMSE_FLOAT applies; where the reference re-quantises
# activations (grouped output, routed experts) rounding flips are possible: NMSE_REQUANT.


def nmse(got: np.ndarray, want: np.ndarray) -> float:
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    den = float(np.sum(want * want))
    num = float(np.sum((got - want) ** 2))
    return num / den if den > 0 else num


def assert_exact(got, want, what: str = "") -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    same = (got.view(np.uint8) == want.view(np.uint8)) if got.dtype == want.dtype else (got == want)
    if not np.all(same):
        bad = np.argwhere(~same.reshape(got.shape[0], -1) if got.ndim else ~same)[:5].tolist()
        raise AssertionError(f"{what}: not bit-identical (first differences at {bad})")


def assert_nmse(got, want, bound: float, what: str = "") -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.all(np.isfinite(got)), f"{what}: non-finite values"
    e = nmse(got, want)
    assert e <= bound, f"{what}: NMSE {e:.3g} > {bound:.1g}"


# The Metal kernels (docs/metal.md "Numerics") that are bit-identical to the CPU by construction:
# same operations in the same order (HC post, compressor store/shift) or exact integer and
# power-of-two helpers (FP8 round trip, top-k ranks). The other Metal ops differ from the CPU in
# float order only (rms_norm's float vs double sum, mat-vec block order, the online softmax, simd
# reductions), the per-element bounds of that table; NMSE_FLOAT covers them with room. Measured
# on metal-emu, worst NMSE over 40 draws of the shapes below: hc_pre 2.6e-12, hc_collapse_norm
# 1.6e-12, attention 1.3e-12, indexer scores 1.3e-13, router weights 3.4e-14, compressor_pool
# 1.4e-14 (the FP8/FP4 step after the float RMS sum: a rounding flip would show as ~1e-4), i.e.
# 380x or more below NMSE_FLOAT. Integer outputs (router selections) are exact on any backend.
METAL_EXACT_OPS = {"hc_post", "compressor_store", "compressor_shift", "top_k_mask", "fp8_kv_roundtrip"}


def assert_matches(op: str, backend: str, got, want, float_bound: float = NMSE_FLOAT) -> None:
    """The check an op's output must pass on `backend` against the CPU scalar reference."""
    if backend.startswith("cpu-") and op in CPU_PATH_EXACT_OPS:
        assert_exact(got, want, f"{op} on {backend}")
    elif backend in ("metal", "metal-emu") and op in METAL_EXACT_OPS:
        assert_exact(got, want, f"{op} on {backend}")
    elif np.issubdtype(np.asarray(got).dtype, np.integer):
        assert_exact(got, want, f"{op} on {backend}")     # indices (router selections): exact anywhere
    elif op in ("top_k_mask", "argmax", "fill", "copy", "store_row_f16", "fp8_kv_roundtrip"):
        assert_exact(got, want, f"{op} on {backend}")     # selections and round trips: exact anywhere
    else:
        assert_nmse(got, want, float_bound, f"{op} on {backend}")


def weight(qtype: Q, n: int, rows: int, seed: int) -> np.ndarray:
    """uint8 bytes of a random [rows x n] weight of qtype (finite everywhere)."""
    return random_weights(Q(qtype), n, rows, seed)


def floats(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def rope(n_rot: int, ratio: int) -> tuple:
    """The C++ RoPE parameters of a layer of this ratio with DeepSeek V4's defaults (YaRN on
    compressed layers)."""
    return core._rope_params(n_rot, 10000.0, 160000.0, 16.0, 65536, 32.0, 1.0, ratio)


def router_args(rng: np.random.Generator, nb: int, n_expert: int, n_used: int, mode: str) -> tuple:
    """Router op arguments: logits of nb tokens, their ids, and a bias ("bias"), a hash table of 50
    token rows ("hash") or neither ("topk"); weight scale 1.5."""
    n_used = min(n_used, n_expert)
    logits = floats(rng, nb, n_expert, scale=3.0)
    tokens = [int(t) for t in rng.integers(0, 50, nb)]
    bias = floats(rng, n_expert) if mode == "bias" else None
    hash_ = rng.integers(0, n_expert, (50, n_used)).astype(np.int32) if mode == "hash" else None
    return logits, tokens, bias, hash_, n_used, 1.5
