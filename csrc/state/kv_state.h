// The per-session KV state of every layer (docs/runtime.md §5.1). The raw sliding window is a ring of
// raw_cap rows (read oldest first through raw_row()); compressed rows and compressor frontiers are
// laid out exactly as the DSV4 session payload serialises them.
#pragma once
#include <cstdint>
#include <vector>

#include "model/shape.h"
#include "state/row_buffer.h"

namespace ds4 {

constexpr float kNegSentinel = -1.0e30f;   // upstream's finite "minus infinity"

struct LayerKv {
    int ratio = 0;                         // 0, 4 or 128

    // Raw sliding window: a ring of raw_cap rows of head_dim floats; n_raw live rows, the next
    // push goes to slot raw_next. Rows are f16-representable (rounded on push).
    std::vector<float> raw;
    int64_t n_raw = 0;
    int64_t raw_next = 0;

    // Compressed attention rows (ratio != 0): comp_cap rows of head_dim; n_comp live.
    RowBuffer comp;
    int64_t comp_cap = 0;
    int64_t n_comp = 0;
    // Attention compressor frontier: coff*ratio rows x coff*head_dim (kv init 0, score init NEG).
    std::vector<float> attn_state_kv;
    std::vector<float> attn_state_score;

    // Indexer (ratio == 4): comp_cap rows of indexer_head_dim; frontier coff*ratio x coff*idx_dim.
    RowBuffer index_comp;
    int64_t n_index_comp = 0;
    std::vector<float> index_state_kv;
    std::vector<float> index_state_score;
};

struct KvState {
    Shape shape;
    int64_t ctx = 0;
    int64_t raw_cap = 0;                   // min(n_swa, ctx), at least 1
    // A pipeline stage holds only the layers [first_layer, first_layer + layers.size()) of the
    // model; every method taking `il` takes the model-wide layer index.
    int first_layer = 0;
    std::vector<LayerKv> layers;

    // Allocates everything for ctx (comp_cap = ctx/ratio + 2 per compressed layer) and resets,
    // for the layers [l0, l1) of s (l1 < 0: up to s.n_layer).
    void init(const Shape& s, int64_t ctx_size, int l0 = 0, int l1 = -1);
    // Back to the empty state: no rows, frontiers at their initial fill.
    void reset();

    LayerKv& layer(int il) { return layers[(size_t)(il - first_layer)]; }
    const LayerKv& layer(int il) const { return layers[(size_t)(il - first_layer)]; }

    // Appends a raw row (f16 round trip applied here); drops the oldest row when full.
    void push_raw(int il, const float* row);
    // Live raw row i of layer il, i = 0 is the oldest.
    const float* raw_row(int il, int64_t i) const;
    float* raw_row(int il, int64_t i);
    // Appends a compressed attention / indexer row (f16 round trip here). Throws
    // ContextOverflow if the layer's capacity is exhausted.
    void push_comp(int il, const float* row);
    void push_index_comp(int il, const float* row);

    // After a prefill of n_tokens total tokens: reset frontier rows not yet written by the
    // current window to their initial fill (docs/runtime.md §5.1; no numerical effect, keeps saved
    // payloads byte-comparable with upstream).
    void finish_prefill(int64_t n_tokens);

    // Bytes of all allocated state (capacity, not live rows).
    int64_t allocated_bytes() const;
};

}  // namespace ds4
