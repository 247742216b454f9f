#include "sampling/binade_sum.h"

#include <cmath>
#include <vector>

#include "sampling/binade_sum_impl.h"
#include "sampling/exp_weights.h"
#include "sampling/scan.h"

// Why a binade at a time is exact (docs/sampling.md). While the running sum s lies in the binade
// [2^e, 2^(e+1)) it is an integer number S of units u = 2^(e-23), and fl(s + w) for w >= 0 is the
// nearest multiple of u to s + w (ties to even) as long as that stays below 2^(e+1). So the step is
// S += round(w / u), an integer addition, whenever w / u is not exactly a half-integer (the tie
// would need S's parity) and S stays below 2^24. A block of 16 terms whose every y = w / u is
// certainly not a tie and whose rounded units keep S below 2^24 therefore adds its units at once;
// any other block runs the plain float loop. The same holds going down for the walk r = fl(r - w)
// while the result stays above 2^e (below it the grid is finer): R -= round(w / u) when R stays
// > 2^23. Terms below u/2 round to 0 units: they leave the sum unchanged, as in the plain loop.
//
// The weights need not be known exactly to round w / u: an approximation within a relative error
// of kApproxWeightRel (and 2^-125 absolute, below 2^-40 units) decides round(w / u) unless y lies
// within that error of a half-integer (the test rounds both ends of the error interval), which
// large y (from 2^18 units, a quarter unit of error) usually are. Such blocks evaluate their exact
// weights and round those. Early in a sum (s small against the terms) most blocks do; once s is
// large against the terms, almost none. Runs of exact zeros (arguments below -105, and -inf) are
// skipped. A term adds at most 2^22 units (2^18 approximated), so 128 of them fit an int32.
// The AVX-512 build does this (binade_sum_avx512.cpp); other builds run the plain loops, which
// give the same values.

namespace ds4 {

float binade_seq_sum(const float* w, int64_t n) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return binade_seq_sum_avx512(w, n);
#endif
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) s += w[i];
    return s;
}

float binade_seq_sum_from(const float* w, int64_t n, float s) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return binade_seq_sum_from_avx512(w, n, s);
#endif
    for (int64_t i = 0; i < n; ++i) s += w[i];
    return s;
}

float binade_weight_total(const float* x, int64_t n, float* wa) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return binade_weight_total_avx512(x, n, wa);
#endif
    std::vector<float> own;
    if (!wa) {
        own.resize((size_t)n);
        wa = own.data();
    }
    exp_weights(x, wa, n);   // the exact weights: the best approximation there is
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) s += wa[i];
    return s;
}

int64_t binade_weight_walk(const float* x, const float* wa, int64_t n, float r) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return binade_weight_walk_avx512(x, wa, n, r);
#endif
    return binade::walk_plain(x, n, r);
}

namespace {

// Runs f(x, m, offset) over the arguments of a[0..n) in pieces of a stack buffer.
template <class F>
void logit_pieces(const float* a, int64_t n, float m, float t, F&& f) {
    float x[1024];
    for (int64_t i = 0; i < n; i += 1024) {
        const int64_t k = n - i < 1024 ? n - i : 1024;
        shifted_args(a + i, k, m, t, x);
        if (!f(x, k, i)) return;
    }
}

}  // namespace

namespace {

// A logit below which the weight is exactly 0: l - m < -105 t (1 + 2^-19) keeps fl(l - m) and
// the quotient by t below -105 after their roundings (2^-24 each), and exp(-105) rounds to float
// 0. -inf when even the smallest finite logit is not below it (nothing to skip).
float zero_weight_floor(float m, float t, float lowest) {
    const double bound = (double)m - 105.0 * (double)t * (1.0 + std::ldexp(1.0, -19));
    if (!(bound > -3.0e38)) return -__builtin_inff();
    float f = (float)bound;
    if ((double)f > bound) f = std::nextafter(f, -__builtin_inff());
    return f > lowest ? f : -__builtin_inff();
}

}  // namespace

