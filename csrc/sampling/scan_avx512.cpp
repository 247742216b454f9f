// scan.h for AVX-512: a compare mask per 16 entries; ids leave through a register compress.
#include <immintrin.h>

#include "sampling/scan.h"

namespace ds4 {

int64_t collect_finite_at_least_avx512(const float* a, int64_t n, float floor, int32_t* out, float* vals) {
    const __m512 f = _mm512_set1_ps(floor), zero = _mm512_setzero_ps();
    __m512i ids = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    int64_t k = 0, i = 0;
    // v >= floor (false for NaN), and v - v == 0 (false for +-inf)
    auto pass = [&](__m512 v) {
        return (__mmask16)(_mm512_cmp_ps_mask(v, f, _CMP_GE_OQ) & _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), zero, _CMP_EQ_OQ));
    };
    // Four vectors per test: where a few percent of the entries pass (a top-p prefix), a branch per
    // vector is taken about half the time and mispredicts; per 64 entries it is nearly always taken
    // there and nearly never where almost nothing passes. The stores need no branch: out and vals
    // hold n + 16 entries, and each store ends within 16 of the entries read so far.
    for (; i + 64 <= n; i += 64) {
        const __m512 v0 = _mm512_loadu_ps(a + i), v1 = _mm512_loadu_ps(a + i + 16);
        const __m512 v2 = _mm512_loadu_ps(a + i + 32), v3 = _mm512_loadu_ps(a + i + 48);
        const __mmask16 m0 = pass(v0), m1 = pass(v1), m2 = pass(v2), m3 = pass(v3);
        if (((unsigned)m0 | m1 | m2 | m3) == 0) {
            ids = _mm512_add_epi32(ids, _mm512_set1_epi32(64));
            continue;
        }
        const __m512 vs[4] = {v0, v1, v2, v3};
        const __mmask16 ms[4] = {m0, m1, m2, m3};
        for (int j = 0; j < 4; ++j) {
            _mm512_storeu_si512((void*)(out + k), _mm512_maskz_compress_epi32(ms[j], ids));
            if (vals) _mm512_storeu_ps(vals + k, _mm512_maskz_compress_ps(ms[j], vs[j]));
            k += __builtin_popcount((unsigned)ms[j]);
            ids = _mm512_add_epi32(ids, step);
        }
    }
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(a + i);
        const __mmask16 m = pass(v);
        if (m) {
            _mm512_storeu_si512((void*)(out + k), _mm512_maskz_compress_epi32(m, ids));
            if (vals) _mm512_storeu_ps(vals + k, _mm512_maskz_compress_ps(m, v));
            k += __builtin_popcount((unsigned)m);
        }
        ids = _mm512_add_epi32(ids, step);
    }
    return collect_finite_at_least_from(a, i, n, floor, out, vals, k);
}

int64_t collect_above_and_tied_avx512(const float* a, int64_t n, float v, int32_t* above, float* vals,
                                      int64_t limit, int32_t* tied, int64_t* n_tied) {
    const __m512 f = _mm512_set1_ps(v), zero = _mm512_setzero_ps();
    __m512i ids = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    int64_t k = 0, t = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(a + i);
        // x > v (false for NaN), and x - x == 0 (false for +-inf)
        const __mmask16 gt = _mm512_cmp_ps_mask(x, f, _CMP_GT_OQ) & _mm512_cmp_ps_mask(_mm512_sub_ps(x, x), zero, _CMP_EQ_OQ);
        const __mmask16 eq = _mm512_cmp_ps_mask(x, f, _CMP_EQ_OQ);
        if (gt) {
            _mm512_storeu_si512((void*)(above + k), _mm512_maskz_compress_epi32(gt, ids));
            _mm512_storeu_ps(vals + k, _mm512_maskz_compress_ps(gt, x));
            k += __builtin_popcount((unsigned)gt);
        }
        if (eq && t < limit) {
            _mm512_storeu_si512((void*)(tied + t), _mm512_maskz_compress_epi32(eq, ids));
            t += __builtin_popcount((unsigned)eq);
        }
        ids = _mm512_add_epi32(ids, step);
    }
    return collect_above_and_tied_from(a, i, n, v, above, vals, limit, tied, n_tied, k, t);
}

