// A cheaper evaluation of exp_weights' float weights that knows when it is right (AVX-512 builds
// only; docs/sampling.md, "A certified exponential" and "Seventh round"). exp_weights rounds a
// double evaluation of exp(x) once to float; that double is within ~2^-50 (relative) of exp(x), so
// its float is the correctly rounded one unless exp(x) lies that close to a float rounding
// midpoint. The evaluation here is within 2^-38.5 of exp(x) (a 16-entry table and a fitted degree-4
// polynomial, fused multiply-adds), and a lane whose double lies at least 2^15 double ulps
// (>= 2^-38 relative) from every float midpoint rounds to the float that exp(x), and so the exact
// evaluation, rounds to. Other lanes (3 in 10^5 arguments of [-87, 0]), and arguments in [-105, -87)
// where the float weight is subnormal, are left to the exact evaluation; arguments below -105 (and
// -inf) weigh exactly 0 in both. Checked against the exact evaluation over every float argument in
// [-105, 0] (scripts/check_exp_certified.cpp).
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace ds4 {
namespace certified_exp {

// 2^(j/16) as correctly rounded doubles (the exact table's even entries), minus j << 48: adding
// k << 48 for k = 16q + j then gives 2^(j/16) * 2^q with one integer add (see eval8).
constexpr int64_t entry(double v, int j) { return __builtin_bit_cast(int64_t, v) - ((int64_t)j << 48); }

alignas(64) constexpr int64_t kTable[16] = {
    entry(0x1.0000000000000p+0, 0),  entry(0x1.0b5586cf9890fp+0, 1),  entry(0x1.172b83c7d517bp+0, 2),
    entry(0x1.2387a6e756238p+0, 3),  entry(0x1.306fe0a31b715p+0, 4),  entry(0x1.3dea64c123422p+0, 5),
    entry(0x1.4bfdad5362a27p+0, 6),  entry(0x1.5ab07dd485429p+0, 7),  entry(0x1.6a09e667f3bcdp+0, 8),
    entry(0x1.7a11473eb0187p+0, 9),  entry(0x1.8ace5422aa0dbp+0, 10), entry(0x1.9c49182a3f090p+0, 11),
    entry(0x1.ae89f995ad3adp+0, 12), entry(0x1.c199bdd85529cp+0, 13), entry(0x1.d5818dcfba487p+0, 14),
    entry(0x1.ea4afa2a490dap+0, 15),
};

struct Table {
    __m512d lo = _mm512_castsi512_pd(_mm512_load_si512(kTable));
    __m512d hi = _mm512_castsi512_pd(_mm512_load_si512(kTable + 8));
};

// The lanes' rounding is decided only at least kWindow double ulps from every float rounding
// midpoint (a distance of 2^15 ulps is >= 2^-38 relative; the evaluation below errs by < 2^-38.5).
constexpr int kWindow = 15;

// The weights w of 8 arguments x in [-87, 0] as doubles (not yet rounded to float) and the lanes
// whose float rounding is certain (`away`: w at least kWindow ulps from every midpoint).
// exp(x) = 2^q 2^(j/16) exp(r), k = 16q + j = round(x 16/ln2) (the fused add of 1.5 * 2^52 rounds
// once), r = x - k ln2/16 in one fused step: ln2/16 as a double is within 2^-58 of ln2/16 and
// |k| < 2^11 here, so r is within 2^-47 (absolute) of the exact reduction, and |r| <= ln2/32
// (1 + 2^-40). exp(r) by a degree-4 polynomial fitted to exp's relative error on that interval
// (Remez, in long double; coefficients rounded to double): within 2^-38.55, plus the reduction's
// 2^-47, the table's 2^-53 and the fused steps' few 2^-53. The window then leaves a margin of
// 0.3 * 2^-38 for the exact evaluation's own ~2^-50 (docs/sampling.md, "Seventh round").
inline __m512d eval8_double(__m256 xf, const Table& tab, __mmask8& away) {
    const __m512d x = _mm512_cvtps_pd(xf);
    const __m512d shifter = _mm512_set1_pd(6755399441055744.0);   // 1.5 * 2^52
    const __m512d kshift = _mm512_fmadd_pd(x, _mm512_set1_pd(23.083120654223414192), shifter);   // 16 / ln2
    const __m512d k = _mm512_sub_pd(kshift, shifter);
    const __m512d r = _mm512_fnmadd_pd(k, _mm512_set1_pd(0x1.62e42fefa39efp-5), x);   // ln2/16
    __m512d p = _mm512_set1_pd(0x1.5553a004a2f01p-5);
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0x1.5557e54b3889ap-3));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0x1.00000005bebf1p-1));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0x1.fffffffb13761p-1));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0x1.ffffffffffe6cp-1));
    // kshift's bits are 0x4338000000000000 + k (k in the low bits, two's complement); << 48 keeps
    // k << 48 = (q << 52) + (j << 48) modulo 2^64, and its low 4 bits index the table.
    const __m512i kb = _mm512_castpd_si512(kshift);
    const __m512d t = _mm512_permutex2var_pd(tab.lo, kb, tab.hi);
    const __m512d scale = _mm512_castsi512_pd(_mm512_add_epi64(_mm512_castpd_si512(t), _mm512_slli_epi64(kb, 48)));
    const __m512d w = _mm512_mul_pd(p, scale);
    // A float rounding midpoint has the double's low 29 mantissa bits equal to 2^28. Adding
    // 2^kWindow - 2^28 moves the window [2^28 - 2^kWindow, 2^28 + 2^kWindow) to [0, 2^(kWindow+1)):
    // the lanes whose bits kWindow+1..28 are then all zero (a carry out of bit 28 only touches
    // bits above) are uncertain.
    const __m512i near = _mm512_add_epi64(_mm512_castpd_si512(w), _mm512_set1_epi64((1 << kWindow) - (1 << 28)));
    away = _mm512_test_epi64_mask(near, _mm512_set1_epi64((1 << 29) - (2 << kWindow)));
    return w;
}

// The float weights of 8 arguments, and (uncertain) the lanes that must take the exact
// evaluation. Certain: an argument in [-87, -0] (as signed integers, the float bits of those are
// at most -87's; +0 and everything else fail) away from a midpoint. Most vectors are certain in
// every lane (one test); the others sort their lanes: arguments below -105 (and -inf) weigh
// exactly 0 in both evaluations, the rest of the uncertain ones (a subnormal weight, near a
// midpoint, +0, positive or NaN) go to the exact evaluation.
inline __m256 eval8(__m256 xf, const Table& tab, __mmask8& uncertain) {
    __mmask8 away;
    const __m512d w = eval8_double(xf, tab, away);
    const __mmask8 normal = _mm256_cmp_epi32_mask(_mm256_castps_si256(xf), _mm256_set1_epi32((int32_t)0xC2AE0000u),
                                                  _MM_CMPINT_LE);   // 0xC2AE0000: -87.0f
    const __mmask8 certain = away & normal;
    if (__builtin_expect(certain == 0xFF, 1)) {
        uncertain = 0;
        return _mm512_cvtpd_ps(w);
    }
    const __m512d x = _mm512_cvtps_pd(xf);
    const __mmask8 zero = _mm512_cmp_pd_mask(x, _mm512_set1_pd(-105.0), _CMP_LT_OQ);
    uncertain = (__mmask8)~(certain | zero);
    return _mm512_cvtpd_ps(_mm512_maskz_mov_pd(certain, w));
}

}  // namespace certified_exp
}  // namespace ds4
