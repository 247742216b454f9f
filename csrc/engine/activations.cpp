#include "engine/activations.h"

#include <algorithm>

namespace ds4 {

namespace {

using backend::DType;
using backend::OwnedTensor;

void make(OwnedTensor& t, backend::Backend& be, int64_t width, int64_t rows, DType type = DType::F32) {
    t = OwnedTensor(be, type, width, rows);
}

}  // namespace

void Activations::ensure(backend::Backend& be, const Shape& s, int64_t nb, int64_t comp_cap) {
    if (nb > rows) {
        const int64_t E = s.n_embd, HD = s.hc_dim(), D = s.head_dim, I = s.indexer_head_dim, F = s.n_ff_exp;
        make(hc, be, HD, nb);
        make(hc_mid, be, HD, nb);
        make(hc_split, be, s.hc_mix(), nb);
        make(sub_in, be, E, nb);
        make(normed, be, E, nb);
        make(q_low, be, s.q_lora_rank, nb);
        make(q_low_normed, be, s.q_lora_rank, nb);
        make(q, be, s.q_dim(), nb);
        make(kv_proj, be, D, nb);
        make(kv_row, be, D, nb);
        make(comp_kv, be, 2 * D, nb);
        make(comp_score, be, 2 * D, nb);
        make(index_kv, be, 2 * I, nb);
        make(index_score, be, 2 * I, nb);
        make(index_q, be, std::max<int64_t>(1, s.index_q_dim()), nb);
        make(index_w, be, std::max(1, s.indexer_heads), nb);
        make(heads, be, s.q_dim(), nb);
        make(out_low, be, s.out_low_dim(), nb);
        make(attn_out, be, E, nb);
        make(router_logits, be, s.n_expert, nb);
        make(expert_ids, be, s.n_expert_used, nb, DType::I32);
        make(expert_weights, be, s.n_expert_used, nb);
        make(shared_gate, be, F, nb);
        make(shared_up, be, F, nb);
        make(shared_mid, be, F, nb);
        make(shared_out, be, E, nb);
        make(ffn_out, be, E, nb);
        make(head_in, be, E, nb);
        rows = nb;
    }
    if (!comp_row) {
        make(comp_row, be, std::max<int64_t>(s.head_dim, s.indexer_head_dim), 1);
        make(mtp_embed, be, s.n_embd, 1);
    }
    if (comp_cap > comp_rows || !index_scores) {
        comp_rows = std::max(comp_cap, comp_rows);
        make(index_scores, be, comp_rows + 1, 1);
        make(index_mask, be, comp_rows + 1, kAttnBlock, DType::U8);
    }
}

}  // namespace ds4
