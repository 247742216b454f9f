// The ratio-4 "lightning" indexer (docs/model.md §3.6): scores every compressed indexer row against
// per-head FP4 queries and keeps the top_k rows for attention.
#pragma once
#include <cstdint>

#include "model/rope_params.h"
#include "model/shape.h"

namespace ds4 {

class ThreadPool;

// Whether a query at this point needs the indexer at all (n_comp > top_k).
inline bool indexer_needed(const Shape& s, int64_t n_comp) { return n_comp > s.indexer_top_k; }

// Prepares one query (q: n_head x head_dim, modified: RoPE at pos, Hadamard-128 + FP4 per head;
// w: n_head weights, modified: scaled by 1/sqrt(head_dim*n_head)) and scores every compressed
// row: scores[c] = sum_h max(0, rows[c]·q_h) * w[h].
void indexer_scores(float* q, float* w, const float* rows, int64_t n_rows, int64_t n_head, int64_t head_dim,
                    int64_t n_rot, int64_t pos, const RopeParams& rope, float* scores, ThreadPool* pool);

// Upstream's selection, as a function: marks the top k rows by (score desc, index asc) among
// scores above the -1e30 sentinel (NaN never selected); like upstream's repeated scans, row 0
// is marked as well when fewer than k rows qualify. O(n log k) instead of O(n k).
void select_top_k(const float* scores, int64_t n, int64_t k, int32_t* order, uint8_t* allowed);

}  // namespace ds4
