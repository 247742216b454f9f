// The collection pass of the whole-vocabulary top-p buckets (bucket_topp.h, docs/sampling.md
// "Eighth round"): the ids of the tokens whose bucket is wanted, written into their buckets'
// segments, without touching any other bucket's.
#pragma once
#include <cstdint>

namespace ds4 {

// For every i < n (ascending) with want[bix[i]] != 0: ids[cur[bix[i]]++] = i. want has nb + 1
// entries (bucket nb marks a token that is not finite, never wanted: want[nb] == 0). hits: scratch
// of n + 64 entries.
void bucket_collect(const uint16_t* bix, int64_t n, const uint8_t* want, int nb, uint32_t* cur, int32_t* ids,
                    int32_t* hits);

// The plain loop from i0 on (the whole pass on any build, and the vector build's tail).
void bucket_collect_from(const uint16_t* bix, int64_t i0, int64_t n, const uint8_t* want, uint32_t* cur, int32_t* ids);

#if defined(DS4_ARCH_X86)
void bucket_collect_avx512(const uint16_t* bix, int64_t n, const uint8_t* want, int nb, uint32_t* cur, int32_t* ids,
                           int32_t* hits);
#endif

}  // namespace ds4
