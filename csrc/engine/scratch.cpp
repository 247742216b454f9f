#include "engine/scratch.h"

#include <algorithm>

#include "layers/moe.h"

namespace ds4 {

namespace {

template <class V>
void grow(V& v, int64_t n) {
    if ((int64_t)v.size() < n) v.resize((size_t)n);
}

}  // namespace

void Scratch::ensure(const Shape& s, int64_t nb, int64_t raw_cap, int64_t comp_rows) {
    if (nb > tokens) {
        const int64_t E = s.n_embd, HD = s.hc_dim(), D = s.head_dim, I = s.indexer_head_dim;
        grow(H, nb * HD);
        grow(H2, nb * HD);
        grow(flat, nb * HD);
        grow(mix, nb * s.hc_mix());
        grow(splits, nb);
        grow(x, nb * E);
        grow(a, nb * E);
        grow(qr, nb * s.q_lora_rank);
        grow(qrn, nb * s.q_lora_rank);
        grow(q, nb * s.q_dim());
        grow(kvr, nb * D);
        grow(kv, nb * D);
        grow(ckv, nb * 2 * D);
        grow(csc, nb * 2 * D);
        grow(ickv, nb * 2 * I);
        grow(icsc, nb * 2 * I);
        grow(iq, nb * s.index_q_dim());
        grow(iw, nb * std::max(1, s.indexer_heads));
        grow(heads, nb * s.q_dim());
        grow(low, nb * s.out_low_dim());
        grow(grp, nb * s.o_lora_rank);
        grow(attn_out, nb * E);
        grow(rlogits, nb * s.n_expert);
        grow(sg, nb * s.n_ff_exp);
        grow(su, nb * s.n_ff_exp);
        grow(smid, nb * s.n_ff_exp);
        grow(sout, nb * E);
        grow(moe, nb * E);
        // Routed experts run kMoeTokenBatch tokens at a time (per-pair buffers).
        const int64_t mt = std::min(nb, kMoeTokenBatch), U = s.n_expert_used, F = s.n_ff_exp;
        grow(gate, mt * U * F);
        grow(up, mt * U * F);
        grow(mid, mt * U * F);
        grow(down, mt * U * E);
        grow(sel, mt * U);
        grow(sel_w, mt * U);
        tokens = nb;
    }
    if (probs.empty()) {
        const int64_t E = s.n_embd, F = s.n_ff_exp, U = s.n_expert_used;
        const int64_t W = 2 * std::max<int64_t>(s.head_dim, s.indexer_head_dim);
        grow(gate, U * F);
        grow(up, U * F);
        grow(mid, U * F);
        grow(down, U * E);
        grow(probs, 2 * s.n_expert);
        grow(comp_row, W);
        grow(comp_tmp, W);
        grow(y, E);
        grow(ytmp, E);
        grow(plain, E);
        grow(sel, U);
        grow(sel_w, U);
    }
    if (comp_rows > comp_cap || scores.empty()) {
        comp_cap = std::max(comp_rows, comp_cap);
        grow(scores, s.n_head * (raw_cap + comp_cap));
        grow(iscores, comp_cap + 1);
        grow(allowed, comp_cap + 1);
        grow(order, comp_cap + 1);
    }
}

}  // namespace ds4
