// x86 SIMD attention and indexer-score kernels (attention_avx2.cpp, attention_avx512.cpp): the same float order as the
// portable "lanes" path of attention.cpp (dot_f32_lanes, then element-wise accumulation), so their
// results are bit-identical to it; they are only faster. See docs/kernels.md "Attention".
#pragma once
#include <cstdint>

#include "layers/attention.h"

namespace ds4 {

// The rows every head of one token attends, in the softmax order: the raw window oldest first, then
// the compressed rows the indexer allowed.
struct AttentionRows {
    const float* const* rows;
    int64_t n_rows;
};

// Heads [h0, h1): out (n_head x head_dim), weights: scratch of n_head x stride floats.
using LanesRowDotsFn = void (*)(const float* const* qs, int64_t nq, const float* row, int64_t n, float* out);
using AttendHeadsFn = void (*)(const AttentionInputs& in, const AttentionRows& rows, float* out, float* weights,
                               int64_t stride, int64_t h0, int64_t h1);

#if defined(DS4_ARCH_X86)
void attend_heads_avx2(const AttentionInputs& in, const AttentionRows& rows, float* out, float* weights,
                       int64_t stride, int64_t h0, int64_t h1);
void attend_heads_avx512(const AttentionInputs& in, const AttentionRows& rows, float* out, float* weights,
                         int64_t stride, int64_t h0, int64_t h1);
// out[k] = dot_f32_lanes(qs[k], row, n) for k < nq, bit for bit (the indexer's row scores).
void lanes_row_dots_avx2(const float* const* qs, int64_t nq, const float* row, int64_t n, float* out);
void lanes_row_dots_avx512(const float* const* qs, int64_t nq, const float* row, int64_t n, float* out);
#endif

}  // namespace ds4
