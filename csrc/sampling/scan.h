// Whole-vocabulary scans of the sampler with an AVX-512 build (chosen at run time like exp_weights;
// the results do not depend on the build).
#pragma once
#include <cstdint>

namespace ds4 {

// Writes the ids i (ascending) with a[i] finite and a[i] >= floor to out; returns how many.
// out must hold n + 16 entries (the vector build writes whole vectors).
int64_t collect_finite_at_least(const float* a, int64_t n, float floor, int32_t* out);

// The sum of the entries w[i] >= c taken at stride `step` blocks of 16 (step 1: every entry),
// times step: an estimate of the mass at or above c, for choosing thresholds only.
double mass_at_least(const float* w, int64_t n, float c, int step);

// x[i] = fl(fl(a[i] - m) / t), -inf for non-finite a[i] (dividing by 1 is exact: skipped);
// returns how many a[i] are finite.
int64_t shifted_args(const float* a, int64_t n, float m, float t, float* x);

int64_t shifted_args_avx512(const float* a, int64_t n, float m, float t, float* x);
int64_t collect_finite_at_least_avx512(const float* a, int64_t n, float floor, int32_t* out);
double mass_at_least_avx512(const float* w, int64_t n, float c, int step);

}  // namespace ds4
