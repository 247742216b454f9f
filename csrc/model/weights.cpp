#include "model/weights.h"

#include "common/errors.h"

namespace ds4 {

namespace {

using T = GgmlType;
const std::vector<GgmlType> kF32{T::F32};
const std::vector<GgmlType> kPlain{T::F16, T::F32, T::BF16};
const std::vector<GgmlType> kDense{T::Q8_0, T::F16, T::F32, T::BF16};
const std::vector<GgmlType> kRouted{T::IQ2_XXS, T::Q2_K, T::Q4_K};

void bind_attention(AttentionWeights& a, const Shape& s, const TensorTable& t, const std::string& p) {
    const int64_t E = s.n_embd, H = s.hc_dim(), M = s.hc_mix();
    a.hc_attn_fn = t.get(p + "hc_attn_fn.weight", {H, M}, kPlain);
    a.hc_attn_scale = t.get(p + "hc_attn_scale.weight", {3}, kF32);
    a.hc_attn_base = t.get(p + "hc_attn_base.weight", {M}, kF32);
    a.attn_norm = t.get(p + "attn_norm.weight", {E}, kF32);
    a.attn_q_a = t.get(p + "attn_q_a.weight", {E, s.q_lora_rank}, kDense);
    a.attn_q_a_norm = t.get(p + "attn_q_a_norm.weight", {s.q_lora_rank}, kF32);
    a.attn_q_b = t.get(p + "attn_q_b.weight", {s.q_lora_rank, s.q_dim()}, kDense);
    a.attn_kv = t.get(p + "attn_kv.weight", {E, s.head_dim}, kDense);
    a.attn_kv_a_norm = t.get(p + "attn_kv_a_norm.weight", {s.head_dim}, kF32);
    a.attn_sinks = t.get(p + "attn_sinks.weight", {s.n_head}, kF32);
    a.attn_output_a = t.get(p + "attn_output_a.weight", {s.group_dim(), s.out_low_dim()}, kDense);
    a.attn_output_b = t.get(p + "attn_output_b.weight", {s.out_low_dim(), E}, kDense);
}

void bind_ffn(FfnWeights& f, const Shape& s, const TensorTable& t, const std::string& p, bool allow_hash,
              bool require_bias) {
    const int64_t E = s.n_embd, H = s.hc_dim(), M = s.hc_mix(), F = s.n_ff_exp, X = s.n_expert;
    f.hc_ffn_fn = t.get(p + "hc_ffn_fn.weight", {H, M}, kPlain);
    f.hc_ffn_scale = t.get(p + "hc_ffn_scale.weight", {3}, kF32);
    f.hc_ffn_base = t.get(p + "hc_ffn_base.weight", {M}, kF32);
    f.ffn_norm = t.get(p + "ffn_norm.weight", {E}, kF32);
    f.gate_inp = t.get(p + "ffn_gate_inp.weight", {E, X}, kPlain);
    f.exp_probs_b = require_bias ? t.get(p + "exp_probs_b.bias", {X}, kF32)
                                 : t.get_optional(p + "exp_probs_b.bias", {X}, kF32);
    if (allow_hash) f.tid2eid = t.get(p + "ffn_gate_tid2eid.weight", {s.n_expert_used, s.n_vocab}, {T::I32});
    f.gate_exps = t.get(p + "ffn_gate_exps.weight", {E, F, X}, kRouted);
    f.up_exps = t.get(p + "ffn_up_exps.weight", {E, F, X}, {f.gate_exps.type});
    f.down_exps = t.get(p + "ffn_down_exps.weight", {F, E, X}, kRouted);
    f.gate_shexp = t.get(p + "ffn_gate_shexp.weight", {E, F}, kDense);
    f.up_shexp = t.get(p + "ffn_up_shexp.weight", {E, F}, {f.gate_shexp.type});
    f.down_shexp = t.get(p + "ffn_down_shexp.weight", {F, E}, kDense);
}

void bind_compressor(CompressorWeights& c, const TensorTable& t, const std::string& p, int64_t E,
                     int64_t head_dim, int ratio) {
    const int64_t w = Shape::coff(ratio) * head_dim;
    c.ape = t.get(p + "_ape.weight", {w, ratio}, kPlain);
    c.kv = t.get(p + "_kv.weight", {E, w}, kDense);
    c.gate = t.get(p + "_gate.weight", {E, w}, kDense);
    c.norm = t.get(p + "_norm.weight", {head_dim}, kF32);
}

void bind_head(OutputHeadWeights& h, const Shape& s, const TensorTable& t, const std::string& p,
               const std::string& norm_name) {
    h.hc_base = t.get(p + "base.weight", {s.n_hc}, kF32);
    h.hc_fn = t.get(p + "fn.weight", {s.hc_dim(), s.n_hc}, kPlain);
    h.hc_scale = t.get(p + "scale.weight", {1}, kF32);
    h.norm = t.get(norm_name, {s.n_embd}, kF32);
}

}  // namespace

void ModelWeights::bind(const Shape& s, const TensorTable& t, int l0, int l1) {
    s.validate();
    if (l1 < 0) l1 = s.n_layer;
    if (l0 < 0 || l0 >= l1 || l1 > s.n_layer) {
        fail(ErrorKind::InvalidArgument, t.file() + ": layer range [" + std::to_string(l0) + ", " + std::to_string(l1) +
                                             ") is not a non-empty part of the model's " + std::to_string(s.n_layer) +
                                             " layers");
    }
    layer_begin = l0;
    layer_end = l1;
    if (first_stage()) bind_embedding(s, t);
    if (last_stage(s)) {
        output = t.get("output.weight", {s.n_embd, s.n_vocab}, kDense);
        bind_head(head, s, t, "output_hc_", "output_norm.weight");
    }
    layers.assign(s.n_layer, LayerWeights{});
    for (int il = l0; il < l1; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        LayerWeights& L = layers[il];
        bind_attention(L.attn, s, t, p);
        bind_ffn(L.ffn, s, t, p, il < s.n_hash_layer, false);
        const int ratio = s.ratio(il);
        if (ratio != 0) bind_compressor(L.comp, t, p + "attn_compressor", s.n_embd, s.head_dim, ratio);
        if (ratio == 4) {
            L.indexer.q_b = t.get(p + "indexer.attn_q_b.weight", {s.q_lora_rank, s.index_q_dim()}, kDense);
            L.indexer.proj = t.get(p + "indexer.proj.weight", {s.n_embd, s.indexer_heads}, kDense);
            bind_compressor(L.indexer.comp, t, p + "indexer_compressor", s.n_embd, s.indexer_head_dim, 4);
        }
        if (L.ffn.gate_exps.type != layers[l0].ffn.gate_exps.type) {
            fail(ErrorKind::ModelFormat, t.file() + ": routed expert type differs between layers " +
                                             std::to_string(l0) + " and " + std::to_string(il));
        }
    }
    routed_bits = layers[l0].ffn.gate_exps.type == GgmlType::Q4_K ? 4 : 2;
}

void ModelWeights::bind_embedding(const Shape& s, const TensorTable& t) {
    token_embd = t.get("token_embd.weight", {s.n_embd, s.n_vocab}, kPlain);
}

void ModelWeights::bind_mtp(const Shape& s, const TensorTable& t) {
    const std::string p = "mtp.0.";
    bind_head(mtp.head, s, t, p + "hc_head_", p + "norm.weight");
    mtp.e_proj = t.get(p + "e_proj.weight", {s.n_embd, s.n_embd}, kDense);
    mtp.h_proj = t.get(p + "h_proj.weight", {s.n_embd, s.n_embd}, kDense);
    mtp.enorm = t.get(p + "enorm.weight", {s.n_embd}, kF32);
    mtp.hnorm = t.get(p + "hnorm.weight", {s.n_embd}, kF32);
    bind_attention(mtp.block.attn, s, t, p);
    bind_ffn(mtp.block.ffn, s, t, p, false, true);
    mtp.present = true;
}

}  // namespace ds4
