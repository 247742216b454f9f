// Whole-vocabulary scans of the sampler with an AVX-512 build (chosen at run time like exp_weights;
// the results do not depend on the build).
#pragma once
#include <cstdint>

namespace ds4 {

// Writes the ids i (ascending) with a[i] finite and a[i] >= floor to out (and a[i] to vals when
// not null); returns how many. out and vals must hold n + 16 entries (the vector build writes
// whole vectors).
int64_t collect_finite_at_least(const float* a, int64_t n, float floor, int32_t* out, float* vals = nullptr);

// One pass: the ids i (ascending) with finite a[i] > v to above (a[i] to vals), and the first
// `limit` ids with a[i] == v to tied (v finite). Returns the count above; *n_tied gets the tied
// count (<= limit). above and vals must hold n + 16 entries, tied limit + 16.
int64_t collect_above_and_tied(const float* a, int64_t n, float v, int32_t* above, float* vals,
                               int64_t limit, int32_t* tied, int64_t* n_tied);

// The sum of the entries lo <= w[i] < hi in every step-th block of 16 (step 1: every entry),
// times step: an estimate of the mass in [lo, hi), for choosing thresholds only.
double mass_in(const float* w, int64_t n, float lo, float hi, int step);

// The first i >= 1 with fl(w[i] / total) < bound (n when none): upstream's min-p stop.
int64_t first_ratio_below(const float* w, int64_t n, float total, float bound);

// The largest finite a[i] (-inf when none is finite); *n_finite (when given) gets how many are
// finite, *min_out (when given) the smallest finite a[i] (+inf when none is).
float finite_max(const float* a, int64_t n, int64_t* n_finite = nullptr, float* min_out = nullptr);

// x[i] = fl(fl(a[i] - m) / t), -inf for non-finite a[i] (dividing by 1 is exact: skipped);
// returns how many a[i] are finite.
int64_t shifted_args(const float* a, int64_t n, float m, float t, float* x);

// The scalar loops from entry i on, continuing counts k (and t) that a vector pass left: the
// whole scan on any build, and the vector builds' tails (scan.cpp; plain code, so no ISA-specific
// copy of it can reach a scalar caller).
int64_t collect_finite_at_least_from(const float* a, int64_t i, int64_t n, float floor, int32_t* out, float* vals,
                                     int64_t k);
int64_t collect_above_and_tied_from(const float* a, int64_t i, int64_t n, float v, int32_t* above, float* vals,
                                    int64_t limit, int32_t* tied, int64_t* n_tied, int64_t k, int64_t t);

float finite_max_avx512(const float* a, int64_t n, int64_t* n_finite, float* min_out);
int64_t shifted_args_avx512(const float* a, int64_t n, float m, float t, float* x);
int64_t collect_finite_at_least_avx512(const float* a, int64_t n, float floor, int32_t* out, float* vals);
int64_t collect_above_and_tied_avx512(const float* a, int64_t n, float v, int32_t* above, float* vals,
                                      int64_t limit, int32_t* tied, int64_t* n_tied);
int64_t first_ratio_below_avx512(const float* w, int64_t n, float total, float bound);
double mass_in_avx512(const float* w, int64_t n, float lo, float hi, int step);

}  // namespace ds4
