"""Each op of the CPU backend (scalar path) against the matching ds4.reference function.

The reference follows upstream's float32 orders wherever upstream fixes one, so most ops must be
bit-identical; where it accumulates in float64 (dot products, attention values) the derived dot
bound (tests/test_kernels_matvec.py) or NMSE_FLOAT applies, and where it also re-quantises an
intermediate (routed experts) NMSE_REQUANT (reasons in _ops.py). Its sinf/cosf are the double
functions rounded once to float32, which differ from libm's sinf/cosf (what upstream and the
engine call) by one ulp for ~1.4 % of arguments (measured on 20000 random angles), and its expf,
log1pf likewise: ops that rotate (RoPE, the compressor's emitted row, the indexer query) or
exponentiate (SwiGLU, router weights) are compared with NMSE_FLOAT.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given, settings, strategies as st

import ds4._core as core
from ds4.reference import fp4, fp8, hc, indexer, moe, numerics, quant, rope as ref_rope
from ds4.reference.attention import attend
from ds4.reference.compressor import compressor_pool
from ds4.reference.state import CompressorState
from ds4.testing import preset
from _ops import NMSE_FLOAT, NMSE_REQUANT, REFERENCE as CPU, assert_exact, assert_nmse, floats, weight
from test_kernels_matvec import _check_close, _reference as dot_reference

FEW = settings(max_examples=15, deadline=None, derandomize=True)   # same draws in every CI run
SHAPE = preset("tiny").replace(n_rot=64)


def _rope_pair(ratio: int):
    s = SHAPE
    cpp = core._rope_params(s.n_rot, s.rope_freq_base, s.compress_rope_freq_base, s.rope_scale_factor,
                            s.rope_orig_ctx, s.yarn_beta_fast, s.yarn_beta_slow, ratio)
    return cpp, ref_rope.rope_params(s, ratio)


@pytest.mark.parametrize("qtype", (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q2_K, Q.Q4_K, Q.IQ2_XXS), ids=lambda q: q.name)
@FEW
@given(blocks=st.integers(1, 3), rows=st.integers(1, 9), nb=st.sampled_from([1, 3]), seed=st.integers(0, 2**16))
def test_linear(qtype, blocks, rows, nb, seed):
    n = (256 if qtype in (Q.Q2_K, Q.Q4_K, Q.IQ2_XXS) else 32) * blocks
    w = weight(qtype, n, rows, seed)
    x = floats(np.random.default_rng(seed), nb, n)
    want, tol = dot_reference(qtype, w, n, rows, x)
    _check_close(CPU.linear(w, int(qtype), n, rows, x), want, tol)


@FEW
@given(groups=st.integers(1, 4), rank=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_grouped_output_a(groups, rank, seed):
    gd = 64
    w = weight(Q.Q8_0, gd, groups * rank, seed)
    heads = floats(np.random.default_rng(seed), 1, groups * gd)
    got = CPU.grouped_output_a(w, int(Q.Q8_0), gd, groups, rank, heads)[0]
    for g in range(groups):   # group g: rows g*rank.. of Wa against its own heads (own Q8_0 activation)
        wg = w.reshape(groups * rank, -1)[g * rank:(g + 1) * rank].reshape(-1)
        want, tol = dot_reference(Q.Q8_0, wg, gd, rank, heads[0, g * gd:(g + 1) * gd])
        _check_close(got[g * rank:(g + 1) * rank], want, tol)


@pytest.mark.parametrize("qtype", (Q.F16, Q.Q8_0), ids=lambda q: q.name)
def test_embed_tokens_hc(qtype):
    w = weight(qtype, 64, 10, 3)
    got = CPU.embed_tokens_hc(w, int(qtype), 64, 10, [7, 0, 9], 4)
    table = quant.dequantize(qtype, w, (64, 10))
    assert_exact(got, np.stack([np.tile(table[t], 4) for t in (7, 0, 9)]).astype(np.float32), "embed")


@FEW
@given(n=st.sampled_from([7, 64, 4096]), weighted=st.booleans(), seed=st.integers(0, 2**16))
def test_rms_norm(n, weighted, seed):
    rng = np.random.default_rng(seed)
    x, w = floats(rng, 2, n, scale=float(2.0 ** rng.integers(-20, 20))), floats(rng, n)
    got = CPU.rms_norm(x, w if weighted else None, 1e-6)
    want = [numerics.rms_norm(r, w, 1e-6) if weighted else numerics.rms_norm_no_weight(r, 1e-6) for r in x]
    assert_exact(got, np.stack(want), "rms_norm")


@FEW
@given(n_head=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_head_rms_norm(n_head, seed):
    x = floats(np.random.default_rng(seed), 1, n_head * 64)
    assert_exact(CPU.head_rms_norm(x, n_head, 64, 1e-6)[0], numerics.head_rms_norm(x[0], n_head, 64, 1e-6), "head_rms_norm")


@FEW
@given(ratio=st.sampled_from([0, 4, 128]), pos=st.integers(0, 2**20), inverse=st.booleans(), seed=st.integers(0, 2**16))
def test_rope_tail(ratio, pos, inverse, seed):
    cpp, ref = _rope_pair(ratio)
    x = floats(np.random.default_rng(seed), 1, 3 * 128)
    got = CPU.rope_tail(x, 3, 128, 64, pos, cpp, inverse)[0]
    assert_nmse(got, ref_rope.rope_tail(x[0], 3, 128, ref, pos, inverse), NMSE_FLOAT, "rope_tail")   # sinf/cosf ulps


@FEW
@given(n_rot=st.sampled_from([0, 64]), seed=st.integers(0, 2**16))
def test_fp8_and_f16_round_trips(n_rot, seed):
    rng = np.random.default_rng(seed)
    x = floats(rng, 1, 448 + n_rot, scale=float(2.0 ** rng.integers(-12, 12)))
    assert_exact(CPU.fp8_kv_roundtrip(x, n_rot)[0], fp8.fp8_kv_roundtrip(x[0], n_rot), "fp8")
    assert_exact(CPU.store_row_f16(x)[0], numerics.f16_round(x[0]), "f16")


@FEW
@given(n_hc=st.sampled_from([2, 4]), seed=st.integers(0, 2**16))
def test_hc_pre_post_collapse(n_hc, seed):
    rng = np.random.default_rng(seed)
    E, mixn = 64, 2 * n_hc + n_hc * n_hc
    fn = weight(Q.F16, E * n_hc, mixn, seed)
    scale, base, H = floats(rng, 3, scale=0.1), floats(rng, mixn), floats(rng, 1, n_hc * E)
    fn_f = quant.dequantize(Q.F16, fn, (E * n_hc, mixn))
    x, split = CPU.hc_pre(fn, int(Q.F16), scale, base, H, n_hc, 20, 1e-6, 1e-6)
    rx, rsplit = hc.hc_pre(H[0].reshape(n_hc, E), fn_f, scale, base, 20, 1e-6, 1e-6)
    # The mix projection: float64 in the reference, float32 in upstream's order here.
    assert_nmse(x[0], rx, NMSE_FLOAT, "hc_pre x")
    assert_nmse(split[0], np.concatenate([rsplit.pre, rsplit.post, rsplit.comb.reshape(-1)]), NMSE_FLOAT, "hc_pre split")
    block = floats(rng, 1, E)
    got = CPU.hc_post(block, H, split, n_hc)[0]
    exact_split = hc.HcSplit(split[0, :n_hc], split[0, n_hc:2 * n_hc], split[0, 2 * n_hc:].reshape(n_hc, n_hc))
    assert_exact(got, hc.hc_post(block[0], H[0].reshape(n_hc, E), exact_split).reshape(-1), "hc_post")
    cfn = weight(Q.F16, E * n_hc, n_hc, seed + 1)
    cs, cb, norm = floats(rng, 1), floats(rng, n_hc), floats(rng, E)
    y = CPU.hc_collapse_norm(cfn, int(Q.F16), cs, cb, norm, H, n_hc, 1e-6, 1e-6)[0]
    ry = numerics.rms_norm(hc.hc_collapse(H[0].reshape(n_hc, E), quant.dequantize(Q.F16, cfn, (E * n_hc, n_hc)), cs, cb,
                                          1e-6, 1e-6), norm, 1e-6)
    assert_nmse(y, ry, NMSE_FLOAT, "hc_collapse_norm")


@FEW
@given(ratio=st.sampled_from([4, 128]), lane=st.sampled_from(["attn", "index"]), pos=st.integers(0, 10**6),
       seed=st.integers(0, 2**16))
def test_compressor_store_pool_shift(ratio, lane, pos, seed):
    rng = np.random.default_rng(seed)
    hd, coff = 128, (2 if ratio == 4 else 1)
    st_ = CompressorState(ratio, hd)
    st_.kv[:] = floats(rng, *st_.kv.shape)
    st_.score[:] = np.where(rng.random(st_.score.shape) < 0.2, numerics.NEG, floats(rng, *st_.score.shape))
    ape = weight(Q.F32, coff * hd, ratio, seed)
    kv_cur, sc_cur = floats(rng, coff * hd), floats(rng, coff * hd)
    sc_out, kv_state, sc_state = CPU.compressor_store(ape, int(Q.F32), kv_cur, sc_cur, st_.kv, st_.score, ratio, hd, pos)
    row = ratio + pos % ratio if ratio == 4 else pos % ratio
    want_sc = (sc_cur + ape.view(np.float32).reshape(ratio, -1)[pos % ratio]).astype(np.float32)
    assert_exact(sc_out[0], want_sc, "compressor_store score")
    assert_exact(kv_state[row], kv_cur, "compressor_store kv")
    assert_exact(sc_state[row], want_sc, "compressor_store slot")
    cpp, ref = _rope_pair(ratio)
    norm = floats(rng, hd)
    got = CPU.compressor_pool(norm, st_.kv, st_.score, ratio, hd, 64, 1e-6, cpp, pos, lane == "attn")[0]
    want = ref_rope.rope_tail(numerics.rms_norm(compressor_pool(st_), norm, 1e-6), 1, hd, ref, pos)
    want = fp8.fp8_kv_roundtrip(want, 64) if lane == "attn" else fp4.indexer_qat(want.reshape(1, hd)).reshape(-1)
    assert_nmse(got, want, NMSE_FLOAT, "compressor_pool")   # RoPE'd row: sinf/cosf ulps (and FP8/FP4 steps they may flip)
    if ratio == 4:
        k2, s2 = CPU.compressor_shift(st_.kv, st_.score, hd)
        assert_exact(k2[:4], st_.kv[4:], "shift kv")
        assert_exact(s2[:4], st_.score[4:], "shift score")
        assert_exact(k2[4:], st_.kv[4:], "shift keeps the current window")


@FEW
@given(n_head=st.integers(1, 8), n_rows=st.integers(0, 200), k=st.integers(1, 64), pos=st.integers(0, 10**6),
       seed=st.integers(0, 2**16))
def test_indexer_scores_and_top_k(n_head, n_rows, k, pos, seed):
    rng = np.random.default_rng(seed)
    cpp, ref = _rope_pair(4)
    q, w, rows = floats(rng, n_head * 128), floats(rng, n_head), floats(rng, n_rows, 128)
    scores, _, _ = CPU.indexer_scores(q, w, rows, n_head, 128, 64, pos, cpp)
    qr = fp4.indexer_qat(ref_rope.rope_tail(q, n_head, 128, ref, pos).reshape(n_head, 128))
    hw = (w * (np.float32(1.0) / np.sqrt(np.float32(128 * n_head)))).astype(np.float32)
    dots = np.maximum(numerics.dot_f32(rows, qr.T), np.float32(0.0)) if n_rows else np.zeros((0, n_head), np.float32)
    want = np.zeros(n_rows, np.float32)
    for h in range(n_head):
        want = (want + dots[:, h] * hw[h]).astype(np.float32)
    assert_nmse(scores[0], want, NMSE_FLOAT, "indexer scores")   # RoPE'd query: sinf/cosf ulps
    if n_rows:
        assert_exact(CPU.top_k_mask(scores[0], k).astype(bool), indexer.topk_strict(scores[0], k), "top_k")


@FEW
@given(n_head=st.integers(1, 4), n_raw=st.integers(1, 40), n_comp=st.integers(0, 60), masked=st.booleans(),
       seed=st.integers(0, 2**16))
def test_attention(n_head, n_raw, n_comp, masked, seed):
    rng = np.random.default_rng(seed)
    D = 64
    q, raw, comp, sinks = floats(rng, n_head * D), floats(rng, n_raw, D), floats(rng, n_comp, D), floats(rng, n_head)
    mask = (rng.random(n_comp) < 0.5).astype(np.uint8) if masked else None
    got = CPU.attention(q, raw, n_raw, 0, comp, mask, sinks, n_head, D)[0]
    want = attend(q, raw, comp, None if mask is None else mask.astype(bool), sinks, n_head, D)
    assert_nmse(got, want, NMSE_FLOAT, "attention")     # value sums: float64 in the reference


@FEW
@given(n_used=st.integers(1, 6), mode=st.sampled_from(["topk", "bias", "hash"]), seed=st.integers(0, 2**16))
def test_router_and_swiglu(n_used, mode, seed):
    rng = np.random.default_rng(seed)
    n_expert = 16
    logits = floats(rng, 1, n_expert, scale=3.0)
    bias = floats(rng, n_expert) if mode == "bias" else None
    table = rng.integers(0, n_expert, (50, n_used)).astype(np.int32) if mode == "hash" else None
    sel, wts = CPU.router(logits, [11], bias, table, n_used, 1.5)
    probs = numerics.sqrtf(numerics.softplus(logits[0]))
    if mode == "hash":
        want_sel = list(table[11])
    else:
        want_sel = moe.topk_desc(probs if bias is None else (probs + bias).astype(np.float32), n_used)
    assert sel[0].tolist() == want_sel
    assert_nmse(wts[0], moe.expert_weights(probs, want_sel, 1.5), NMSE_FLOAT, "router weights")   # expf/log1pf ulps
    g, u = floats(rng, 1, 300, scale=5.0), floats(rng, 1, 300, scale=5.0)
    assert_nmse(CPU.swiglu(g, u, 10.0, 1.0)[0], moe.swiglu(g[0], u[0], 10.0), NMSE_FLOAT, "swiglu")   # expf ulps


@FEW
@given(n_used=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_routed_experts(n_used, seed):
    rng = np.random.default_rng(seed)
    E, F, NE = 256, 256, 6
    gate, up = weight(Q.IQ2_XXS, E, F * NE, seed), weight(Q.IQ2_XXS, E, F * NE, seed + 1)
    down = weight(Q.Q2_K, F, E * NE, seed + 2)
    x = floats(rng, 1, E)
    sel = rng.permutation(NE)[:n_used].astype(np.int32)[None]
    wts = np.abs(floats(rng, 1, n_used))
    got = CPU.routed_experts(gate, int(Q.IQ2_XXS), up, down, int(Q.Q2_K), E, F, NE, x, sel, wts, 10.0)[0]
    G = quant.dequantize(Q.IQ2_XXS, gate, (E, F, NE)).reshape(NE, F, E)
    U = quant.dequantize(Q.IQ2_XXS, up, (E, F, NE)).reshape(NE, F, E)
    Dn = quant.dequantize(Q.Q2_K, down, (F, E, NE)).reshape(NE, E, F)
    at = quant.act_type_for(Q.IQ2_XXS)
    want = np.zeros(E, np.float32)
    for i, e in enumerate(sel[0]):
        g, u = quant.matvec_weights(G[e], x[0], at), quant.matvec_weights(U[e], x[0], at)
        mid = (moe.swiglu(g, u, 10.0) * wts[0, i]).astype(np.float32)
        want = (want + quant.matvec_weights(Dn[e], mid, quant.act_type_for(Q.Q2_K))).astype(np.float32)
    assert_nmse(got, want, NMSE_REQUANT, "routed experts")
