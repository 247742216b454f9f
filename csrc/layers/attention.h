// Attention core with sinks (docs/model.md §3.8): every head attends the raw sliding window (oldest
// first) then the compressed rows allowed by the indexer, with a learned sink logit in the
// softmax denominator. K and V are the same cached row.
#pragma once
#include <cstdint>


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
};

// out: n_head x head_dim. scores: n_head x (raw_cap + n_comp) floats of scratch.
void attend(const AttentionInputs& in, float* out, float* scores, ThreadPool* pool);

}  // namespace ds4
