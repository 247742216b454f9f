// The ratio-4 "lightning" indexer (docs/model.md §3.6): scores every compressed indexer row against
// per-head FP4 queries and keeps the top_k rows for attention.
#pragma once
#include <cstdint>

#include "layers/rope.h"
#include "model/shape.h"

namespace ds4 {

class ThreadPool;

// Whether a query at this point needs the indexer at all (n_comp > top_k).
inline bool indexer_needed(const Shape& s, int64_t n_comp) { return n_comp > s.indexer_top_k; }

// q: indexer_heads x indexer_head_dim projection of qr_norm (modified: RoPE, Hadamard, FP4).
// w: indexer_heads projection of the attention input (modified: scaled).
// rows: n_comp x indexer_head_dim compressed indexer rows. Writes allowed[0..n_comp) (1 = kept,
// exactly top_k ones) using scores (n_comp floats) and order (n_comp ints) of scratch.
void indexer_select(const Shape& s, const RopeParams& rope, int64_t pos, float* q, float* w, const float* rows,
                    int64_t n_comp, float* scores, int32_t* order, uint8_t* allowed, ThreadPool* pool);

// Upstream's selection, as a function: marks the top k rows by (score desc, index asc) among
// scores above the -1e30 sentinel (NaN never selected); like upstream's repeated scans, row 0
// is marked as well when fewer than k rows qualify. O(n log k) instead of O(n k).
void select_top_k(const float* scores, int64_t n, int64_t k, int32_t* order, uint8_t* allowed);

}  // namespace ds4
