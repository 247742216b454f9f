#include "state/kv_state.h"

#include <algorithm>
#include <string>

#include "common/errors.h"

namespace ds4 {

namespace {

using backend::DType;
using backend::OwnedTensor;

void fill_frontier(backend::Stream& st, const OwnedTensor& kv, const OwnedTensor& score) {
    if (!kv) return;
    st.fill({*kv, 0.0f});
    st.fill({*score, kNegSentinel});
}

void clear_frontier_rows(backend::Stream& st, const OwnedTensor& kv, const OwnedTensor& score, int ratio,
                         int64_t n_tokens) {
    if (!kv || ratio == 0) return;
    const int64_t rem = n_tokens % ratio;
    const int64_t start = ratio == 4 ? ratio + rem : rem;
    const int64_t end = ratio == 4 ? 2 * ratio : ratio;
    if (end <= start) return;
    st.fill({kv->rows(start, end - start), 0.0f});
    st.fill({score->rows(start, end - start), kNegSentinel});
}

}  // namespace

void KvState::init(backend::Backend& be, backend::Stream& st, const Shape& s, int64_t ctx_size, int l0, int l1) {
    if (ctx_size <= 0) fail(ErrorKind::InvalidArgument, "context size must be positive, got " + std::to_string(ctx_size));
    if (l1 < 0) l1 = s.n_layer;
    if (l0 < 0 || l0 >= l1 || l1 > s.n_layer) {
        fail(ErrorKind::InvalidArgument, "layer range [" + std::to_string(l0) + ", " + std::to_string(l1) +
                                             ") is not a non-empty part of [0, " + std::to_string(s.n_layer) + ")");
    }
    shape = s;
    ctx = ctx_size;
    raw_cap = std::max<int64_t>(1, std::min<int64_t>(s.n_swa, ctx));
    first_layer = l0;
    layers.clear();
    layers.resize((size_t)(l1 - l0));
    for (int il = l0; il < l1; ++il) {
        LayerKv& L = layer(il);
        L.ratio = s.ratio(il);
        L.raw = OwnedTensor(be, DType::F32, s.head_dim, raw_cap);
        if (L.ratio != 0) {
            const int64_t coff = Shape::coff(L.ratio);
            L.comp_cap = ctx / L.ratio + 2;
            L.comp = OwnedTensor(be, DType::F32, s.head_dim, L.comp_cap);
            L.attn_state_kv = OwnedTensor(be, DType::F32, coff * s.head_dim, coff * L.ratio);
            L.attn_state_score = OwnedTensor(be, DType::F32, coff * s.head_dim, coff * L.ratio);
            if (L.ratio == 4) {
                L.index_comp = OwnedTensor(be, DType::F32, s.indexer_head_dim, L.comp_cap);
                L.index_state_kv = OwnedTensor(be, DType::F32, coff * s.indexer_head_dim, coff * L.ratio);
                L.index_state_score = OwnedTensor(be, DType::F32, coff * s.indexer_head_dim, coff * L.ratio);
            }
        }
    }
    reset(st);
}

void KvState::reset(backend::Stream& st) {
    for (LayerKv& L : layers) {
        L.n_raw = 0;
        L.raw_next = 0;
        L.n_comp = 0;
        L.n_index_comp = 0;
        fill_frontier(st, L.attn_state_kv, L.attn_state_score);
        fill_frontier(st, L.index_state_kv, L.index_state_score);
    }
}

backend::Tensor KvState::push_raw_slot(int il) {
    LayerKv& L = layer(il);
    const backend::Tensor row = L.raw->row(L.raw_next);
    L.raw_next = (L.raw_next + 1) % raw_cap;
    if (L.n_raw < raw_cap) ++L.n_raw;
    return row;
}

backend::Tensor KvState::raw_row(int il, int64_t i) const {
    const LayerKv& L = layer(il);
    int64_t slot = L.raw_first(raw_cap) + i;
    if (slot >= raw_cap) slot -= raw_cap;
    return L.raw->row(slot);
}

backend::Tensor KvState::push_comp_slot(int il) {
    LayerKv& L = layer(il);
    if (L.n_comp >= L.comp_cap) {
        fail(ErrorKind::ContextOverflow, "compressed KV cache of layer " + std::to_string(il) + " is full (" +
                                             std::to_string(L.comp_cap) + " rows for ctx " + std::to_string(ctx) + ")");
    }
    return L.comp->row(L.n_comp++);
}

backend::Tensor KvState::push_index_comp_slot(int il) {
    LayerKv& L = layer(il);
    if (L.n_index_comp >= L.comp_cap) {
        fail(ErrorKind::ContextOverflow, "indexer KV cache of layer " + std::to_string(il) + " is full");
    }
    return L.index_comp->row(L.n_index_comp++);
}

void KvState::finish_prefill(backend::Stream& st, int64_t n_tokens) {
    for (LayerKv& L : layers) {
        if (L.ratio == 0) continue;
        clear_frontier_rows(st, L.attn_state_kv, L.attn_state_score, L.ratio, n_tokens);
        if (L.ratio == 4) clear_frontier_rows(st, L.index_state_kv, L.index_state_score, L.ratio, n_tokens);
    }
}

int64_t KvState::allocated_bytes() const {
    int64_t n = 0;
    for (const LayerKv& L : layers) {
        for (const backend::OwnedTensor* t : {&L.raw, &L.comp, &L.attn_state_kv, &L.attn_state_score, &L.index_comp,
                                              &L.index_state_kv, &L.index_state_score}) {
            if (*t) n += (*t)->nbytes();
        }
    }
    return n;
}

}  // namespace ds4
