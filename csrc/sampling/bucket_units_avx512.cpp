// bucket_units.h with AVX-512: 16 terms per step, the last partial step masked.
#include <immintrin.h>

#include "sampling/bucket_units.h"

namespace ds4 {

namespace {

// The 16 lanes' int32 units added to two int64 accumulators (a lane's sum over many steps could
// pass 2^31: terms reach 2^22 units).
inline void add_units(__m512i& acc_lo, __m512i& acc_hi, __m512i u) {
    acc_lo = _mm512_add_epi64(acc_lo, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(u)));
    acc_hi = _mm512_add_epi64(acc_hi, _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(u, 1)));
}

inline __mmask16 lanes(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }

}  // namespace

bool approx_units_avx512(const float* wa, const int32_t* ids, int64_t m, float inv_u, float rel, int64_t& units) {
    const __m512 up = _mm512_set1_ps(1.0f + 2.0f * rel), down = _mm512_set1_ps(1.0f - 2.0f * rel);
    const __m512 iu = _mm512_set1_ps(inv_u), shifter = _mm512_set1_ps(0x1.8p23f), limit = _mm512_set1_ps(0x1p21f);
    __m512i acc_lo = _mm512_setzero_si512(), acc_hi = acc_lo;
    __mmask16 bad = 0;
    for (int64_t j = 0; j < m; j += 16) {
        const __mmask16 in = lanes(m - j);
        // sixteen scalar loads (ids[m..m + 16) are valid indices too: bucket_units.h): a gather
        // instruction waited on memory as one unit, measured slower
        const int32_t* p = ids + j;
        const __m512 g = _mm512_setr_ps(wa[p[0]], wa[p[1]], wa[p[2]], wa[p[3]], wa[p[4]], wa[p[5]], wa[p[6]], wa[p[7]],
                                        wa[p[8]], wa[p[9]], wa[p[10]], wa[p[11]], wa[p[12]], wa[p[13]], wa[p[14]],
                                        wa[p[15]]);
        const __m512 y0 = _mm512_mul_ps(_mm512_maskz_mov_ps(in, g), iu);
        // y <= 2^21, else never certain (NaN too); such lanes count 0 units
        const __mmask16 small = _mm512_cmp_ps_mask(y0, limit, _CMP_LE_OQ);
        const __m512 y = _mm512_maskz_mov_ps(small, y0);
        // the bounds rounded to integers in one step each: the exact y (1 -+ 2 rel) rounds to the
        // nearest integer, which brackets the exact weight's rounding as the plain loop's two
        // roundings do (bucket_units.h)
        const __m512 h = _mm512_fmadd_ps(y, up, shifter), l = _mm512_fmadd_ps(y, down, shifter);
        bad |= (__mmask16)(in & (_mm512_cmp_ps_mask(h, l, _CMP_NEQ_UQ) | (__mmask16)~small));
        add_units(acc_lo, acc_hi, _mm512_maskz_cvttps_epi32(in, _mm512_sub_ps(h, shifter)));
    }
    units = _mm512_reduce_add_epi64(_mm512_add_epi64(acc_lo, acc_hi));
    return !bad;
}

bool exact_units_avx512(const float* w, int64_t m, float inv_u, int64_t& units) {
    const __m512 iu = _mm512_set1_ps(inv_u), shifter = _mm512_set1_ps(0x1.8p23f), limit = _mm512_set1_ps(0x1p22f);
    const __m512 half = _mm512_set1_ps(0.5f), neg_half = _mm512_set1_ps(-0.5f);
    __m512i acc_lo = _mm512_setzero_si512(), acc_hi = acc_lo;
    __mmask16 bad = 0;
    for (int64_t j = 0; j < m; j += 16) {
        const __mmask16 in = lanes(m - j);
        const __m512 y0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, w + j), iu);
        const __mmask16 small = _mm512_cmp_ps_mask(y0, limit, _CMP_LE_OQ);
        const __m512 y = _mm512_maskz_mov_ps(small, y0);
        // the plain loop's q = (y + 1.5 * 2^23) - 1.5 * 2^23 (round to nearest, exact below 2^22)
        // and its exact remainder y - q: the same two roundings, so the same units on every build
        const __m512 q = _mm512_sub_ps(_mm512_add_ps(y, shifter), shifter);
        const __m512 off = _mm512_sub_ps(y, q);
        const __mmask16 tie = _mm512_cmp_ps_mask(off, half, _CMP_EQ_OQ) | _mm512_cmp_ps_mask(off, neg_half, _CMP_EQ_OQ);
        bad |= (__mmask16)(in & (tie | (__mmask16)~small));
        add_units(acc_lo, acc_hi, _mm512_maskz_cvttps_epi32(in, q));
    }
    units = _mm512_reduce_add_epi64(_mm512_add_epi64(acc_lo, acc_hi));
    return !bad;
}

}  // namespace ds4
