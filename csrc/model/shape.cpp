#include "model/shape.h"

#include <string>

#include "common/errors.h"

namespace ds4 {

namespace {

[[noreturn]] void bad(const std::string& what) {
    fail(ErrorKind::ModelFormat, "model shape: " + what);
}

void positive(const char* name, int64_t v) {
    if (v <= 0) bad(std::string(name) + " must be positive, got " + std::to_string(v));
}

}  // namespace

void Shape::validate() const {
    positive("n_layer", n_layer);
    positive("n_embd", n_embd);
    positive("n_vocab", n_vocab);
    positive("n_head", n_head);
    positive("head_dim", head_dim);
    positive("n_rot", n_rot);
    positive("n_out_group", n_out_group);
    positive("q_lora_rank", q_lora_rank);
    positive("o_lora_rank", o_lora_rank);
    positive("n_expert", n_expert);
    positive("n_expert_used", n_expert_used);
    positive("n_ff_exp", n_ff_exp);
    positive("n_swa", n_swa);
    positive("n_hc", n_hc);
    positive("sinkhorn_iters", sinkhorn_iters);
    if (n_head_kv != 1) bad("attention.head_count_kv must be 1 (shared K=V MQA), got " + std::to_string(n_head_kv));
    if (n_expert_shared != 1) bad("expert_shared_count must be 1, got " + std::to_string(n_expert_shared));
    if ((int)compress_ratios.size() != n_layer) {
        bad("compress_ratios has " + std::to_string(compress_ratios.size()) + " entries, expected n_layer = " +
            std::to_string(n_layer));
    }
    bool any4 = false;
    for (int il = 0; il < n_layer; ++il) {
        const int r = compress_ratios[il];
        if (r != 0 && r != 4 && r != 128) {
            bad("compress ratio of layer " + std::to_string(il) + " is " + std::to_string(r) + ", expected 0, 4 or 128");
        }
        any4 = any4 || r == 4;
    }
    if (n_rot % 2 != 0 || n_rot > head_dim) bad("rope.dimension_count must be even and <= head_dim");
    if ((head_dim - n_rot) % 64 != 0) bad("head_dim - n_rot must be a multiple of 64 (FP8 blocks)");
    if (head_dim % 32 != 0) bad("head_dim must be a multiple of 32");
    if (n_head % n_out_group != 0) bad("n_head must be a multiple of the output group count");
    if (n_embd % 256 != 0) bad("embedding_length must be a multiple of 256 (Q8_K activations)");
    if (n_ff_exp % 256 != 0) bad("expert_feed_forward_length must be a multiple of 256 (Q8_K activations)");
    if (q_lora_rank % 32 != 0 || o_lora_rank % 32 != 0) bad("LoRA ranks must be multiples of 32");
    if (n_expert_used > n_expert) bad("expert_used_count exceeds expert_count");
    if (n_hash_layer < 0 || n_hash_layer > n_layer) bad("hash_layer_count out of range");
    if (n_hc > 16) bad("hyper_connection.count must be <= 16");
    if (any4) {
        positive("indexer_heads", indexer_heads);
        positive("indexer_top_k", indexer_top_k);
        if (indexer_head_dim != 128) {
            bad("attention.indexer.key_length must be 128 (Hadamard-128), got " + std::to_string(indexer_head_dim));
        }
        if (indexer_head_dim == head_dim) bad("indexer head dim must differ from the attention head dim");
        if (n_rot > indexer_head_dim) bad("n_rot exceeds the indexer head dim");
    }
    if (!(rms_eps > 0.0f) || !(hc_eps >= 0.0f)) bad("epsilons must be positive");
    if (!(rope_freq_base > 0.0f) || !(compress_rope_freq_base > 0.0f)) bad("rope bases must be positive");
    if (rope_orig_ctx <= 0) bad("rope.scaling.original_context_length must be positive");
}

}  // namespace ds4
