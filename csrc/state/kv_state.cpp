#include "state/kv_state.h"

#include <algorithm>
#include <cstring>

#include "common/errors.h"
#include "layers/numerics.h"

namespace ds4 {

namespace {

void fill_frontier(std::vector<float>& kv, std::vector<float>& score) {
    std::fill(kv.begin(), kv.end(), 0.0f);
    std::fill(score.begin(), score.end(), kNegSentinel);
}

void clear_frontier_rows(std::vector<float>& kv, std::vector<float>& score, int64_t width, int ratio,
                         int64_t n_tokens) {
    if (kv.empty() || ratio == 0) return;
    const int64_t rem = n_tokens % ratio;
    const int64_t start = ratio == 4 ? ratio + rem : rem;
    const int64_t end = ratio == 4 ? 2 * ratio : ratio;
    for (int64_t r = start; r < end; ++r) {
        std::fill(kv.begin() + r * width, kv.begin() + (r + 1) * width, 0.0f);
        std::fill(score.begin() + r * width, score.begin() + (r + 1) * width, kNegSentinel);
    }
}

}  // namespace

void KvState::init(const Shape& s, int64_t ctx_size, int l0, int l1) {
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
        L.raw.assign(raw_cap * s.head_dim, 0.0f);
        if (L.ratio != 0) {
            const int64_t coff = Shape::coff(L.ratio);
            L.comp_cap = ctx / L.ratio + 2;
            L.comp.assign_zeroed((size_t)(L.comp_cap * s.head_dim));
            L.attn_state_kv.assign(coff * L.ratio * coff * s.head_dim, 0.0f);
            L.attn_state_score.assign(L.attn_state_kv.size(), kNegSentinel);
            if (L.ratio == 4) {
                L.index_comp.assign_zeroed((size_t)(L.comp_cap * s.indexer_head_dim));
                L.index_state_kv.assign(coff * L.ratio * coff * s.indexer_head_dim, 0.0f);
                L.index_state_score.assign(L.index_state_kv.size(), kNegSentinel);
            }
        }
    }
    reset();
}

void KvState::reset() {
    for (LayerKv& L : layers) {
        L.n_raw = 0;
        L.raw_next = 0;
        L.n_comp = 0;
        L.n_index_comp = 0;
        fill_frontier(L.attn_state_kv, L.attn_state_score);
        fill_frontier(L.index_state_kv, L.index_state_score);
    }
}

void KvState::push_raw(int il, const float* row) {
    LayerKv& L = layer(il);
    const int64_t D = shape.head_dim;
    float* dst = L.raw.data() + L.raw_next * D;
    for (int64_t i = 0; i < D; ++i) dst[i] = f16_round(row[i]);
    L.raw_next = (L.raw_next + 1) % raw_cap;
    if (L.n_raw < raw_cap) ++L.n_raw;
}

const float* KvState::raw_row(int il, int64_t i) const {
    const LayerKv& L = layer(il);
    int64_t slot = L.raw_next - L.n_raw + i;
    if (slot < 0) slot += raw_cap;
    return L.raw.data() + slot * shape.head_dim;
}

float* KvState::raw_row(int il, int64_t i) {
    return const_cast<float*>(static_cast<const KvState*>(this)->raw_row(il, i));
}

void KvState::push_comp(int il, const float* row) {
    LayerKv& L = layer(il);
    if (L.n_comp >= L.comp_cap) {
        fail(ErrorKind::ContextOverflow, "compressed KV cache of layer " + std::to_string(il) + " is full (" +
                                             std::to_string(L.comp_cap) + " rows for ctx " + std::to_string(ctx) + ")");
    }
    const int64_t D = shape.head_dim;
    float* dst = L.comp.data() + L.n_comp * D;
    for (int64_t i = 0; i < D; ++i) dst[i] = f16_round(row[i]);
    ++L.n_comp;
}

void KvState::push_index_comp(int il, const float* row) {
    LayerKv& L = layer(il);
    if (L.n_index_comp >= L.comp_cap) {
        fail(ErrorKind::ContextOverflow, "indexer KV cache of layer " + std::to_string(il) + " is full");
    }
    const int64_t D = shape.indexer_head_dim;
    float* dst = L.index_comp.data() + L.n_index_comp * D;
    for (int64_t i = 0; i < D; ++i) dst[i] = f16_round(row[i]);
    ++L.n_index_comp;
}

void KvState::finish_prefill(int64_t n_tokens) {
    for (LayerKv& L : layers) {
        if (L.ratio == 0) continue;
        const int64_t coff = Shape::coff(L.ratio);
        clear_frontier_rows(L.attn_state_kv, L.attn_state_score, coff * shape.head_dim, L.ratio, n_tokens);
        if (L.ratio == 4) {
            clear_frontier_rows(L.index_state_kv, L.index_state_score, coff * shape.indexer_head_dim, L.ratio, n_tokens);
        }
    }
}

int64_t KvState::allocated_bytes() const {
    int64_t n = 0;
    for (const LayerKv& L : layers) {
        n += (int64_t)(L.raw.size() + L.comp.size() + L.attn_state_kv.size() + L.attn_state_score.size() +
                       L.index_comp.size() + L.index_state_kv.size() + L.index_state_score.size());
    }
    return n * 4;
}

}  // namespace ds4
