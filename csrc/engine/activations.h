// The activations of a forward pass over up to `rows` tokens, as backend tensors (one row per
// token). They only grow (on the first batch of a given size), so the decode loop never allocates.
#pragma once
#include <cstdint>

#include "backend/backend.h"
#include "model/shape.h"

namespace ds4 {

struct Activations {
    // Prefill attention runs in blocks of this many query tokens (engine/forward.cpp): each has its
    // own indexer keep-mask row.
    static constexpr int64_t kAttnBlock = 16;

    int64_t rows = 0;                      // batch capacity
    int64_t comp_rows = 0;                 // compressed-row capacity (indexer scores and mask)

    // Hyper-connection residual streams (hc_dim per token) entering the layer / after attention,
    // and the HC split (pre, post, comb) of the sublayer being run.
    backend::OwnedTensor hc, hc_mid, hc_split;
    // Sublayer input (HC-mixed, n_embd) and its RMSNorm.
    backend::OwnedTensor sub_in, normed;
    // Attention: low-rank query, its norm, full query, KV projection and the stored KV row.
    backend::OwnedTensor q_low, q_low_normed, q, kv_proj, kv_row;
    // Compressor projections (attention lane, indexer lane), indexer query and head weights.
    backend::OwnedTensor comp_kv, comp_score, index_kv, index_score, index_q, index_w;
    // Attention output: per-head results, the grouped low-rank output and the projected output.
    backend::OwnedTensor heads, out_low, attn_out;
    // FFN: router logits and choices, shared expert, routed experts' sum.
    backend::OwnedTensor router_logits, expert_ids, expert_weights;
    backend::OwnedTensor shared_gate, shared_up, shared_mid, shared_out, ffn_out;
    // The output head's input (one row per token: a verification pass runs the head on each).
    backend::OwnedTensor head_in;
    // One token at a time: a closed compressor window's row, indexer scores and the MTP block's
    // embedding; keep-masks: kAttnBlock rows (one per query of an attention block).
    backend::OwnedTensor comp_row, index_scores, index_mask, mtp_embed;

    // Grows the tensors for a batch of nb tokens and comp_rows compressed rows.
    void ensure(backend::Backend& be, const Shape& s, int64_t nb, int64_t comp_rows);
};

}  // namespace ds4
