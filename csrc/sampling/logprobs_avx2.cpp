// The logprob passes for AVX2: 8 logits per compare, 4 doubles per exponential (the AVX-512
// build's arithmetic, lane for lane: the same reduction, polynomial and fused steps; the table is
// read by a gather), within the same bound (logprobs.h).
#include <immintrin.h>

#include "sampling/logprobs_kernels.h"

namespace ds4 {
namespace logprob_kernels {

namespace {

struct Exp4 {
    const __m256d clamp = _mm256_set1_pd(kClamp), inv = _mm256_set1_pd(kInvLn2_16);
    const __m256d shifter = _mm256_set1_pd(kShifter);
    const __m256d ln2_hi = _mm256_set1_pd(kLn2Hi16), ln2_lo = _mm256_set1_pd(kLn2Lo16);
    const __m256d c1 = _mm256_set1_pd(kC[0]), c2 = _mm256_set1_pd(kC[1]), c3 = _mm256_set1_pd(kC[2]);
    const __m256d c4 = _mm256_set1_pd(kC[3]), c5 = _mm256_set1_pd(kC[4]), c6 = _mm256_set1_pd(kC[5]);
    const __m256d c7 = _mm256_set1_pd(kC[6]);
    const __m256i low4 = _mm256_set1_epi64x(15);

    // exp(max(d, kClamp)) (a NaN d gives kClamp: max returns its second operand); +inf lanes give
    // garbage that callers mask. Without Clamp: d >= kClamp given.
    template <bool Clamp = true>
    __m256d eval(__m256d d) const {
        if (Clamp) d = _mm256_max_pd(d, clamp);
        const __m256d kshift = _mm256_fmadd_pd(d, inv, shifter);
        const __m256d k = _mm256_sub_pd(kshift, shifter);
        __m256d r = _mm256_fnmadd_pd(k, ln2_hi, d);
        r = _mm256_fnmadd_pd(k, ln2_lo, r);
        __m256d h = _mm256_fmadd_pd(c7, r, c6);
        h = _mm256_fmadd_pd(h, r, c5);
        h = _mm256_fmadd_pd(h, r, c4);
        h = _mm256_fmadd_pd(h, r, c3);
        h = _mm256_fmadd_pd(h, r, c2);
        h = _mm256_fmadd_pd(h, r, c1);
        const __m256i kb = _mm256_castpd_si256(kshift);
        const __m256i entry = _mm256_i64gather_epi64((const long long*)kTable, _mm256_and_si256(kb, low4), 8);
        const __m256d t = _mm256_castsi256_pd(_mm256_add_epi64(entry, _mm256_slli_epi64(kb, 48)));
        return _mm256_fmadd_pd(_mm256_mul_pd(t, r), h, t);
    }
};

// 8 bits, one per float lane: finite (NaN and +-inf fail v - v == 0).
inline __m256 finite_mask(__m256 v) { return _mm256_cmp_ps(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_EQ_OQ); }

// A float lane mask widened to the double lanes of its low / high half.
inline __m256d lo_mask(__m256 m) { return _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm_castps_si128(_mm256_castps256_ps128(m)))); }
inline __m256d hi_mask(__m256 m) { return _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm_castps_si128(_mm256_extractf128_ps(m, 1)))); }

inline void two_sum(__m256d& s, __m256d& c, __m256d x) {
    const __m256d t = _mm256_add_pd(s, x);
    const __m256d z = _mm256_sub_pd(t, s);
    c = _mm256_add_pd(c, _mm256_add_pd(_mm256_sub_pd(s, _mm256_sub_pd(t, z)), _mm256_sub_pd(x, z)));
    s = t;
}

// The weights of 8 logits as two vectors (lanes outside `keep` weigh 0 unless Plain).
template <bool Plain>
inline void weights8(const Exp4& e, __m256 v, __m256d m, __m256 keep, __m256d& w0, __m256d& w1) {
    w0 = e.eval<!Plain>(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), m));
    w1 = e.eval<!Plain>(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), m));
    if (!Plain) {
        w0 = _mm256_and_pd(w0, lo_mask(keep));
        w1 = _mm256_and_pd(w1, hi_mask(keep));
    }
}

__attribute__((noinline)) void collect_hits(Collect& col, const float* a, int64_t i, const unsigned* hits, int count,
                                            __m256& at_least) {
    for (int j = 0; j < count; ++j)
        for (unsigned h = hits[j]; h; h &= h - 1) collect_one(col, a, i + 8 * j + __builtin_ctz(h));
    if (col.n_tied >= col.limit) at_least = _mm256_set1_ps(col.above_floor);
}

inline double combine_vector_lanes(__m256d s, __m256d c) {
    alignas(32) double sl[4], cl[4];
    _mm256_store_pd(sl, s);
    _mm256_store_pd(cl, c);
    return combine_lanes(sl, cl, 4);
}

