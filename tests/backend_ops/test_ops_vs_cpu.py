"""Every op x weight type x drawn shapes/positions x every backend under test, against the CPU
backend on the scalar path (tolerances and their reasons: _ops.py)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given, settings, strategies as st

import ds4._core as core
import ds4.errors
from test_attention_block import blocks
from _ops import (BACKENDS, NMSE_REQUANT, REFERENCE, assert_exact, assert_matches, floats, rope, router_args,
                  weight)

WEIGHT_TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q2_K, Q.Q4_K, Q.IQ2_XXS)
FLOAT_TYPES = (Q.F32, Q.F16)
EXPERT_TYPES = (Q.Q8_0, Q.Q2_K, Q.Q4_K, Q.IQ2_XXS)
BATCH = st.sampled_from([1, 2, 3, 7, 256])          # decode, small odd batches, a GEMM-sized batch
FEW = settings(max_examples=12, deadline=None, derandomize=True)   # same draws in every CI run
backends = pytest.mark.parametrize("name,h", BACKENDS)


def _block(q: Q) -> int:
    return 256 if q in (Q.Q2_K, Q.Q4_K, Q.IQ2_XXS) else 32


def test_every_op_is_covered():
    """The op list of the C++ interface and the ops this suite runs are the same set (linear_group:
    test_linear_group.py)."""
    assert set(core.op_names()) == set(COVERED)


@backends
@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda q: q.name)
@FEW
@given(blocks=st.integers(1, 3), rows=st.integers(1, 17), nb=BATCH, seed=st.integers(0, 2**16))
def test_linear(name, h, qtype, blocks, rows, nb, seed):
    n = _block(qtype) * blocks
    w = weight(qtype, n, rows, seed)
    x = floats(np.random.default_rng(seed), nb, n)
    assert_matches("linear", name, h.linear(w, int(qtype), n, rows, x), REFERENCE.linear(w, int(qtype), n, rows, x))


@backends
@pytest.mark.parametrize("qtype", (Q.Q8_0, Q.F16, Q.BF16, Q.Q4_K), ids=lambda q: q.name)
@FEW
@given(groups=st.integers(1, 4), rank=st.integers(1, 9), nb=BATCH, seed=st.integers(0, 2**16))
def test_grouped_output_a(name, h, qtype, groups, rank, nb, seed):
    gd = _block(qtype) * 2
    w = weight(qtype, gd, groups * rank, seed)
    heads = floats(np.random.default_rng(seed), nb, groups * gd)
    args = (w, int(qtype), gd, groups, rank, heads)
    assert_matches("grouped_output_a", name, h.grouped_output_a(*args), REFERENCE.grouped_output_a(*args))


@backends
@pytest.mark.parametrize("qtype", (Q.F16, Q.BF16, Q.F32, Q.Q8_0), ids=lambda q: q.name)
@FEW
@given(n_embd=st.sampled_from([32, 64, 96]), tokens=st.lists(st.integers(0, 40), min_size=1, max_size=9),
       n_hc=st.sampled_from([1, 4]), seed=st.integers(0, 2**16))
def test_embed_tokens_hc(name, h, qtype, n_embd, tokens, n_hc, seed):
    w = weight(qtype, n_embd, 41, seed)
    args = (w, int(qtype), n_embd, 41, tokens, n_hc)
    assert_matches("embed_tokens_hc", name, h.embed_tokens_hc(*args), REFERENCE.embed_tokens_hc(*args))


@backends
@FEW
@given(n=st.sampled_from([1, 7, 64, 256, 4096]), nb=BATCH, weighted=st.booleans(), seed=st.integers(0, 2**16))
def test_rms_norm(name, h, n, nb, weighted, seed):
    rng = np.random.default_rng(seed)
    x = floats(rng, nb, n, scale=float(2.0 ** rng.integers(-20, 20)))
    w = floats(rng, n) if weighted else None
    assert_matches("rms_norm", name, h.rms_norm(x, w, 1e-6), REFERENCE.rms_norm(x, w, 1e-6))


@backends
@FEW
@given(n_head=st.integers(1, 8), head_dim=st.sampled_from([16, 64, 512]), nb=BATCH, seed=st.integers(0, 2**16))
def test_head_rms_norm(name, h, n_head, head_dim, nb, seed):
    x = floats(np.random.default_rng(seed), nb, n_head * head_dim)
    args = (x, n_head, head_dim, 1e-6)
    assert_matches("head_rms_norm", name, h.head_rms_norm(*args), REFERENCE.head_rms_norm(*args))


@backends
@pytest.mark.parametrize("qtype", (Q.F16, Q.F32), ids=lambda q: q.name)
@FEW
@given(n_embd=st.sampled_from([32, 64]), n_hc=st.sampled_from([2, 4]), nb=BATCH, seed=st.integers(0, 2**16))
def test_hc_pre(name, h, qtype, n_embd, n_hc, nb, seed):
    rng = np.random.default_rng(seed)
    mixn = 2 * n_hc + n_hc * n_hc
    fn = weight(qtype, n_embd * n_hc, mixn, seed)
    scale, base, H = floats(rng, 3, scale=0.1), floats(rng, mixn), floats(rng, nb, n_hc * n_embd)
    args = (fn, int(qtype), scale, base, H, n_hc, 20, 1e-6, 1e-6)
    (x, split), (rx, rsplit) = h.hc_pre(*args), REFERENCE.hc_pre(*args)
    assert_matches("hc_pre", name, x, rx)
    assert_matches("hc_pre", name, split, rsplit)


@backends
@FEW
@given(n_embd=st.sampled_from([32, 64]), n_hc=st.sampled_from([2, 4]), nb=BATCH, seed=st.integers(0, 2**16))
def test_hc_post(name, h, n_embd, n_hc, nb, seed):
    rng = np.random.default_rng(seed)
    block, res = floats(rng, nb, n_embd), floats(rng, nb, n_hc * n_embd)
    split = np.abs(floats(rng, nb, 2 * n_hc + n_hc * n_hc))
    assert_matches("hc_post", name, h.hc_post(block, res, split, n_hc), REFERENCE.hc_post(block, res, split, n_hc))


@backends
@pytest.mark.parametrize("qtype", (Q.F16, Q.F32), ids=lambda q: q.name)
@FEW
@given(n_embd=st.sampled_from([32, 64]), n_hc=st.sampled_from([2, 4]), seed=st.integers(0, 2**16))
def test_hc_collapse_norm(name, h, qtype, n_embd, n_hc, seed):
    rng = np.random.default_rng(seed)
    fn = weight(qtype, n_embd * n_hc, n_hc, seed)
    args = (fn, int(qtype), floats(rng, 1), floats(rng, n_hc), floats(rng, n_embd), floats(rng, n_hc * n_embd),
            n_hc, 1e-6, 1e-6)
    assert_matches("hc_collapse_norm", name, h.hc_collapse_norm(*args), REFERENCE.hc_collapse_norm(*args))


@backends
@FEW
@given(n_head=st.integers(1, 4), n_rot=st.sampled_from([8, 64]), ratio=st.sampled_from([0, 4, 128]),
       pos0=st.one_of(st.integers(0, 300), st.integers(2**16 - 4, 2**16 + 4), st.integers(0, 2**20)), nb=BATCH,
       inverse=st.booleans(), seed=st.integers(0, 2**16))
def test_rope_tail(name, h, n_head, n_rot, ratio, pos0, nb, inverse, seed):
    head_dim = n_rot + 64
    x = floats(np.random.default_rng(seed), nb, n_head * head_dim)
    args = (x, n_head, head_dim, n_rot, pos0, rope(n_rot, ratio), inverse)
    assert_matches("rope_tail", name, h.rope_tail(*args), REFERENCE.rope_tail(*args))


@backends
@FEW
@given(nope_blocks=st.integers(1, 7), n_rot=st.sampled_from([0, 8, 64]), nb=BATCH, seed=st.integers(0, 2**16))
def test_fp8_kv_roundtrip(name, h, nope_blocks, n_rot, nb, seed):
    rng = np.random.default_rng(seed)
    x = floats(rng, nb, 64 * nope_blocks + n_rot, scale=float(2.0 ** rng.integers(-12, 12)))
    assert_matches("fp8_kv_roundtrip", name, h.fp8_kv_roundtrip(x, n_rot), REFERENCE.fp8_kv_roundtrip(x, n_rot))


@backends
@FEW
@given(width=st.integers(1, 600), nb=BATCH, seed=st.integers(0, 2**16))
def test_store_row_f16(name, h, width, nb, seed):
    rng = np.random.default_rng(seed)
    x = floats(rng, nb, width, scale=float(2.0 ** rng.integers(-20, 18)))
    assert_matches("store_row_f16", name, h.store_row_f16(x), REFERENCE.store_row_f16(x))


def _frontier(rng, ratio, head_dim):
    coff = 2 if ratio == 4 else 1
    kv = floats(rng, coff * ratio, coff * head_dim)
    score = floats(rng, coff * ratio, coff * head_dim)
    score[rng.random(score.shape) < 0.2] = -1.0e30       # unwritten slots keep the sentinel
    return kv, score


@backends
@pytest.mark.parametrize("qtype", (Q.F32, Q.F16), ids=lambda q: q.name)
@FEW
@given(ratio=st.sampled_from([4, 128]), head_dim=st.sampled_from([64, 128]),
       pos=st.one_of(st.integers(0, 9), st.integers(120, 135), st.integers(0, 10**6)), seed=st.integers(0, 2**16))
def test_compressor_store(name, h, qtype, ratio, head_dim, pos, seed):
    rng = np.random.default_rng(seed)
    coff = 2 if ratio == 4 else 1
    ape = weight(qtype, coff * head_dim, ratio, seed)
    kv, score = _frontier(rng, ratio, head_dim)
    args = (ape, int(qtype), floats(rng, coff * head_dim), floats(rng, coff * head_dim), kv, score, ratio, head_dim, pos)
    for got, want in zip(h.compressor_store(*args), REFERENCE.compressor_store(*args)):
        assert_matches("compressor_store", name, got, want)


@backends
@FEW
@given(ratio=st.sampled_from([4, 128]), lane=st.sampled_from(["attn", "index"]), pos=st.integers(0, 10**6),
       seed=st.integers(0, 2**16))
def test_compressor_pool(name, h, ratio, lane, pos, seed):
    rng = np.random.default_rng(seed)
    head_dim, n_rot, fp8 = (128, 64, True) if lane == "attn" else (128, 64, False)
    kv, score = _frontier(rng, ratio, head_dim)
    args = (floats(rng, head_dim), kv, score, ratio, head_dim, n_rot, 1e-6, rope(n_rot, ratio), pos, fp8)
    assert_matches("compressor_pool", name, h.compressor_pool(*args), REFERENCE.compressor_pool(*args))


@backends
@FEW
@given(head_dim=st.sampled_from([64, 128]), seed=st.integers(0, 2**16))
def test_compressor_shift(name, h, head_dim, seed):
    kv, score = _frontier(np.random.default_rng(seed), 4, head_dim)
    for got, want in zip(h.compressor_shift(kv, score, head_dim), REFERENCE.compressor_shift(kv, score, head_dim)):
        assert_matches("compressor_shift", name, got, want)


@backends
@FEW
@given(n_head=st.integers(1, 8), n_rows=st.integers(0, 300), pos=st.integers(0, 10**6), seed=st.integers(0, 2**16))
def test_indexer_scores(name, h, n_head, n_rows, pos, seed):
    rng = np.random.default_rng(seed)
    hd, n_rot = 128, 64
    args = (floats(rng, n_head * hd), floats(rng, n_head), floats(rng, n_rows, hd), n_head, hd, n_rot, pos, rope(n_rot, 4))
    for got, want in zip(h.indexer_scores(*args), REFERENCE.indexer_scores(*args)):
        assert_matches("indexer_scores", name, got, want)


@backends
@FEW
@given(n=st.integers(1, 700), k=st.integers(1, 64), ties=st.booleans(), seed=st.integers(0, 2**16))
def test_top_k_mask(name, h, n, k, ties, seed):
    rng = np.random.default_rng(seed)
    s = (rng.integers(0, 5, n) if ties else rng.standard_normal(n)).astype(np.float32)
    s[rng.random(n) < 0.1] = -1.0e30
    assert_matches("top_k_mask", name, h.top_k_mask(s, k), REFERENCE.top_k_mask(s, k))


@backends
@FEW
@given(n_head=st.integers(1, 8), head_dim=st.sampled_from([64, 512]), raw_cap=st.integers(1, 130),
       fill=st.floats(0, 1), first=st.integers(0, 200), n_comp=st.integers(0, 300), masked=st.booleans(),
       seed=st.integers(0, 2**16))
def test_attention(name, h, n_head, head_dim, raw_cap, fill, first, n_comp, masked, seed):
    rng = np.random.default_rng(seed)
    n_raw = max(1, int(round(fill * raw_cap)))
    raw_first = first % raw_cap                        # the live window wraps around the ring end
    mask = (rng.random(n_comp) < 0.5).astype(np.uint8) if masked else None
    args = (floats(rng, n_head * head_dim), floats(rng, raw_cap, head_dim), n_raw, raw_first,
            floats(rng, n_comp, head_dim), mask, floats(rng, n_head), n_head, head_dim)
    assert_matches("attention", name, h.attention(*args), REFERENCE.attention(*args))


@backends
@FEW
@given(args=blocks())
def test_attention_block(name, h, args):
    """Several query tokens at once (test_attention_block.py draws the blocks and checks the
    per-token equivalence and the numpy reference). The op is optional: a backend without it
    (Metal) says so in supports() and refuses the call, and the forward pass attends per token."""
    if not h.supports("attention_block", 0):
        with pytest.raises(ds4.errors.UnsupportedModelError, match="attention_block"):
            h.attention_block(*args)
        return
    assert_matches("attention_block", name, h.attention_block(*args), REFERENCE.attention_block(*args))


X86_SIMD_PATHS = [p for p in core.simd_paths() if p in ("avx2", "avx512", "avx512vnni")]


@pytest.mark.skipif(len(X86_SIMD_PATHS) < 2, reason="needs two x86 SIMD paths (AVX2 + AVX-512 CPU)")
@FEW
@given(n_head=st.integers(1, 16), head_dim=st.sampled_from([64, 72, 512, 520]), raw_cap=st.integers(1, 130),
       n_comp=st.integers(0, 300), masked=st.booleans(), seed=st.integers(0, 2**16))
def test_attention_x86_kernels_share_one_float_order(n_head, head_dim, raw_cap, n_comp, masked, seed):
    """AVX2 and AVX-512 attention (attention_simd.inc) keep the portable lanes order: bits agree.
    Odd head counts exercise the 1-3 head tail blocks, 72/520 the scalar tails of the row loops."""
    rng = np.random.default_rng(seed)
    mask = (rng.random(n_comp) < 0.5).astype(np.uint8) if masked else None
    args = (floats(rng, n_head * head_dim), floats(rng, raw_cap, head_dim), raw_cap, seed % raw_cap,
            floats(rng, n_comp, head_dim), mask, floats(rng, n_head), n_head, head_dim)
    first = core.OpHarness("cpu", X86_SIMD_PATHS[0], 2).attention(*args)
    for path in X86_SIMD_PATHS[1:]:
        assert_exact(core.OpHarness("cpu", path, 2).attention(*args), first, f"attention on cpu-{path}")


@pytest.mark.skipif(len(X86_SIMD_PATHS) < 2, reason="needs two x86 SIMD paths (AVX2 + AVX-512 CPU)")
@FEW
@given(n_head=st.integers(1, 20), n_rows=st.integers(0, 300), pos=st.integers(0, 10**6), seed=st.integers(0, 2**16))
def test_indexer_scores_x86_kernels_share_one_float_order(n_head, n_rows, pos, seed):
    """The indexer's row dots use the same x86 kernels (lanes order): AVX2 and AVX-512 bits agree."""
    rng = np.random.default_rng(seed)
    hd, n_rot = 128, 64
    args = (floats(rng, n_head * hd), floats(rng, n_head), floats(rng, n_rows, hd), n_head, hd, n_rot, pos, rope(n_rot, 4))
    first = core.OpHarness("cpu", X86_SIMD_PATHS[0], 2).indexer_scores(*args)
    for path in X86_SIMD_PATHS[1:]:
        for got, want in zip(core.OpHarness("cpu", path, 2).indexer_scores(*args), first):
            assert_exact(got, want, f"indexer_scores on cpu-{path}")


