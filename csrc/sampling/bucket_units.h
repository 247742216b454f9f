// A bucket's rounded units at the running value's unit (bucket_topp.cpp: a bucket whose every
// term rounds certainly is added or walked as a count of units). Called once per bucket of about
// 16 tokens, so the AVX-512 build handles a bucket's last partial vector with a mask: the plain
// loop's scalar remainder was about half of its time (docs/sampling.md, "Ninth round").
#pragma once
#include <cstdint>

namespace ds4 {

// The sum of round(wa[ids[j]] * inv_u) over j < m, true when every rounding is certain: the exact
// weights lie within rel of wa (relative; plus far below 2^-40 units), so each bound
// y (1 -+ 2 rel) rounds to the same integer, which is then the exact weight's rounding and no
// half-integer. Terms above 2^21 units are never certain. (inv_u is a power of two.) ids[m..m + 16)
// must be readable indices into wa as well (the vector build loads whole vectors and masks them).
constexpr int64_t kUnitsIdPad = 16;
bool approx_units(const float* wa, const int32_t* ids, int64_t m, float inv_u, float rel, int64_t& units);

// The same for exact weights w[0..m): false on a half-integer (a tie, whose rounding depends on
// the order) or a term above 2^22 units. The units are the same on every build.
bool exact_units(const float* w, int64_t m, float inv_u, int64_t& units);

bool approx_units_generic(const float* wa, const int32_t* ids, int64_t m, float inv_u, float rel, int64_t& units);
bool exact_units_generic(const float* w, int64_t m, float inv_u, int64_t& units);
#if defined(DS4_ARCH_X86)
bool approx_units_avx512(const float* wa, const int32_t* ids, int64_t m, float inv_u, float rel, int64_t& units);
bool exact_units_avx512(const float* w, int64_t m, float inv_u, int64_t& units);
#endif

}  // namespace ds4