float finite_max_avx512(const float* a, int64_t n, int64_t* n_finite, float* min_out) {
    const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff()), pos_inf = _mm512_set1_ps(__builtin_inff());
    const __m512 zero = _mm512_setzero_ps();
    __m512 acc0 = neg_inf, acc1 = neg_inf;   // two chains: the max latency, not one add per cycle
    __m512 lo0 = pos_inf, lo1 = pos_inf;
    const bool want_min = min_out != nullptr;
    int64_t c = 0, i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 v0 = _mm512_loadu_ps(a + i), v1 = _mm512_loadu_ps(a + i + 16);
        const __mmask16 f0 = _mm512_cmp_ps_mask(_mm512_sub_ps(v0, v0), zero, _CMP_EQ_OQ);
        const __mmask16 f1 = _mm512_cmp_ps_mask(_mm512_sub_ps(v1, v1), zero, _CMP_EQ_OQ);
        acc0 = _mm512_mask_max_ps(acc0, f0, acc0, v0);
        acc1 = _mm512_mask_max_ps(acc1, f1, acc1, v1);
        if (want_min) {
            lo0 = _mm512_mask_min_ps(lo0, f0, lo0, v0);
            lo1 = _mm512_mask_min_ps(lo1, f1, lo1, v1);
        }
        c += __builtin_popcount(((unsigned)f1 << 16) | f0);
    }
    float r = _mm512_reduce_max_ps(_mm512_max_ps(acc0, acc1));
    float lo = _mm512_reduce_min_ps(_mm512_min_ps(lo0, lo1));
    for (; i < n; ++i) {
        const bool fin = a[i] - a[i] == 0.0f;
        c += fin;
        if (fin && a[i] > r) r = a[i];
        if (fin && a[i] < lo) lo = a[i];
    }
    if (n_finite) *n_finite = c;
    if (min_out) *min_out = lo;
    return r;
}

int64_t shifted_args_avx512(const float* a, int64_t n, float m, float t, float* x) {
    const __m512 mv = _mm512_set1_ps(m), tv = _mm512_set1_ps(t), zero = _mm512_setzero_ps();
    const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
    const bool divide = t != 1.0f;
    int64_t c = 0;
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 in = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(in, a + i);
        const __mmask16 fin = in & _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), zero, _CMP_EQ_OQ);
        __m512 d = _mm512_sub_ps(v, mv);
        if (divide) d = _mm512_div_ps(d, tv);
        _mm512_mask_storeu_ps(x + i, in, _mm512_mask_blend_ps(fin, neg_inf, d));
        c += __builtin_popcount((unsigned)fin);
    }
    return c;
}

int64_t first_ratio_below_avx512(const float* w, int64_t n, float total, float bound) {
    const __m512 tv = _mm512_set1_ps(total), bv = _mm512_set1_ps(bound);
    int64_t i = 1;
    for (; i + 16 <= n; i += 16) {
        const __mmask16 m = _mm512_cmp_ps_mask(_mm512_div_ps(_mm512_loadu_ps(w + i), tv), bv, _CMP_LT_OQ);
        if (m) return i + __builtin_ctz((unsigned)m);
    }
    for (; i < n; ++i)
        if (w[i] / total < bound) return i;
    return n;
}

double mass_in_avx512(const float* w, int64_t n, float lo, float hi, int step) {
    const __m512 lv = _mm512_set1_ps(lo), hv = _mm512_set1_ps(hi);
    __m512 acc = _mm512_setzero_ps(), acc1 = acc, acc2 = acc, acc3 = acc;
    const int64_t stride = 16 * (int64_t)step;
    int64_t i = 0;
    // four chains of masked adds (one chain waits an add's latency per vector); an estimate, so
    // the order of the additions does not matter
    auto add = [&](__m512& a, int64_t j) {
        const __m512 v = _mm512_loadu_ps(w + j);
        const __mmask16 in = _mm512_cmp_ps_mask(v, lv, _CMP_GE_OQ) & _mm512_cmp_ps_mask(v, hv, _CMP_LT_OQ);
        a = _mm512_mask_add_ps(a, in, a, v);
    };
    for (; i + 3 * stride + 16 <= n; i += 4 * stride) {
        add(acc, i);
        add(acc1, i + stride);
        add(acc2, i + 2 * stride);
        add(acc3, i + 3 * stride);
    }
    acc = _mm512_add_ps(_mm512_add_ps(acc, acc1), _mm512_add_ps(acc2, acc3));
    for (; i + 16 <= n; i += stride) {
        const __m512 v = _mm512_loadu_ps(w + i);
        const __mmask16 in = _mm512_cmp_ps_mask(v, lv, _CMP_GE_OQ) & _mm512_cmp_ps_mask(v, hv, _CMP_LT_OQ);
        acc = _mm512_mask_add_ps(acc, in, acc, v);
    }
    double r = _mm512_reduce_add_ps(acc);
    for (; i < n; ++i) r += (w[i] >= lo && w[i] < hi) ? w[i] : 0.0f;
    return r * step;
}

}  // namespace ds4
