// Every tensor the forward pass reads, bound per layer from the tensor table (docs/model.md §2).
#pragma once
#include <vector>

#include "model/shape.h"
#include "model/tensor.h"

namespace ds4 {

struct AttentionWeights {
    TensorRef hc_attn_fn, hc_attn_scale, hc_attn_base;
    TensorRef attn_norm, attn_q_a, attn_q_a_norm, attn_q_b, attn_kv, attn_kv_a_norm, attn_sinks;
    TensorRef attn_output_a, attn_output_b;
};

struct CompressorWeights {
    TensorRef ape, kv, gate, norm;   // absent (null) when the layer has no such compressor
};

struct IndexerWeights {
    TensorRef q_b, proj;
    CompressorWeights comp;
};

struct FfnWeights {
    TensorRef hc_ffn_fn, hc_ffn_scale, hc_ffn_base;
    TensorRef ffn_norm, gate_inp, exp_probs_b, tid2eid;
    TensorRef gate_exps, up_exps, down_exps;
    TensorRef gate_shexp, up_shexp, down_shexp;
};

struct LayerWeights {
    AttentionWeights attn;
    CompressorWeights comp;     // ratio != 0
    IndexerWeights indexer;     // ratio == 4
    FfnWeights ffn;
};

struct OutputHeadWeights {
    TensorRef hc_fn, hc_scale, hc_base, norm;
};

struct MtpWeights {
    bool present = false;
    OutputHeadWeights head;          // mtp.0.hc_head_* and mtp.0.norm
    TensorRef e_proj, h_proj, enorm, hnorm;
    LayerWeights block;              // runs as a ratio-0 layer
};

struct ModelWeights {
    TensorRef token_embd, output;    // token_embd: first stage only; output and head: last only
    OutputHeadWeights head;
    std::vector<LayerWeights> layers;   // n_layer entries; only [layer_begin, layer_end) are bound
    MtpWeights mtp;
    int routed_bits = 2;             // 4 when the routed experts are Q4_K
    int layer_begin = 0, layer_end = 0;

    bool first_stage() const { return layer_begin == 0; }
    bool last_stage(const Shape& s) const { return layer_end == s.n_layer; }

    // Binds the tensors of layers [l0, l1) (l1 < 0: all), plus the embedding when l0 == 0 and the
    // output head when l1 == n_layer; no other tensor of the file is touched.
    void bind(const Shape& s, const TensorTable& t, int l0 = 0, int l1 = -1);
    void bind_mtp(const Shape& s, const TensorTable& t);   // throws ModelFormat if incomplete
    // The token embedding alone (a last stage's MTP block embeds its draft token).
    void bind_embedding(const Shape& s, const TensorTable& t);
};

}  // namespace ds4
