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

// The top-p prefix (docs/sampling.md, "Ninth round"): for every i (ascending) with a[i] >= floor and
// a[i] finite, one word (f << id_bits) | i into out; returns how many. f is the token's level on a
// grid of 2^fine_bits below hi (the largest finite logit): f = trunc(min(fl(fl(hi - a[i]) * scale),
// 2^fine_bits - 1)), which never decreases as the logit falls and is equal for equal logits, so
// any f * nb >> fine_bits is a valid bucket index (bucket_topp.h). The level rides in the id's word
// because the collection's cost is its vector compress, one per 16 logits and array: a second
// array of logits cost about as much as the rest of the pass. Needs n <= 2^id_bits,
// fine_bits <= 16 (the level's float clamp 2^fine_bits - 1 exact) and id_bits + fine_bits <= 32;
// floor finite, scale > 0. all_finite (a holds no inf or NaN) skips the
// finiteness test. out holds n + 64 entries.
struct PrefixGrid {
    float hi = 0.0f, scale = 0.0f;
    int id_bits = 0, fine_bits = 0;
};
int64_t collect_prefix(const float* a, int64_t n, float floor, const PrefixGrid& g, bool all_finite, uint32_t* out);
int64_t collect_prefix_from(const float* a, int64_t i0, int64_t n, float floor, const PrefixGrid& g, uint32_t* out,
                            int64_t k);

#if defined(DS4_ARCH_X86)
int64_t collect_prefix_avx512(const float* a, int64_t n, float floor, const PrefixGrid& g, bool all_finite, uint32_t* out);
void bucket_collect_avx512(const uint16_t* bix, int64_t n, const uint8_t* want, int nb, uint32_t* cur, int32_t* ids,
                           int32_t* hits);
#endif

}  // namespace ds4
