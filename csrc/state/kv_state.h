// The per-session KV state of every layer (docs/architecture.md, "state"), held in backend
// tensors. The raw sliding window is a ring of raw_cap rows (oldest first from raw_first());
// compressed rows and compressor frontiers are laid out exactly as the DSV4 session payload
// serialises them. The row counts live on the host: the graph never reads the device to decide.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/shape.h"

namespace ds4 {

constexpr float kNegSentinel = -1.0e30f;   // upstream's finite "minus infinity" (frontier score fill)

struct LayerKv {
    int ratio = 0;                         // 0, 4 or 128

    // Raw sliding window: raw_cap rows of head_dim; n_raw live rows, the next push goes to slot
    // raw_next. Rows are f16-representable (rounded when stored).
    backend::OwnedTensor raw;
    int64_t n_raw = 0;
    int64_t raw_next = 0;

    // Compressed attention rows (ratio != 0): comp_cap rows of head_dim; n_comp live.
    backend::OwnedTensor comp;
    int64_t comp_cap = 0;
    int64_t n_comp = 0;
    // Attention compressor frontier: coff*ratio rows x coff*head_dim (kv init 0, score init NEG).
    backend::OwnedTensor attn_state_kv, attn_state_score;

    // Indexer (ratio == 4): comp_cap rows of indexer_head_dim; frontier coff*ratio x coff*idx_dim.
    backend::OwnedTensor index_comp;
    int64_t n_index_comp = 0;
    backend::OwnedTensor index_state_kv, index_state_score;

    int64_t raw_first(int64_t raw_cap) const {
        int64_t slot = raw_next - n_raw;
        return slot < 0 ? slot + raw_cap : slot;
    }
};

struct KvState {
    Shape shape;
    int64_t ctx = 0;
    int64_t raw_cap = 0;                   // min(n_swa, ctx), at least 1
    // A pipeline stage holds only the layers [first_layer, first_layer + layers.size()) of the
    // model; every method taking `il` takes the model-wide layer index.
    int first_layer = 0;
    std::vector<LayerKv> layers;

    // Allocates everything for ctx on `be` (comp_cap = ctx/ratio + 2 per compressed layer) for the
    // layers [l0, l1) of s (l1 < 0: up to s.n_layer; a pipeline stage holds only its layers) and
    // resets through `st`.
    void init(backend::Backend& be, backend::Stream& st, const Shape& s, int64_t ctx_size, int l0 = 0, int l1 = -1);
    // Back to the empty state: no rows, frontiers at their initial fill.
    void reset(backend::Stream& st);

    LayerKv& layer(int il) { return layers[(size_t)(il - first_layer)]; }
    const LayerKv& layer(int il) const { return layers[(size_t)(il - first_layer)]; }

    // The ring row the next raw row of layer il goes to; counts it (the oldest row drops when full).
    backend::Tensor push_raw_slot(int il);
    // Live raw row i of layer il, i = 0 is the oldest.
    backend::Tensor raw_row(int il, int64_t i) const;
    // The row the next compressed attention / indexer row goes to; counts it. Throws
    // ContextOverflow if the layer's capacity is exhausted.
    backend::Tensor push_comp_slot(int il);
    backend::Tensor push_index_comp_slot(int il);

    // After a prefill of n_tokens total tokens: reset frontier rows not yet written by the
    // current window to their initial fill (no numerical effect, keeps saved payloads
    // byte-comparable with upstream).
    void finish_prefill(backend::Stream& st, int64_t n_tokens);

    // Bytes of all allocated state (capacity, not live rows).
    int64_t allocated_bytes() const;
};

}  // namespace ds4
