#include "sampling/scan.h"

#include "sampling/exp_weights.h"

namespace ds4 {

int64_t collect_finite_at_least(const float* a, int64_t n, float floor, int32_t* out, float* vals) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return collect_finite_at_least_avx512(a, n, floor, out, vals);
#endif
    return collect_finite_at_least_from(a, 0, n, floor, out, vals, 0);
}

int64_t collect_finite_at_least_from(const float* a, int64_t i, int64_t n, float floor, int32_t* out, float* vals,
                                     int64_t k) {
    for (; i < n; ++i) {
        if (a[i] >= floor && a[i] - a[i] == 0.0f) {
            if (vals) vals[k] = a[i];
            out[k++] = (int32_t)i;
        }
    }
    return k;
}

int64_t collect_above_and_tied(const float* a, int64_t n, float v, int32_t* above, float* vals,
                               int64_t limit, int32_t* tied, int64_t* n_tied) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return collect_above_and_tied_avx512(a, n, v, above, vals, limit, tied, n_tied);
#endif
    return collect_above_and_tied_from(a, 0, n, v, above, vals, limit, tied, n_tied, 0, 0);
}

int64_t collect_above_and_tied_from(const float* a, int64_t i, int64_t n, float v, int32_t* above, float* vals,
                                    int64_t limit, int32_t* tied, int64_t* n_tied, int64_t k, int64_t t) {
    for (; i < n; ++i) {
        if (a[i] > v && a[i] - a[i] == 0.0f) {
            vals[k] = a[i];
            above[k++] = (int32_t)i;
        } else if (a[i] == v && t < limit) {
            tied[t++] = (int32_t)i;
        }
    }
    *n_tied = t < limit ? t : limit;  // a vector pass may have stored a whole vector past limit
    return k;
}

int64_t first_ratio_below(const float* w, int64_t n, float total, float bound) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return first_ratio_below_avx512(w, n, total, bound);
#endif
    for (int64_t i = 1; i < n; ++i)
        if (w[i] / total < bound) return i;
    return n;
}

float finite_max(const float* a, int64_t n, int64_t* n_finite, float* min_out) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return finite_max_avx512(a, n, n_finite, min_out);
#endif
    float r = -__builtin_inff(), lo = __builtin_inff();
    int64_t c = 0;
    for (int64_t i = 0; i < n; ++i) {
        const bool fin = a[i] - a[i] == 0.0f;
        c += fin;
        if (fin && a[i] > r) r = a[i];
        if (fin && a[i] < lo) lo = a[i];
    }
    if (n_finite) *n_finite = c;
    if (min_out) *min_out = lo;
    return r;
}

int64_t shifted_args(const float* a, int64_t n, float m, float t, float* x) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return shifted_args_avx512(a, n, m, t, x);
#endif
    const float neg_inf = -__builtin_inff();
    int64_t c = 0;
    for (int64_t i = 0; i < n; ++i) {
        const bool fin = a[i] - a[i] == 0.0f;   // false for NaN and +-inf
        c += fin;
        x[i] = fin ? (t == 1.0f ? a[i] - m : (a[i] - m) / t) : neg_inf;
    }
    return c;
}

double mass_in(const float* w, int64_t n, float lo, float hi, int step) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return mass_in_avx512(w, n, lo, hi, step);
#endif
    double r = 0.0;
    for (int64_t b = 0; b < n; b += 16 * (int64_t)step)
        for (int64_t i = b; i < b + 16 && i < n; ++i) r += (w[i] >= lo && w[i] < hi) ? w[i] : 0.0f;
    return r * step;
}

}  // namespace ds4
