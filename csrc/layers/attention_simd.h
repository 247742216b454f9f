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

// Several queries at once (attend_block): the union of their rows in softmax order (raw positions
// ascending, then compressed rows ascending); bit k of who[r]: query k attends row r. Every
// query's own rows are a subsequence of this list in its own order.
struct QueryBlockRows {
    const float* const* rows;
    const uint8_t* who;
    int64_t n_rows;
};

// Heads [h0, h1) of nq queries (q[k], out[k]: their n_head x head_dim rows) over the shared rows;
// each query's result is attend_heads' for its own rows, bit for bit. scratch: at least
// nq * 4 * (head_dim + rows.n_rows) floats.
using AttendQueriesFn = void (*)(const float* const* q, float* const* out, int64_t nq, const float* sinks,
                                 int64_t head_dim, const QueryBlockRows& rows, float* scratch, int64_t h0, int64_t h1);
// The most queries one call takes: AVX-512 has 32 vector registers (4 queries x 4 heads of dot
// accumulators fit), AVX2 16 (2 queries).
constexpr int kAttendQueriesAvx2 = 2;
constexpr int kAttendQueriesAvx512 = 4;

#if defined(DS4_ARCH_X86)
void attend_queries_avx2(const float* const* q, float* const* out, int64_t nq, const float* sinks, int64_t head_dim,
                         const QueryBlockRows& rows, float* scratch, int64_t h0, int64_t h1);
void attend_queries_avx512(const float* const* q, float* const* out, int64_t nq, const float* sinks,
                           int64_t head_dim, const QueryBlockRows& rows, float* scratch, int64_t h0, int64_t h1);
void attend_heads_avx2(const AttentionInputs& in, const AttentionRows& rows, float* out, float* weights,
                       int64_t stride, int64_t h0, int64_t h1);
void attend_heads_avx512(const AttentionInputs& in, const AttentionRows& rows, float* out, float* weights,
                         int64_t stride, int64_t h0, int64_t h1);
// out[k] = dot_f32_lanes(qs[k], row, n) for k < nq, bit for bit (the indexer's row scores).
void lanes_row_dots_avx2(const float* const* qs, int64_t nq, const float* row, int64_t n, float* out);
void lanes_row_dots_avx512(const float* const* qs, int64_t nq, const float* row, int64_t n, float* out);
#endif

}  // namespace ds4