float binade_logit_total(const float* a, int64_t n, float m, float t, bool all_finite, float lowest, float* wa) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return binade_logit_total_avx512(a, n, m, t, all_finite, zero_weight_floor(m, t, lowest), wa);
#endif
    float s = 0.0f, buf[1024];
    logit_pieces(a, n, m, t, [&](const float* x, int64_t k, int64_t i) {
        float* w = wa ? wa + i : buf;
        exp_weights(x, w, k);   // the exact weights: the best approximation there is
        for (int64_t j = 0; j < k; ++j) s += w[j];
        return true;
    });
    return s;
}

int64_t binade_logit_walk(const float* a, int64_t n, float m, float t, bool all_finite, float lowest, const float* wa,
                          float r) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return binade_logit_walk_avx512(a, n, m, t, all_finite, zero_weight_floor(m, t, lowest), wa, r);
#endif
    int64_t hit = -1;
    logit_pieces(a, n, m, t, [&](const float* x, int64_t k, int64_t i) {
        const int64_t h = binade::walk_plain(x, k, r);
        if (h >= 0) hit = i + h;
        return h < 0;
    });
    return hit;
}

float reciprocal_weight_rel(float m, float t, float lowest) {
    // (t within [2^-100, 2^100]: fl(1/t) a normal float with its 2^-24 relative error)
    if (!sampling_avx512() || t == 1.0f || !(t >= 0x1p-100f && t <= 0x1p100f)) return 0.0f;   // (elsewhere: exact weights)
    // L bounds |fl(a - m) / t| over the finite logits (a >= lowest, and fl(a - m) >= fl(lowest - m)).
    const double big_l = -(double)(lowest - m) / (double)t;
    if (!(big_l <= 4.0)) return 0.0f;
    // fl(1/t) and the product each err by 2^-24 relative, the divided argument itself by 2^-24:
    // |x' - x| <= 3 * 2^-24 * L (1 + 2^-23) =: d (where an argument is subnormal both weights are
    // 1). approx(x') is within 2^-21.2 of exp_weights(x') (the checked bound), which is within
    // e^d (1 + 2^-24) / (1 - 2^-24) of exp_weights(x): in all below 0.57 * 2^-20 + 1.01 d, which
    // kApproxWeightRel + 4 * 2^-24 * L covers, rounded up to the 2^-23 grid of 1 + rel.
    const double extra = 4.0 * std::ldexp(big_l, -24) + std::ldexp(1.0, -60);
    const double steps = std::ceil((double)kApproxWeightRel * 0x1p23 + extra * 0x1p23);
    return (float)std::ldexp(steps, -23);
}

float binade_seq_sum_guided(const float* w, int64_t n, const float* chunk_sum, ThreadPool& pool) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return binade_seq_sum_guided_avx512(w, n, chunk_sum, pool);
#endif
    return binade_seq_sum(w, n);
}

float binade_logit_total_rcp(const float* a, int64_t n, float m, float t, bool all_finite, float lowest, float rel,
                             float* wa) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512() && rel > 0.0f)
        return binade_logit_total_rcp_avx512(a, n, m, t, all_finite, zero_weight_floor(m, t, lowest), rel, wa);
#endif
    return binade_logit_total(a, n, m, t, all_finite, lowest, wa);   // its approximations are exact here
}

int64_t binade_logit_walk_rcp(const float* a, int64_t n, float m, float t, bool all_finite, float lowest, float rel,
                              const float* wa, float r) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512() && rel > 0.0f)
        return binade_logit_walk_rcp_avx512(a, n, m, t, all_finite, zero_weight_floor(m, t, lowest), rel, wa, r);
#endif
    return binade_logit_walk(a, n, m, t, all_finite, lowest, wa, r);
}

int64_t binade_seq_walk(const float* w, int64_t n, float r) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return binade_seq_walk_avx512(w, n, r);
#endif
    return binade::seq_walk_plain(w, n, r);
}

int64_t binade_seq_until(const float* w, int64_t n, float total, float top_p, float& s) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return binade_seq_until_avx512(w, n, total, top_p, s);
#endif
    return binade::seq_until_plain(w, n, total, top_p, s);
}

void approx_exp_weights(const float* x, float* w, int64_t n) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return approx_exp_weights_avx512(x, w, n);
#endif
    exp_weights(x, w, n);
}

}  // namespace ds4
