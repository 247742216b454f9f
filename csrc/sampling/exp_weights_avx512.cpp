// exp_weights for AVX-512: 8 doubles per vector. Most vectors take the certified cheaper
// evaluation (exp_certified_avx512.h), which returns the same floats wherever it is sure; the rest
// take the exact one, whose operations and their order are exp_nonpositive's (exp_weights.inc),
// the table lookup as two-register permutes, so the bits are the same.
#include <immintrin.h>

#include "sampling/exp_certified_avx512.h"
#include "sampling/exp_weights.h"
#include "sampling/exp_weights.inc"
#include "sampling/scan.h"

namespace ds4 {

namespace {

// The exact evaluation of 8 arguments (out of line: rarely needed, and its constants stay out of
// the certified loop).
struct ExactExp8 {
    const __m512d lo_tab0 = _mm512_load_pd(kExp2Table), lo_tab1 = _mm512_load_pd(kExp2Table + 8);
    const __m512d hi_tab0 = _mm512_load_pd(kExp2Table + 16), hi_tab1 = _mm512_load_pd(kExp2Table + 24);
    const __m512d clamp = _mm512_set1_pd(-120.0), inv = _mm512_set1_pd(46.166241308446828384);
    const __m512d shifter = _mm512_set1_pd(6755399441055744.0);
    const __m512d ln_hi = _mm512_set1_pd(0.693147180369123816490 / 32.0);
    const __m512d ln_lo = _mm512_set1_pd(1.90821492927058770002e-10 / 32.0);
    const __m512d c6 = _mm512_set1_pd(1.0 / 720.0), c5 = _mm512_set1_pd(1.0 / 120.0), c4 = _mm512_set1_pd(1.0 / 24.0);
    const __m512d c3 = _mm512_set1_pd(1.0 / 6.0), c2 = _mm512_set1_pd(0.5), one = _mm512_set1_pd(1.0);
    const __m512i bias = _mm512_set1_epi64((long long)(0x4338000000000000ull - 1023u * 32u));
    const __m512i five_bits = _mm512_set1_epi64(31), bit4 = _mm512_set1_epi64(16);
    __m256 operator()(__m256 xf) const {
        __m512d v = _mm512_cvtps_pd(xf);
        v = _mm512_max_pd(clamp, v);   // x < -120 (or -inf) ? -120 : x (x is never NaN)
        const __m512d kshift = _mm512_add_pd(_mm512_mul_pd(v, inv), shifter);
        const __m512d k = _mm512_sub_pd(kshift, shifter);
        // k * ln_hi is exact (|k| < 2^13, ln_hi has 21 significant bits), so the fused form rounds
        // x - k * ln_hi once, as the separate subtraction does: the same bits
        const __m512d r = _mm512_sub_pd(_mm512_fnmadd_pd(k, ln_hi, v), _mm512_mul_pd(k, ln_lo));
        __m512d p = c6;
        p = _mm512_add_pd(_mm512_mul_pd(p, r), c5);
        p = _mm512_add_pd(_mm512_mul_pd(p, r), c4);
        p = _mm512_add_pd(_mm512_mul_pd(p, r), c3);
        p = _mm512_add_pd(_mm512_mul_pd(p, r), c2);
        p = _mm512_add_pd(_mm512_mul_pd(p, r), one);
        p = _mm512_add_pd(_mm512_mul_pd(p, r), one);
        const __m512i u = _mm512_sub_epi64(_mm512_castpd_si512(kshift), bias);
        const __m512i j = _mm512_and_si512(u, five_bits);
        const __m512d t_lo = _mm512_permutex2var_pd(lo_tab0, j, lo_tab1);   // entries j & 15 of 0..15
        const __m512d t_hi = _mm512_permutex2var_pd(hi_tab0, j, hi_tab1);   // ... of 16..31
        const __mmask8 upper = _mm512_test_epi64_mask(j, bit4);
        const __m512d t = _mm512_mask_blend_pd(upper, t_lo, t_hi);
        const __m512d scale = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_srli_epi64(u, 5), 52));
        return _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_mul_pd(p, t), scale));
    }
};

__attribute__((noinline)) __m256 exact8(__m256 x) { return ExactExp8{}(x); }

}  // namespace

void exp_weights_avx512(const float* x, float* w, int64_t n) {
    const certified_exp::Table tab;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 xf = _mm256_loadu_ps(x + i);
        __mmask8 uncertain;
        __m256 y = certified_exp::eval8(xf, tab, uncertain);
        if (__builtin_expect(uncertain != 0, 0)) y = exact8(xf);
        _mm256_storeu_ps(w + i, y);
    }
    exp_weights_generic(x + i, w + i, n - i);
}

// exp_weights_of_logits: 8 logits per step, their arguments by shifted_args' float operations
// (subtract, divide unless t is 1, -inf where the logit is not finite unless none is), then the
// certified evaluation above with the exact fallback on the same arguments: exp_weights' bits
// without writing and re-reading an argument array (docs/sampling.md, "Ninth round").
template <bool kDivide, bool kAllFinite>
static void exp_weights_of_logits_loop(const float* a, int64_t n, float m, float t, float* w) {
    const certified_exp::Table tab;
    const __m256 mv = _mm256_set1_ps(m), tv = _mm256_set1_ps(t), neg_inf = _mm256_set1_ps(-__builtin_inff());
    for (int64_t i = 0; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(a + i);
        __m256 xf = _mm256_sub_ps(v, mv);
        if (kDivide) xf = _mm256_div_ps(xf, tv);
        if (!kAllFinite)
            xf = _mm256_mask_blend_ps(_mm256_cmp_ps_mask(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_EQ_OQ), neg_inf, xf);
        __mmask8 uncertain;
        __m256 y = certified_exp::eval8(xf, tab, uncertain);
        if (__builtin_expect(uncertain != 0, 0)) y = exact8(xf);
        _mm256_storeu_ps(w + i, y);
    }
}

void exp_weights_of_logits_avx512(const float* a, int64_t n, float m, float t, bool all_finite, float* w) {
    const int64_t body = n & ~(int64_t)7;
    if (t != 1.0f) {
        all_finite ? exp_weights_of_logits_loop<true, true>(a, body, m, t, w)
                   : exp_weights_of_logits_loop<true, false>(a, body, m, t, w);
    } else {
        all_finite ? exp_weights_of_logits_loop<false, true>(a, body, m, t, w)
                   : exp_weights_of_logits_loop<false, false>(a, body, m, t, w);
    }
    if (body == n) return;
    alignas(32) float xb[8];
    shifted_args(a + body, n - body, m, t, xb);
    exp_weights_generic(xb, w + body, n - body);
}

}  // namespace ds4
