// AVX2 attention kernel: 8-float vectors for the value accumulation (attention_simd.inc).
#include <immintrin.h>

#include "layers/attention_simd.h"

namespace {
using AccVec = __m256;
constexpr int kAccLanes = 8;
constexpr int kAccRegs = 16;                        // vector registers of the ISA
inline AccVec acc_zero() { return _mm256_setzero_ps(); }
inline AccVec acc_load(const float* p) { return _mm256_loadu_ps(p); }
inline void acc_store(float* p, AccVec v) { _mm256_storeu_ps(p, v); }
inline AccVec acc_set1(float x) { return _mm256_set1_ps(x); }
inline AccVec acc_add(AccVec a, AccVec b) { return _mm256_add_ps(a, b); }
inline AccVec acc_mul(AccVec a, AccVec b) { return _mm256_mul_ps(a, b); }
}  // namespace

#include "layers/attention_simd.inc"

namespace ds4 {
void attend_heads_avx2(const AttentionInputs& in, const AttentionRows& rows, float* out, float* weights,
                       int64_t stride, int64_t h0, int64_t h1) {
    attend_heads_impl(in, rows, out, weights, stride, h0, h1);
}
void lanes_row_dots_avx2(const float* const* qs, int64_t nq, const float* row, int64_t n, float* out) {
    row_dots_any(qs, nq, row, n, out, 1);
}
void attend_queries_avx2(const float* const* q, float* const* out, int64_t nq, const float* sinks, int64_t head_dim,
                         const QueryBlockRows& rows, float* scratch, int64_t h0, int64_t h1) {
    attend_queries_impl(q, out, nq, sinks, head_dim, rows, scratch, h0, h1);
}
}  // namespace ds4
