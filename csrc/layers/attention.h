// Attention core with sinks (docs/model.md §3.8): every head attends the raw sliding window (oldest
// first) then the compressed rows allowed by the indexer, with a learned sink logit in the
// softmax denominator. K and V are the same cached row.
#pragma once
#include <cstdint>
#include <vector>


namespace ds4 {

class ThreadPool;

struct AttentionInputs {
    const float* q;              // n_head x head_dim, RoPE'd
    const float* raw;            // ring of raw_cap rows of head_dim
    int64_t raw_cap, n_raw;
    int64_t raw_first;           // ring slot of the oldest live row
    const float* comp;           // n_comp x head_dim compressed rows (may be null when n_comp == 0)
    int64_t n_comp;
    const uint8_t* allowed;      // n_comp flags, or null: all compressed rows visible
    const float* sinks;          // n_head
    int64_t n_head, head_dim;
    const float* const* raw_rows = nullptr;   // optional: the n_raw window rows oldest first (the
                                              // ring fields are then unused; attend_queries' path)
};

// out: n_head x head_dim. scores: n_head x (raw_cap + n_comp) floats of scratch.
void attend(const AttentionInputs& in, float* out, float* scores, ThreadPool* pool);

// nq consecutive query tokens (the backend op AttentionBlock, backend/ops.h): query j sees the
// newest min(raw_cap, n_raw + j + 1) positions up to its own (ring rows from before the block, then
// fresh rows 0..j), then the first n_comp[j] compressed rows (allowed by mask row j when j >= mask_first).
struct QueryBlockInputs {
    const float* q;              // nq x n_head x head_dim
    int64_t nq;
    const float* raw;            // the ring before the block
    int64_t raw_cap, n_raw, raw_first;
    const float* fresh;          // nq x head_dim
    const float* comp;           // at least n_comp[nq - 1] rows (null when that is 0)
    const int64_t* n_comp;       // nq counts, non-decreasing
    const uint8_t* mask;         // nq rows of mask_stride flags, or null
    int64_t mask_stride;
    int64_t mask_first;          // queries before it see every compressed row (their mask rows unread)
    const float* sinks;
    int64_t n_head, head_dim;
};

// out: nq x n_head x head_dim; every query's rows equal attend()'s for it alone, bit for bit (the
// x86 kernels load each shared K/V row once for up to 4 queries). scratch grows as needed.
void attend_queries(const QueryBlockInputs& in, float* out, std::vector<float>& scratch, ThreadPool* pool);

}  // namespace ds4
