// The logprob passes for AVX-512: 16 logits per compare, 8 doubles per exponential, fused
// multiply-adds (so other bits than the portable build, within the same bound: logprobs.h).
#include <immintrin.h>

#include "sampling/logprobs_kernels.h"

namespace ds4 {
namespace logprob_kernels {

namespace {

struct Exp8 {
    const __m512d clamp = _mm512_set1_pd(kClamp), inv = _mm512_set1_pd(kInvLn2_16);
    const __m512d shifter = _mm512_set1_pd(kShifter);
    const __m512d ln2_hi = _mm512_set1_pd(kLn2Hi16), ln2_lo = _mm512_set1_pd(kLn2Lo16);
    const __m512d c1 = _mm512_set1_pd(kC[0]), c2 = _mm512_set1_pd(kC[1]), c3 = _mm512_set1_pd(kC[2]);
    const __m512d c4 = _mm512_set1_pd(kC[3]), c5 = _mm512_set1_pd(kC[4]), c6 = _mm512_set1_pd(kC[5]);
    const __m512d c7 = _mm512_set1_pd(kC[6]);
    const __m512i t0 = _mm512_load_si512(kTable), t1 = _mm512_load_si512(kTable + 8);

    // exp(max(d, kClamp)); a NaN d counts as kClamp (max returns its second operand), +inf gives
    // garbage: callers mask lanes that are not finite logits. Without Clamp: d >= kClamp given.
    template <bool Clamp = true>
    __m512d eval(__m512d d) const {
        if (Clamp) d = _mm512_max_pd(d, clamp);
        const __m512d kshift = _mm512_fmadd_pd(d, inv, shifter);
        const __m512d k = _mm512_sub_pd(kshift, shifter);
        __m512d r = _mm512_fnmadd_pd(k, ln2_hi, d);
        r = _mm512_fnmadd_pd(k, ln2_lo, r);
        __m512d h = _mm512_fmadd_pd(c7, r, c6);
        h = _mm512_fmadd_pd(h, r, c5);
        h = _mm512_fmadd_pd(h, r, c4);
        h = _mm512_fmadd_pd(h, r, c3);
        h = _mm512_fmadd_pd(h, r, c2);
        h = _mm512_fmadd_pd(h, r, c1);
        // kshift's bits are 0x4338000000000000 + k: << 48 leaves (k << 48) mod 2^64, and the
        // permutes read the index's low 4 bits, j
        const __m512i kb = _mm512_castpd_si512(kshift);
        const __m512i scale = _mm512_slli_epi64(kb, 48);
        const __m512d t = _mm512_castsi512_pd(_mm512_add_epi64(_mm512_permutex2var_epi64(t0, kb, t1), scale));
        return _mm512_fmadd_pd(_mm512_mul_pd(t, r), h, t);
    }
};

// Lanes whose float is not finite (NaN, +-inf).
inline __mmask16 non_finite(__m512 v) { return _mm512_fpclass_ps_mask(v, 0x99); }

inline void two_sum(__m512d& s, __m512d& c, __m512d x) {
    const __m512d t = _mm512_add_pd(s, x);
    const __m512d z = _mm512_sub_pd(t, s);
    c = _mm512_add_pd(c, _mm512_add_pd(_mm512_sub_pd(s, _mm512_sub_pd(t, z)), _mm512_sub_pd(x, z)));
    s = t;
}

inline __m512d lo_half(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
inline __m512d hi_half(__m512 v) { return _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)); }

// The weights of 16 logits as two vectors (lanes outside `keep` weigh 0 unless Plain).
template <bool Plain>
inline void weights16(const Exp8& e, __m512 v, __m512d m, __mmask16 keep, __m512d& w0, __m512d& w1) {
    w0 = e.eval<!Plain>(_mm512_sub_pd(lo_half(v), m));
    w1 = e.eval<!Plain>(_mm512_sub_pd(hi_half(v), m));
    if (!Plain) {
        w0 = _mm512_maskz_mov_pd((__mmask8)keep, w0);
        w1 = _mm512_maskz_mov_pd((__mmask8)(keep >> 8), w1);
    }
}

// The collection of the (rare) vectors with a logit at or above the running floor: out of line.
__attribute__((noinline)) void collect_hits(Collect& col, const float* a, int64_t i, const __mmask16* hits, int count,
                                            __m512& at_least) {
    for (int j = 0; j < count; ++j)
        for (unsigned h = hits[j]; h; h &= h - 1) collect_one(col, a, i + 16 * j + __builtin_ctz(h));
    if (col.n_tied >= col.limit) at_least = _mm512_set1_ps(col.above_floor);
}

inline double combine_vector_lanes(__m512d s, __m512d c) {
    alignas(64) double sl[8], cl[8];
    _mm512_store_pd(sl, s);
    _mm512_store_pd(cl, c);
    return combine_lanes(sl, cl, 8);
}

// 64 logits per step: eight vectors of weights added as a tree (three roundings per weight), then
// into per-lane compensated sums; the lanes are combined with the same error-free step. Plain: no
// logit needs a mask or the clamp.
template <bool Plain>
double exp_sum(const float* a, int64_t n, float m, Collect* col) {
    const Exp8 e;
    const __m512d md = _mm512_set1_pd((double)m);
    Collect none{__builtin_inff(), __builtin_inff(), 0, nullptr, nullptr, nullptr, 0};
    Collect& cl = col ? *col : none;
    __m512 at_least = _mm512_set1_ps(cl.n_tied >= cl.limit ? cl.above_floor : cl.floor);
    __m512d s = _mm512_setzero_pd(), c = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512 v[4];
        __mmask16 keep[4], hits[4];
        for (int j = 0; j < 4; ++j) {
            v[j] = _mm512_loadu_ps(a + i + 16 * j);
            keep[j] = Plain ? (__mmask16)0xFFFF : (__mmask16)~non_finite(v[j]);
            hits[j] = _mm512_mask_cmp_ps_mask(keep[j], v[j], at_least, _CMP_GE_OQ);
        }
        if (__builtin_expect((hits[0] | hits[1] | hits[2] | hits[3]) != 0, 0)) collect_hits(cl, a, i, hits, 4, at_least);
        __m512d w[8];
        for (int j = 0; j < 4; ++j) weights16<Plain>(e, v[j], md, keep[j], w[2 * j], w[2 * j + 1]);
        const __m512d x = _mm512_add_pd(_mm512_add_pd(_mm512_add_pd(w[0], w[1]), _mm512_add_pd(w[2], w[3])),
                                        _mm512_add_pd(_mm512_add_pd(w[4], w[5]), _mm512_add_pd(w[6], w[7])));
        two_sum(s, c, x);
    }
    for (; i < n; i += 16) {
        const __mmask16 in = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(in, a + i);
        const __mmask16 keep = (__mmask16)(in & ~non_finite(v));
        const __mmask16 hits = _mm512_mask_cmp_ps_mask(keep, v, at_least, _CMP_GE_OQ);
        if (hits) collect_hits(cl, a, i, &hits, 1, at_least);
        __m512d w0, w1;
        weights16<false>(e, v, md, keep, w0, w1);
        two_sum(s, c, _mm512_add_pd(w0, w1));
    }
    return combine_vector_lanes(s, c);
}

}  // namespace