@backends
@FEW
@given(n_expert=st.sampled_from([8, 16, 256]), n_used=st.integers(1, 8), nb=BATCH, mode=st.sampled_from(["topk", "bias", "hash"]),
       seed=st.integers(0, 2**16))
def test_router(name, h, n_expert, n_used, nb, mode, seed):
    args = router_args(np.random.default_rng(seed), nb, n_expert, n_used, mode)
    for got, want in zip(h.router(*args), REFERENCE.router(*args)):
        assert_matches("router", name, got, want)


@backends
@pytest.mark.parametrize("gate_type,down_type", [(Q.IQ2_XXS, Q.Q2_K), (Q.Q4_K, Q.Q4_K), (Q.Q8_0, Q.Q8_0), (Q.BF16, Q.BF16)],
                         ids=lambda q: q.name)
@FEW
@given(nb=st.sampled_from([1, 3, 257]), n_used=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_routed_experts(name, h, gate_type, down_type, nb, n_used, seed):
    rng = np.random.default_rng(seed)
    n_embd, n_ff, n_expert = 256, 256, 8
    gate = weight(gate_type, n_embd, n_ff * n_expert, seed)
    up = weight(gate_type, n_embd, n_ff * n_expert, seed + 1)
    down = weight(down_type, n_ff, n_embd * n_expert, seed + 2)
    sel = np.stack([rng.permutation(n_expert)[:n_used] for _ in range(nb)]).astype(np.int32)
    args = (gate, int(gate_type), up, down, int(down_type), n_embd, n_ff, n_expert, floats(rng, nb, n_embd), sel,
            np.abs(floats(rng, nb, n_used)), 10.0)
    assert_matches("routed_experts", name, h.routed_experts(*args), REFERENCE.routed_experts(*args), NMSE_REQUANT)


@backends
@FEW
@given(n=st.integers(1, 600), nb=BATCH, clamp=st.sampled_from([0.0, 1.0, 10.0]), scale=st.sampled_from([0.25, 1.0, 1.5]),
       seed=st.integers(0, 2**16))
def test_swiglu(name, h, n, nb, clamp, scale, seed):
    rng = np.random.default_rng(seed)
    g, u = floats(rng, nb, n, scale=5.0), floats(rng, nb, n, scale=5.0)
    assert_matches("swiglu", name, h.swiglu(g, u, clamp, scale), REFERENCE.swiglu(g, u, clamp, scale))


@backends
@FEW
@given(n=st.integers(1, 600), nb=BATCH, value=st.floats(width=32, allow_nan=False, allow_infinity=False), seed=st.integers(0, 2**16))
def test_add_fill_copy_argmax(name, h, n, nb, value, seed):
    rng = np.random.default_rng(seed)
    a, b = floats(rng, nb, n), floats(rng, nb, n)
    assert_matches("add", name, h.add(a, b), REFERENCE.add(a, b))
    assert_matches("fill", name, h.fill(n, nb, value), REFERENCE.fill(n, nb, value))
    assert_matches("copy", name, h.copy(a), REFERENCE.copy(a))
    row = np.round(a[0] * 2).astype(np.float32)         # ties: the first maximum wins
    assert h.argmax(row) == REFERENCE.argmax(row) == int(np.argmax(row))


COVERED = ["linear", "linear_group", "grouped_output_a", "embed_tokens_hc", "rms_norm", "head_rms_norm", "hc_pre", "hc_post",
           "hc_collapse_norm", "rope_tail", "fp8_kv_roundtrip", "store_row_f16", "compressor_store",
           "compressor_pool", "compressor_shift", "indexer_scores", "top_k_mask", "attention", "attention_block",
           "router", "routed_experts", "swiglu", "add", "fill", "copy", "argmax"]
