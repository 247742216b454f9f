// Sampling weights exp(x) for float32 arguments x <= 0, rounded once to float32 from a double
// evaluation (a correctly rounded expf but for arguments within ~2^-50 of a rounding boundary).
// The choice of token depends on the last bit of every weight, so the value must not depend on
// the CPU: each SIMD build evaluates the same double polynomial (docs/sampling.md).
#pragma once
#include <cstdint>

namespace ds4 {

// w[i] = float(exp(double(x[i]))); x[i] may be -inf (weight 0). Chooses the widest build the CPU
// and the active SIMD path allow.
void exp_weights(const float* x, float* w, int64_t n);

// w[i] = exp_weights(x[i]) of the arguments x[i] = fl(fl(a[i] - m) / t) (-inf for a non-finite
// a[i]; all_finite: none is), without an argument array: probabilities()' whole-vocabulary pieces.
void exp_weights_of_logits(const float* a, int64_t n, float m, float t, bool all_finite, float* w);

// Whether the AVX-512 builds of the sampling loops run here (the CPU and the active SIMD path
// allow them; DS4_SIMD=scalar turns them off).
bool sampling_avx512();

// Per-build entry points (same arithmetic, different vector widths).
void exp_weights_generic(const float* x, float* w, int64_t n);
#if defined(DS4_ARCH_X86)
void exp_weights_avx512(const float* x, float* w, int64_t n);
void exp_weights_of_logits_avx512(const float* a, int64_t n, float m, float t, bool all_finite, float* w);
#endif

}  // namespace ds4
