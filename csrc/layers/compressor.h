// The KV compressor (docs/model.md §3.7): a per-dimension softmax pooling of every `ratio` tokens into
// one row, with a learned score (gate + APE). Ratio-4 layers pool two overlapping lanes (previous
// window first halves, current window second halves).
#pragma once
#include <cstdint>

#include "layers/rope.h"
#include "model/weights.h"

namespace ds4 {

struct CompressorLane {
    int64_t head_dim;        // lane row width: attention head_dim or indexer_head_dim
    int ratio;               // 4 or 128
    bool fp8;                // true: FP8 on the non-RoPE dims; false: Hadamard-128 + FP4 (indexer)
    int64_t n_rot;
    float eps;
    const RopeParams* rope;
};

// One token at position pos. kv_cur / sc_cur are this token's coff*head_dim projections; sc_cur
// is modified (APE added). Updates the frontier; when the token closes a window writes the new
// row to out (head_dim floats, before the cache's f16 round trip) and returns true.
// `tmp` needs coff*head_dim floats.
bool compressor_step(const CompressorLane& lane, const CompressorWeights& w, float* state_kv, float* state_score,
                     const float* kv_cur, float* sc_cur, int64_t pos, float* out, float* tmp);

}  // namespace ds4