Stats stats_avx512(const float* a, int64_t n, float* block_max) {
    const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff()), pos_inf = _mm512_set1_ps(__builtin_inff());
    Stats st{-__builtin_inff(), __builtin_inff(), 0};
    __m512 lo = pos_inf;
    int64_t bad = 0;
    for (int64_t b = 0; b * kBlock < n; ++b) {
        const int64_t i0 = b * kBlock, end = i0 + kBlock < n ? i0 + kBlock : n;
        __m512 acc0 = neg_inf, acc1 = neg_inf;   // two chains: the max's latency
        int64_t i = i0;
        for (; i + 32 <= end; i += 32) {
            const __m512 v0 = _mm512_loadu_ps(a + i), v1 = _mm512_loadu_ps(a + i + 16);
            const __mmask16 f0 = non_finite(v0), f1 = non_finite(v1);
            acc0 = _mm512_mask_max_ps(acc0, (__mmask16)~f0, acc0, v0);
            acc1 = _mm512_mask_max_ps(acc1, (__mmask16)~f1, acc1, v1);
            lo = _mm512_mask_min_ps(lo, (__mmask16)~f0, lo, v0);
            lo = _mm512_mask_min_ps(lo, (__mmask16)~f1, lo, v1);
            bad += __builtin_popcount(((unsigned)f1 << 16) | f0);
        }
        for (; i < end; i += 16) {
            const __mmask16 in = end - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (end - i)) - 1);
            const __m512 v = _mm512_maskz_loadu_ps(in, a + i);
            const __mmask16 f = in & non_finite(v);
            acc0 = _mm512_mask_max_ps(acc0, (__mmask16)(in & ~f), acc0, v);
            lo = _mm512_mask_min_ps(lo, (__mmask16)(in & ~f), lo, v);
            bad += __builtin_popcount((unsigned)f);
        }
        const float hi = _mm512_reduce_max_ps(_mm512_max_ps(acc0, acc1));
        block_max[b] = hi;
        if (hi > st.max) st.max = hi;
    }
    st.min = _mm512_reduce_min_ps(lo);
    st.n_finite = n - bad;
    return st;
}

double exp_sum_avx512(const float* a, int64_t n, float m, bool plain, Collect* col) {
    return plain ? exp_sum<true>(a, n, m, col) : exp_sum<false>(a, n, m, col);
}

void exp_avx512(const double* d, double* out, int64_t n) {
    const Exp8 e;
    int64_t i = 0;
    for (; i < n; i += 8) {
        const __mmask8 in = n - i >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << (n - i)) - 1);
        _mm512_mask_storeu_pd(out + i, in, e.eval(_mm512_maskz_loadu_pd(in, d + i)));
    }
}

}  // namespace logprob_kernels
}  // namespace ds4
