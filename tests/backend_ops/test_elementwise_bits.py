"""The vector element-wise kernels compute the scalar path's bits on hostile inputs.

quantize_act (Q8_0-act, Q8_K), the FP8 / FP4 round trips and SwiGLU have AVX2 and AVX-512 kernels
(quant/quantize_act_simd.inc, layers/fp_quant_simd.inc, layers/swiglu_simd.inc) that keep the
scalar code's per-element float operations, so they must match it bit for bit — not within a
tolerance — on every input the scalar code defines: ±0, subnormals, huge values, ±inf, NaN, and the
exact ties of each rounding rule. The row-wise ops the CPU backend now spreads over its thread pool
must also give the same bits for any thread count. test_ops_vs_cpu.py covers ordinary data; the
inputs here are the corner cases (docs/kernels.md "Element-wise kernels").
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given, settings, strategies as st

import ds4._core as core
from ds4.reference import fp4 as ref_fp4
from ds4.reference import fp8 as ref_fp8
from _ops import assert_exact, rope

X86_PATHS = [p for p in core.simd_paths() if p in ("avx2", "avx512", "avx512vnni")]
needs_x86 = pytest.mark.skipif(not X86_PATHS, reason="no x86 SIMD path on this CPU/build")
SOME = settings(max_examples=25, deadline=None, derandomize=True)   # same draws in every CI run

SPECIALS = np.array([0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, -5.9e-39, 3.4028235e38, -3.4028235e38,
                     np.inf, -np.inf, np.nan, -np.nan, 1e-30, 65504.0, 448.0, 6.0, 127.0, -128.0], np.float32)

# Inputs whose scaled values land exactly on each rule's ties: with one element at the format's
# maximum the block scale is 1 (Q8_0: d = 127/127; Q8_K: iscale = -127/-127; FP8: 2^ceil(log2(448/448));
# FP4: 2^ceil(log2(6/6))), so the other elements are rounded as given.
E4M3_CODES = np.array([ref_fp8._e4m3_value(i) for i in range(127)], np.float32)
E4M3_TIES = ((E4M3_CODES[:-1] + E4M3_CODES[1:]) / 2).astype(np.float32)      # exact midpoints
E2M1_TIES = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)


def hostile(rng: np.random.Generator, n: int, family: str) -> np.ndarray:
    """n float32 values (n a multiple of the block) of one corner-case family."""
    if family == "wide":            # every binade from subnormal to near-overflow, both signs
        x = rng.standard_normal(n) * 2.0 ** rng.integers(-150, 120, n)
    elif family == "specials":      # ordinary values with zeros, subnormals, huge, inf and NaN mixed in
        x = rng.standard_normal(n)
        pick = rng.random(n) < 0.3
        x[pick] = rng.choice(SPECIALS, pick.sum())
    elif family == "subnormal":     # whole blocks below the smallest normal (reciprocal scales overflow)
        x = rng.integers(-2**22, 2**22, n).astype(np.float64) * 2.0 ** -149
    elif family == "q8_ties":       # k + 0.5 after scaling, with the block maximum first (Q8_0 and Q8_K)
        x = rng.integers(-254, 255, n) / 2.0
        x[::32] = 127.0
        x[::256] = -127.0
    elif family == "e4m3_ties":
        x = rng.choice(E4M3_TIES, n) * rng.choice([-1.0, 1.0], n)
        x[::32] = 448.0
    elif family == "e2m1_ties":
        x = rng.choice(E2M1_TIES, n) * rng.choice([-1.0, 1.0], n)
        x[::32] = 6.0
    else:
        raise ValueError(family)
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float32)


FAMILIES = st.sampled_from(["wide", "specials", "subnormal", "q8_ties", "e4m3_ties", "e2m1_ties"])
# A few values hypothesis picks itself (any float32, NaN and inf included), dropped in at drawn places.
INSERTS = st.lists(st.tuples(st.integers(0, 10**6), st.floats(width=32)), max_size=6)


def draw(seed: int, n: int, family: str, inserts) -> np.ndarray:
    x = hostile(np.random.default_rng(seed), n, family)
    for at, v in inserts:
        x[at % n] = v
    return x


def on_path(path: str, fn):
    before = core.simd_path()
    core.set_simd_path(path)
    try:
        return fn()
    finally:
        core.set_simd_path(before)


@needs_x86
@SOME
@given(nblocks=st.integers(1, 9), family=FAMILIES, inserts=INSERTS, seed=st.integers(0, 2**32 - 1))
def test_quantize_act_vector_kernels_match_scalar_bytes(nblocks, family, inserts, seed):
    x = draw(seed, 256 * nblocks, family, inserts).reshape(nblocks, 256)
    for wtype in (Q.Q8_0, Q.Q2_K):   # Q8_0 activations (blocks of 32) and Q8_K (blocks of 256)
        want = on_path("scalar", lambda: core.quantize_act(int(wtype), x))
        for path in X86_PATHS:
            assert_exact(on_path(path, lambda: core.quantize_act(int(wtype), x)), want, f"{wtype.name} act on {path}")


@needs_x86
@SOME
@given(nope_blocks=st.integers(1, 7), n_rot=st.sampled_from([0, 64]), rows=st.integers(1, 5), family=FAMILIES,
       inserts=INSERTS, seed=st.integers(0, 2**32 - 1))
def test_fp8_round_trip_vector_kernels_match_scalar(nope_blocks, n_rot, rows, family, inserts, seed):
    x = draw(seed, rows * (64 * nope_blocks + n_rot), family, inserts).reshape(rows, -1)
    want = core.OpHarness("cpu", "scalar", 1).fp8_kv_roundtrip(x, n_rot)
    for path in X86_PATHS:
        assert_exact(core.OpHarness("cpu", path, 1).fp8_kv_roundtrip(x, n_rot), want, f"fp8 round trip on {path}")


@needs_x86
@SOME
@given(nblocks=st.integers(1, 12), family=FAMILIES, inserts=INSERTS, seed=st.integers(0, 2**32 - 1))
def test_fp4_round_trip_vector_kernels_match_scalar(nblocks, family, inserts, seed):
    x = draw(seed, 32 * nblocks, family, inserts)
    want = core.OpHarness("cpu", "scalar", 1).fp4_roundtrip(x)
    for path in X86_PATHS:
        assert_exact(core.OpHarness("cpu", path, 1).fp4_roundtrip(x), want, f"fp4 round trip on {path}")


@needs_x86
@SOME
@given(n=st.integers(1, 300), rows=st.integers(1, 3), clamp=st.sampled_from([0.0, 1e-7, 10.0]),
       scale=st.sampled_from([1.0, 0.37, -2.5]), family=st.sampled_from(["wide", "specials", "subnormal"]),
       inserts=INSERTS, seed=st.integers(0, 2**32 - 1))
def test_swiglu_vector_kernels_match_scalar(n, rows, clamp, scale, family, inserts, seed):
    """Lengths not a multiple of the vector width exercise the scalar tail; huge |g| the exp
    underflow and overflow, NaN the branch of sigmoid_stable that a NaN takes."""
    g = draw(seed, rows * n, family, inserts).reshape(rows, n)
    u = draw(seed + 1, rows * n, family, []).reshape(rows, n)
    want = core.OpHarness("cpu", "scalar", 1).swiglu(g, u, clamp, scale)
    for path in X86_PATHS:
        assert_exact(core.OpHarness("cpu", path, 1).swiglu(g, u, clamp, scale), want, f"swiglu on {path}")


@pytest.mark.parametrize("path", ["scalar"] + X86_PATHS)
@settings(max_examples=8, deadline=None, derandomize=True)
@given(nb=st.sampled_from([5, 8, 9, 37]), seed=st.integers(0, 2**16))
def test_row_ops_give_the_same_bits_on_any_thread_count(path, nb, seed):
    """Batches are split over the pool by rows (and rms norms run four rows at a time): one thread
    and two threads agree bit for bit, on batches that are not a multiple of the split."""
    rng = np.random.default_rng(seed)
    one, two = core.OpHarness("cpu", path, 1), core.OpHarness("cpu", path, 2)
    n_head, D, n_rot, n_hc, E = 3, 128, 64, 4, 96
    x = hostile(rng, nb * n_head * D, "specials").reshape(nb, n_head * D)
    w = rng.standard_normal(n_head * D).astype(np.float32)
    block, res = rng.standard_normal((nb, E)).astype(np.float32), hostile(rng, nb * n_hc * E, "wide").reshape(nb, -1)
    split = np.abs(rng.standard_normal((nb, 2 * n_hc + n_hc * n_hc))).astype(np.float32)
    calls = {
        "rms_norm": lambda h: h.rms_norm(x, w, 1e-6),
        "rms_norm (no weight)": lambda h: h.rms_norm(x, None, 1e-6),
        "head_rms_norm": lambda h: h.head_rms_norm(x, n_head, D, 1e-6),
        "rope_tail": lambda h: h.rope_tail(x, n_head, D, n_rot, 1000, rope(n_rot, 4), False),
        "fp8_kv_roundtrip": lambda h: h.fp8_kv_roundtrip(x, n_rot),
        "hc_post": lambda h: h.hc_post(block, res, split, n_hc),
        "swiglu": lambda h: h.swiglu(x, x[::-1].copy(), 10.0, 0.5),
        "add": lambda h: h.add(x, x[::-1].copy()),
    }
    for op, call in calls.items():
        assert_exact(call(two), call(one), f"{op} on {path}, 2 threads vs 1")


def test_hc_post_and_rms_norm_keep_the_documented_float_order():
    """The row-wise rewrites of hc_post (block*post, then + comb*R per source in order) and the
    four-rows-at-once rms norm (each row's sequential float64 sum of squares) give exactly the
    numpy evaluation of those orders."""
    rng = np.random.default_rng(7)
    nb, n_hc, E = 6, 4, 40
    block, res = rng.standard_normal((nb, E)).astype(np.float32), rng.standard_normal((nb, n_hc * E)).astype(np.float32)
    split = np.abs(rng.standard_normal((nb, 2 * n_hc + n_hc * n_hc))).astype(np.float32)
    want = np.empty((nb, n_hc * E), np.float32)
    for b in range(nb):
        post, comb = split[b, n_hc:2 * n_hc], split[b, 2 * n_hc:].reshape(n_hc, n_hc)
        R = res[b].reshape(n_hc, E)
        for dst in range(n_hc):
            acc = block[b] * post[dst]
            for src in range(n_hc):
                acc = (acc + comb[src, dst] * R[src]).astype(np.float32)
            want[b, dst * E:(dst + 1) * E] = acc
    assert_exact(core.OpHarness("cpu", "scalar", 2).hc_post(block, res, split, n_hc), want, "hc_post")

    x = rng.standard_normal((nb, 300)).astype(np.float32)
    ss = np.cumsum(x.astype(np.float64) ** 2, axis=1)[:, -1]        # cumsum: the sequential order
    s = (np.float32(1.0) / np.sqrt((ss / 300).astype(np.float32) + np.float32(1e-6))).astype(np.float32)
    assert_exact(core.OpHarness("cpu", "scalar", 2).rms_norm(x, None, 1e-6), (x * s[:, None]).astype(np.float32),
                 "rms_norm")


def test_exact_checks_catch_one_ulp_and_the_tie_families_decide_rounding_rules():
    """The checks above hold outputs to bits: one value one ulp off fails them. And the tie families
    make each rounding rule matter: a kernel rounding half away from zero (Q8), or ties to the odd
    code (E4M3, E2M1), would produce different outputs on them."""
    rng = np.random.default_rng(3)
    x = hostile(rng, 256 * 4, "q8_ties").reshape(4, 256)
    want = on_path("scalar", lambda: core.quantize_act(int(Q.Q8_0), x))
    bumped = want.copy()
    scale = bumped[:4].view(np.float32)
    scale[0] = np.nextafter(scale[0], np.float32(np.inf))             # one ulp on one block scale
    with pytest.raises(AssertionError):
        assert_exact(bumped, want)
    y = core.OpHarness("cpu", "scalar", 1).fp8_kv_roundtrip(hostile(rng, 512, "e4m3_ties").reshape(1, 512), 0)
    z = y.copy()
    z[0, 3] = np.nextafter(z[0, 3], np.float32(np.inf))
    with pytest.raises(AssertionError):
        assert_exact(z, y)

    v = (x * np.float32(1.0)).reshape(-1)                               # q8_ties: scale 1, so v = x*id
    half_away = np.trunc(v + np.copysign(0.5, v))
    assert (half_away != np.rint(v)).sum() > 100                        # the rule is exercised

    ties = hostile(rng, 512, "e4m3_ties")
    even = ref_fp8.e4m3_round(ties)
    above = np.minimum(np.searchsorted(E4M3_CODES, np.abs(ties), side="right"), 126)
    nearest_up = np.sign(ties) * E4M3_CODES[above]
    assert ((even != nearest_up) & (np.abs(ties) < 448)).sum() > 100
    ties2 = hostile(rng, 512, "e2m1_ties")
    codes2 = ref_fp4.E2M1_VALUES
    up2 = np.sign(ties2) * codes2[np.minimum(np.searchsorted(codes2, np.abs(ties2), side="right"), 7)]
    assert ((ref_fp4.e2m1_round(ties2) != up2) & (np.abs(ties2) < 6)).sum() > 50
