// The KV compressor (docs/model.md §3.7): a per-dimension softmax pooling of every `ratio` tokens into
// one row, with a learned score (gate + APE). Ratio-4 layers pool two overlapping lanes (previous
// window first halves, current window second halves). Three steps, one per backend op: store a
// token into the frontier, pool a closed window into a row, and (ratio 4) shift the windows.
#pragma once
#include <cstdint>

#include "model/rope_params.h"
#include "model/tensor.h"

namespace ds4 {

// One token at position pos: adds APE row pos % ratio (dequantised through tmp, width floats)
// to score_cur, then writes kv_cur / score_cur (coff*head_dim floats) into the frontier row of
// this position.
void compressor_store(const TensorRef& ape, float* state_kv, float* state_score, const float* kv_cur,
                      float* score_cur, int ratio, int64_t head_dim, int64_t pos, float* tmp);

// The closed window's row: softmax pool -> RMSNorm(norm) -> RoPE at the window's first position
// `pos` -> FP8 (fp8) or Hadamard-128 + FP4. out: head_dim floats; tmp: head_dim floats.
void compressor_pool(const float* norm, const float* state_kv, const float* state_score, int ratio,
                     int64_t head_dim, int64_t n_rot, float eps, const RopeParams& rope, int64_t pos, bool fp8,
                     float* out, float* tmp);

// Ratio 4: the current window (rows 4..7) becomes the previous one (rows 0..3); rows 4..7 keep
// their contents and are overwritten before the next emission.
void compressor_shift(float* state_kv, float* state_score, int64_t head_dim);

}  // namespace ds4
