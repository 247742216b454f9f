// probabilities()' last step: each kept weight over the kept total, out[i] = float(double(w[i]) * inv)
// with inv = 1 / double(total) (docs/sampling.md: the probability's bits are that expression's).
#pragma once
#include <cstdint>

namespace ds4 {

// out[i] = (float)((double)w[i] * inv) for i in [0, n); out may be w (in place).
void scale_weights(const float* w, int64_t n, double inv, float* out);

// Per-build entry points (the same IEEE operations per element, so the same bits).
void scale_weights_generic(const float* w, int64_t n, double inv, float* out);
#if defined(DS4_ARCH_X86)
void scale_weights_avx512(const float* w, int64_t n, double inv, float* out);
#endif

}  // namespace ds4