// 32 logits per step: eight vectors of weights added as a tree (three roundings per weight), then
// into per-lane compensated sums; the tail (< 32) goes a vector of 8 at a time with a masked load.
template <bool Plain>
double exp_sum(const float* a, int64_t n, float m, Collect* col) {
    const Exp4 e;
    const __m256d md = _mm256_set1_pd((double)m);
    Collect none{__builtin_inff(), __builtin_inff(), 0, nullptr, nullptr, nullptr, 0};
    Collect& cl = col ? *col : none;
    __m256 at_least = _mm256_set1_ps(cl.n_tied >= cl.limit ? cl.above_floor : cl.floor);
    const __m256 all = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    __m256d s = _mm256_setzero_pd(), c = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 v[4], keep[4];
        unsigned hits[4];
        for (int j = 0; j < 4; ++j) {
            v[j] = _mm256_loadu_ps(a + i + 8 * j);
            keep[j] = Plain ? all : finite_mask(v[j]);
            hits[j] = (unsigned)_mm256_movemask_ps(_mm256_and_ps(keep[j], _mm256_cmp_ps(v[j], at_least, _CMP_GE_OQ)));
        }
        if (__builtin_expect((hits[0] | hits[1] | hits[2] | hits[3]) != 0, 0)) collect_hits(cl, a, i, hits, 4, at_least);
        __m256d w[8];
        for (int j = 0; j < 4; ++j) weights8<Plain>(e, v[j], md, keep[j], w[2 * j], w[2 * j + 1]);
        const __m256d x = _mm256_add_pd(_mm256_add_pd(_mm256_add_pd(w[0], w[1]), _mm256_add_pd(w[2], w[3])),
                                        _mm256_add_pd(_mm256_add_pd(w[4], w[5]), _mm256_add_pd(w[6], w[7])));
        two_sum(s, c, x);
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (; i < n; i += 8) {
        const __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i < 8 ? n - i : 8)), lane);
        const __m256 v = _mm256_maskload_ps(a + i, in);   // 0 outside: finite, masked below
        const __m256 keep = _mm256_and_ps(_mm256_castsi256_ps(in), finite_mask(v));
        const unsigned hits = (unsigned)_mm256_movemask_ps(_mm256_and_ps(keep, _mm256_cmp_ps(v, at_least, _CMP_GE_OQ)));
        if (hits) collect_hits(cl, a, i, &hits, 1, at_least);
        __m256d w0, w1;
        weights8<false>(e, v, md, keep, w0, w1);
        two_sum(s, c, _mm256_add_pd(w0, w1));
    }
    return combine_vector_lanes(s, c);
}

inline float hmax(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

inline float hmin(__m256 v) {
    __m128 x = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_min_ps(x, _mm_movehl_ps(x, x));
    x = _mm_min_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

}  // namespace

Stats stats_avx2(const float* a, int64_t n, float* block_max) {
    const __m256 neg_inf = _mm256_set1_ps(-__builtin_inff()), pos_inf = _mm256_set1_ps(__builtin_inff());
    Stats st{-__builtin_inff(), __builtin_inff(), 0};
    __m256 lo = pos_inf;
    int64_t fin = 0;
    for (int64_t b = 0; b * kBlock < n; ++b) {
        const int64_t i0 = b * kBlock, end = i0 + kBlock < n ? i0 + kBlock : n;
        __m256 acc0 = neg_inf, acc1 = neg_inf;
        int64_t i = i0;
        for (; i + 16 <= end; i += 16) {
            const __m256 v0 = _mm256_loadu_ps(a + i), v1 = _mm256_loadu_ps(a + i + 8);
            const __m256 f0 = finite_mask(v0), f1 = finite_mask(v1);
            acc0 = _mm256_max_ps(acc0, _mm256_blendv_ps(neg_inf, v0, f0));
            acc1 = _mm256_max_ps(acc1, _mm256_blendv_ps(neg_inf, v1, f1));
            lo = _mm256_min_ps(lo, _mm256_blendv_ps(pos_inf, v0, f0));
            lo = _mm256_min_ps(lo, _mm256_blendv_ps(pos_inf, v1, f1));
            fin += __builtin_popcount(((unsigned)_mm256_movemask_ps(f1) << 8) | (unsigned)_mm256_movemask_ps(f0));
        }
        float hi = hmax(_mm256_max_ps(acc0, acc1));
        finish_block(a, i, end, hi, fin, st, block_max[b]);
    }
    const float vmin = hmin(lo);
    if (vmin < st.min) st.min = vmin;
    st.n_finite = fin;
    return st;
}

double exp_sum_avx2(const float* a, int64_t n, float m, bool plain, Collect* col) {
    return plain ? exp_sum<true>(a, n, m, col) : exp_sum<false>(a, n, m, col);
}

void exp_avx2(const double* d, double* out, int64_t n) {
    const Exp4 e;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) _mm256_storeu_pd(out + i, e.eval(_mm256_loadu_pd(d + i)));
    if (i < n) {
        alignas(32) double buf[4] = {0.0, 0.0, 0.0, 0.0};
        for (int64_t j = i; j < n; ++j) buf[j - i] = d[j];
        _mm256_store_pd(buf, e.eval(_mm256_load_pd(buf)));
        for (int64_t j = i; j < n; ++j) out[j] = buf[j - i];
    }
}

}  // namespace logprob_kernels
}  // namespace ds4
