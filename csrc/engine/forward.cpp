#include "engine/forward.h"

#include <algorithm>
#include <cstring>

#include "common/errors.h"
#include "engine/cancel.h"
#include "layers/attention.h"
#include "layers/compressor.h"
#include "layers/fp_quant.h"
#include "layers/hyper_connection.h"
#include "layers/indexer.h"
#include "layers/moe.h"
#include "layers/numerics.h"
#include "layers/output_head.h"
#include "layers/rope.h"
#include "quant/kernels.h"

namespace ds4 {

namespace {

// Attention runs token by token: a cancellation point every this many tokens (engine/cancel.h).
constexpr int64_t kCancelTokenGroup = 64;

// Grouped low-rank output A: group g of each token's heads goes through rows g*rank.. of Wa.
void grouped_output_a(const Shape& s, const TensorRef& wa, const float* heads, int64_t nb, float* low, float* grp,
                      ActBuffer& act, ThreadPool* pool) {
    const int64_t gd = s.group_dim(), rank = s.o_lora_rank, G = s.n_out_group, qd = s.q_dim();
    const int64_t ab = act_bytes(wa.type, gd);
    uint8_t* xq = act.ensure(ab * nb);
    for (int64_t g = 0; g < G; ++g) {
        for (int64_t b = 0; b < nb; ++b) quantize_act(wa.type, heads + b * qd + g * gd, xq + b * ab, gd);
        const uint8_t* w = wa.data + g * rank * wa.row_stride();
        if (nb == 1) {
            matvec(wa.type, w, rank, gd, xq, low + g * rank, pool);
        } else {
            matmul(wa.type, w, rank, gd, xq, nb, grp, pool);
            for (int64_t b = 0; b < nb; ++b) {
                std::memcpy(low + b * s.out_low_dim() + g * rank, grp + b * rank, (size_t)rank * sizeof(float));
            }
        }
    }
}

// Layer il of kv.shape (its ratio and RoPE), with weights L.
void attention_layer(const Model& model, const LayerWeights& L, KvState& kv, Scratch& sc, int il, int64_t nb,
                     int64_t pos0) {
    const Shape& s = kv.shape;
    const AttentionWeights& w = L.attn;
    ThreadPool* pool = model.pool();
    const int64_t E = s.n_embd, HD = s.hc_dim(), D = s.head_dim, QR = s.q_lora_rank, QD = s.q_dim();
    const int ratio = s.ratio(il);
    const RopeParams rope = rope_params_for_layer(s, il);

    hc_pre_batch(s, w.hc_attn_fn, w.hc_attn_scale, w.hc_attn_base, sc.H.data(), nb, sc.x.data(), sc.splits.data(),
                 HcScratch{sc.flat.data(), sc.mix.data()}, sc.act, pool);
    for (int64_t b = 0; b < nb; ++b) rms_norm_weight(&sc.a[b * E], &sc.x[b * E], w.attn_norm.f32(), E, s.rms_eps);
    linear(w.attn_q_a, sc.a.data(), nb, sc.qr.data(), sc.act, pool);
    for (int64_t b = 0; b < nb; ++b) rms_norm_weight(&sc.qrn[b * QR], &sc.qr[b * QR], w.attn_q_a_norm.f32(), QR, s.rms_eps);
    linear(w.attn_q_b, sc.qrn.data(), nb, sc.q.data(), sc.act, pool);
    for (int64_t b = 0; b < nb; ++b) head_rms_norm_inplace(&sc.q[b * QD], s.n_head, D, s.rms_eps);
    linear(w.attn_kv, sc.a.data(), nb, sc.kvr.data(), sc.act, pool);
    for (int64_t b = 0; b < nb; ++b) rms_norm_weight(&sc.kv[b * D], &sc.kvr[b * D], w.attn_kv_a_norm.f32(), D, s.rms_eps);

    const int64_t I = s.indexer_head_dim;
    const int64_t cw = Shape::coff(ratio) * D, icw = Shape::coff(ratio) * I;
    bool need_indexer = false;
    if (ratio != 0) {
        linear(L.comp.kv, sc.a.data(), nb, sc.ckv.data(), sc.act, pool);
        linear(L.comp.gate, sc.a.data(), nb, sc.csc.data(), sc.act, pool);
    }
    if (ratio == 4) {
        linear(L.indexer.comp.kv, sc.a.data(), nb, sc.ickv.data(), sc.act, pool);
        linear(L.indexer.comp.gate, sc.a.data(), nb, sc.icsc.data(), sc.act, pool);
        // Upper bound of the rows any token of this batch can see (one new row per 4 tokens at
        // most), from the live count so a loaded state with unusual counts is covered too.
        need_indexer = indexer_needed(s, kv.layer(il).n_index_comp + (nb + 3) / 4);
        if (need_indexer) {
            linear(L.indexer.q_b, sc.qrn.data(), nb, sc.iq.data(), sc.act, pool);
            linear(L.indexer.proj, sc.a.data(), nb, sc.iw.data(), sc.act, pool);
        }
    }

    LayerKv& C = kv.layer(il);
    const CompressorLane attn_lane{D, ratio, true, s.n_rot, s.rms_eps, &rope};
    const CompressorLane index_lane{I, ratio, false, s.n_rot, s.rms_eps, &rope};
    for (int64_t b = 0; b < nb; ++b) {
        if (b % kCancelTokenGroup == kCancelTokenGroup - 1) poll_cancel();
        const int64_t pos = pos0 + b;
        float* q = &sc.q[b * QD];
        float* kvrow = &sc.kv[b * D];
        rope_tail(q, s.n_head, D, s.n_rot, pos, rope, false);
        rope_tail(kvrow, 1, D, s.n_rot, pos, rope, false);
        fp8_kv_roundtrip(kvrow, D, s.n_rot);
        kv.push_raw(il, kvrow);
        const uint8_t* allowed = nullptr;
        if (ratio != 0) {
            if (compressor_step(attn_lane, L.comp, C.attn_state_kv.data(), C.attn_state_score.data(), &sc.ckv[b * cw],
                                &sc.csc[b * cw], pos, sc.comp_row.data(), sc.comp_tmp.data())) {
                kv.push_comp(il, sc.comp_row.data());
            }
        }
        if (ratio == 4) {
            if (compressor_step(index_lane, L.indexer.comp, C.index_state_kv.data(), C.index_state_score.data(),
                                &sc.ickv[b * icw], &sc.icsc[b * icw], pos, sc.comp_row.data(), sc.comp_tmp.data())) {
                kv.push_index_comp(il, sc.comp_row.data());
            }
            if (indexer_needed(s, C.n_index_comp)) {
                if (!need_indexer) fail(ErrorKind::InvalidArgument, "internal: indexer inputs were not prepared");
                indexer_select(s, rope, pos, &sc.iq[b * s.index_q_dim()], &sc.iw[b * s.indexer_heads],
                               C.index_comp.data(), C.n_index_comp, sc.iscores.data(), sc.order.data(), sc.allowed.data(), pool);
                allowed = sc.allowed.data();
            }
        }
        AttentionInputs in{q, &kv, il, ratio != 0 ? C.comp.data() : nullptr, ratio != 0 ? C.n_comp : 0, allowed,
                           w.attn_sinks.f32()};
        float* heads = &sc.heads[b * QD];
        attend(in, heads, sc.scores.data(), pool);
        rope_tail(heads, s.n_head, D, s.n_rot, pos, rope, true);
    }

    grouped_output_a(s, w.attn_output_a, sc.heads.data(), nb, sc.low.data(), sc.grp.data(), sc.act, pool);
    linear(w.attn_output_b, sc.low.data(), nb, sc.attn_out.data(), sc.act, pool);
    for (int64_t b = 0; b < nb; ++b) {
        hc_post(&sc.H2[b * HD], &sc.attn_out[b * E], &sc.H[b * HD], sc.splits[b], E, s.n_hc);
    }
}

void ffn_layer(const Model& model, const FfnWeights& w, Scratch& sc, const int32_t* tokens, int64_t nb) {
    const Shape& s = model.shape();
    ThreadPool* pool = model.pool();
    const int64_t E = s.n_embd, HD = s.hc_dim(), F = s.n_ff_exp;

    hc_pre_batch(s, w.hc_ffn_fn, w.hc_ffn_scale, w.hc_ffn_base, sc.H2.data(), nb, sc.x.data(), sc.splits.data(),
                 HcScratch{sc.flat.data(), sc.mix.data()}, sc.act, pool);
    for (int64_t b = 0; b < nb; ++b) rms_norm_weight(&sc.a[b * E], &sc.x[b * E], w.ffn_norm.f32(), E, s.rms_eps);
    linear(w.gate_inp, sc.a.data(), nb, sc.rlogits.data(), sc.act, pool);
    linear(w.gate_shexp, sc.a.data(), nb, sc.sg.data(), sc.act, pool);
    linear(w.up_shexp, sc.a.data(), nb, sc.su.data(), sc.act, pool);
    for (int64_t b = 0; b < nb; ++b) swiglu(&sc.smid[b * F], &sc.sg[b * F], &sc.su[b * F], F, s.swiglu_clamp, 1.0f);
    linear(w.down_shexp, sc.smid.data(), nb, sc.sout.data(), sc.act, pool);

    MoeScratch ms{sc.gate.data(), sc.up.data(), sc.mid.data(), sc.down.data(), &sc.xq, &sc.midq};
    const int64_t U = s.n_expert_used;
    for (int64_t b0 = 0; b0 < nb; b0 += kMoeTokenBatch) {
        const int64_t m = std::min(kMoeTokenBatch, nb - b0);
        for (int64_t b = b0; b < b0 + m; ++b) {
            route_token(s, w, &sc.rlogits[b * s.n_expert], tokens[b], &sc.sel[(b - b0) * U], &sc.sel_w[(b - b0) * U],
                        sc.probs.data());
        }
        routed_experts_batch(s, w, &sc.a[b0 * E], m, sc.sel.data(), sc.sel_w.data(), &sc.moe[b0 * E], ms, pool);
        poll_cancel();
    }
    for (int64_t b = 0; b < nb; ++b) {
        float* moe = &sc.moe[b * E];
        const float* shared = &sc.sout[b * E];
        for (int64_t d = 0; d < E; ++d) moe[d] = moe[d] + shared[d];
        hc_post(&sc.H[b * HD], moe, &sc.H2[b * HD], sc.splits[b], E, s.n_hc);
    }
}

}  // namespace

void output_logits(const Model& model, Scratch& sc, const float* H, float* logits) {
    const Shape& s = model.shape();
    const ModelWeights& W = model.weights();
    hc_collapse_norm(s, W.head, H, sc.y.data(), sc.flat.data(), sc.ytmp.data(), sc.act, model.pool());
    linear(W.output, sc.y.data(), 1, logits, sc.act, model.pool());
}

void forward_stage(const Model& model, KvState& kv, Scratch& sc, const int32_t* tokens, int64_t n, int64_t pos0,
                   const float* hc_in, float* hc_out, float* logits, float* final_hc) {
    const Shape& s = model.shape();
    const ModelWeights& W = model.weights();
    const int64_t E = s.n_embd, HD = s.hc_dim();
    const int l0 = model.layer_begin(), l1 = model.layer_end();
    if (kv.first_layer != l0 || kv.first_layer + (int)kv.layers.size() != l1) {
        fail(ErrorKind::InvalidArgument, "internal: KV state layers do not match the stage's layer range");
    }
    int64_t max_comp = 0;
    for (const LayerKv& L : kv.layers) max_comp = std::max(max_comp, L.comp_cap);
    sc.ensure(s, n, kv.raw_cap, max_comp);
    for (int64_t b = 0; b < n; ++b) {
        if (tokens[b] < 0 || tokens[b] >= s.n_vocab) {
            fail(ErrorKind::InvalidArgument, "token id " + std::to_string(tokens[b]) + " is outside the vocabulary [0, " +
                                                 std::to_string(s.n_vocab) + ")");
        }
    }
    if (model.first_stage()) {
        for (int64_t b = 0; b < n; ++b) {
            dequantize_row(W.token_embd.type, W.token_embd.data + (int64_t)tokens[b] * W.token_embd.row_stride(),
                           sc.plain.data(), E);
            for (int h = 0; h < s.n_hc; ++h) std::memcpy(&sc.H[b * HD + h * E], sc.plain.data(), (size_t)E * sizeof(float));
        }
    } else {
        if (!hc_in) fail(ErrorKind::InvalidArgument, "a stage after the first needs the previous stage's HC state");
        std::memcpy(sc.H.data(), hc_in, (size_t)(n * HD) * sizeof(float));
    }
    for (int il = l0; il < l1; ++il) {
        attention_layer(model, W.layers[il], kv, sc, il, n, pos0);
        poll_cancel();
        ffn_layer(model, W.layers[il].ffn, sc, tokens, n);
        poll_cancel();
    }
    if (!model.last_stage()) {
        if (!hc_out) fail(ErrorKind::InvalidArgument, "a stage before the last needs somewhere to put its HC state");
        std::memcpy(hc_out, sc.H.data(), (size_t)(n * HD) * sizeof(float));
        return;
    }
    const float* last = &sc.H[(n - 1) * HD];
    if (final_hc) std::memcpy(final_hc, last, (size_t)HD * sizeof(float));
    if (logits) output_logits(model, sc, last, logits);
}

void forward_batch(const Model& model, KvState& kv, Scratch& sc, const int32_t* tokens, int64_t n, int64_t pos0,
                   float* logits, float* final_hc) {
    forward_stage(model, kv, sc, tokens, n, pos0, nullptr, nullptr, logits, final_hc);
}

Shape mtp_state_shape(const Shape& s) {
    Shape m = s;
    m.n_layer = 1;
    m.compress_ratios = {0};
    return m;
}

void mtp_forward(const Model& model, KvState& mtp_kv, Scratch& sc, const float* hprev, int32_t token, int64_t pos,
                 float* logits, float* hc_out) {
    const Shape& s = model.shape();
    const ModelWeights& W = model.weights();
    const MtpWeights& M = W.mtp;
    if (!M.present) fail(ErrorKind::Unsupported, "this model has no MTP block loaded");
    if (token < 0 || token >= s.n_vocab) {
        fail(ErrorKind::InvalidArgument, "token id " + std::to_string(token) + " is outside the vocabulary");
    }
    const int64_t E = s.n_embd, HD = s.hc_dim();
    sc.ensure(s, 1, mtp_kv.raw_cap, 0);
    ThreadPool* pool = model.pool();
    dequantize_row(W.token_embd.type, W.token_embd.data + (int64_t)token * W.token_embd.row_stride(), sc.plain.data(), E);
    rms_norm_weight(sc.x.data(), sc.plain.data(), M.enorm.f32(), E, s.rms_eps);
    linear(M.e_proj, sc.x.data(), 1, sc.a.data(), sc.act, pool);
    for (int h = 0; h < s.n_hc; ++h) {
        rms_norm_weight(sc.x.data(), hprev + h * E, M.hnorm.f32(), E, s.rms_eps);
        linear(M.h_proj, sc.x.data(), 1, sc.attn_out.data(), sc.act, pool);
        for (int64_t d = 0; d < E; ++d) sc.H[h * E + d] = sc.a[d] + sc.attn_out[d];
    }
    attention_layer(model, M.block, mtp_kv, sc, 0, 1, pos);
    ffn_layer(model, M.block.ffn, sc, &token, 1);
    if (hc_out) std::memcpy(hc_out, sc.H.data(), (size_t)HD * sizeof(float));
    hc_collapse_norm(s, M.head, sc.H.data(), sc.y.data(), sc.flat.data(), sc.ytmp.data(), sc.act, pool);
    linear(W.output, sc.y.data(), 1, logits, sc.act, pool);
}

}  // namespace ds4
