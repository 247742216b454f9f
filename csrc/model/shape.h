// Sizes and hyper-parameters of a DeepSeek V4 model: the C++ twin of ds4.shape.ModelShape.
// Filled once from validated GGUF metadata (Python side); Flash and Pro are two values of it.
#pragma once
#include <cstdint>
#include <vector>

namespace ds4 {

struct Shape {
    int n_layer = 0;
    int n_embd = 0;
    int n_vocab = 0;
    int n_head = 0;
    int n_head_kv = 1;
    int head_dim = 0;          // K == V row width
    int n_rot = 0;             // RoPE'd tail of each head
    int n_out_group = 0;
    int q_lora_rank = 0;
    int o_lora_rank = 0;
    int n_expert = 0;
    int n_expert_used = 0;
    int n_expert_shared = 1;
    int n_ff_exp = 0;
    int n_hash_layer = 0;
    int n_swa = 128;
    int indexer_heads = 0;
    int indexer_head_dim = 0;
    int indexer_top_k = 0;
    int n_hc = 4;
    int sinkhorn_iters = 20;
    std::vector<int> compress_ratios;  // one per layer: 0, 4 or 128
    float rms_eps = 1e-6f;
    float hc_eps = 1e-6f;
    float expert_weights_scale = 1.5f;
    float swiglu_clamp = 10.0f;
    float rope_freq_base = 10000.0f;
    float rope_scale_factor = 16.0f;
    float yarn_beta_fast = 32.0f;
    float yarn_beta_slow = 1.0f;
    int64_t rope_orig_ctx = 65536;
    float compress_rope_freq_base = 160000.0f;

    int ratio(int il) const { return compress_ratios[il]; }
    static int coff(int ratio) { return ratio == 4 ? 2 : 1; }
    // The compressor-frontier row a token at position pos writes (ratio 4: the current window's
    // half, rows 4..7; ratio 128: row pos % 128).
    static int64_t frontier_row(int ratio, int64_t pos) { return ratio == 4 ? ratio + pos % ratio : pos % ratio; }
    int64_t hc_dim() const { return int64_t(n_embd) * n_hc; }
    int hc_mix() const { return 2 * n_hc + n_hc * n_hc; }
    int64_t q_dim() const { return int64_t(n_head) * head_dim; }
    int n_nope() const { return head_dim - n_rot; }
    int group_heads() const { return n_head / n_out_group; }
    int64_t group_dim() const { return int64_t(head_dim) * group_heads(); }
    int64_t out_low_dim() const { return int64_t(n_out_group) * o_lora_rank; }
    int64_t index_q_dim() const { return int64_t(indexer_heads) * indexer_head_dim; }

    // Throws ds4::Error(ModelFormat) naming the first inconsistent field.
    void validate() const;
};

}  // namespace ds4
