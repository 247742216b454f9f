#include "sampling/bucket_units.h"

#include "sampling/exp_weights.h"

namespace ds4 {

namespace {

#if defined(DS4_ARCH_X86) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define DS4_BUCKET_HOT __attribute__((target_clones("arch=x86-64-v4", "default"), noinline))
#else
#define DS4_BUCKET_HOT
#endif

constexpr float kShifter = 0x1.8p23f;   // y + 1.5 * 2^23 rounds 0 <= y < 2^22 to an integer

}  // namespace

// The plain loops. Approximate weights w (y = w * inv_u, exact: inv_u is a power of two) whose
// exact values lie within y * rel (plus far below 2^-40) of y: false when any rounding is uncertain.
// The bounds fl(y (1 -+ 2 rel)) still enclose the exact value strictly after their own rounding
// (the factor 2 covers it), and adding 1.5 * 2^23 rounds each to an integer: equal integers mean
// the exact value rounds to it and is no half-integer. Terms above 2^21 units are never certain.
DS4_BUCKET_HOT bool approx_units_generic(const float* wa, const int32_t* ids, int64_t m, float inv_u, float rel, int64_t& units) {
    const float up = 1.0f + 2.0f * rel, down = 1.0f - 2.0f * rel;
    int64_t acc = 0;
    int bad = 0;
    for (int64_t j = 0; j < m; ++j) {
        const float y0 = wa[ids[j]] * inv_u;
        const bool big = !(y0 <= 0x1p21f);   // (NaN too)
        const float y = big ? 0.0f : y0;     // keeps the conversion below defined
        const float h = y * up + kShifter;
        const float l = y * down + kShifter;
        bad |= (h != l) | big;
        acc += (int32_t)(h - kShifter);
    }
    units = acc;
    return !bad;
}

// The same for exact weights: false on a half-integer (a tie) or a term above 2^22 units.
DS4_BUCKET_HOT bool exact_units_generic(const float* w, int64_t m, float inv_u, int64_t& units) {
    int64_t acc = 0;
    int bad = 0;
    for (int64_t j = 0; j < m; ++j) {
        const float y0 = w[j] * inv_u;
        const bool big = !(y0 <= 0x1p22f);
        const float y = big ? 0.0f : y0;
        const float q = (y + kShifter) - kShifter;   // round to nearest (exact below 2^22)
        const float off = y - q;                      // exact
        bad |= (off == 0.5f) | (off == -0.5f) | big;
        acc += (int32_t)q;
    }
    units = acc;
    return !bad;
}

bool approx_units(const float* wa, const int32_t* ids, int64_t m, float inv_u, float rel, int64_t& units) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return approx_units_avx512(wa, ids, m, inv_u, rel, units);
#endif
    return approx_units_generic(wa, ids, m, inv_u, rel, units);
}

bool exact_units(const float* w, int64_t m, float inv_u, int64_t& units) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return exact_units_avx512(w, m, inv_u, units);
#endif
    return exact_units_generic(w, m, inv_u, units);
}

}  // namespace ds4
