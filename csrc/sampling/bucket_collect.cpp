#include "sampling/bucket_collect.h"

#include "sampling/exp_weights.h"

namespace ds4 {

void bucket_collect_from(const uint16_t* bix, int64_t i0, int64_t n, const uint8_t* want, uint32_t* cur, int32_t* ids) {
    for (int64_t i = i0; i < n; ++i) {
        const uint32_t b = bix[i];
        if (want[b]) ids[cur[b]++] = (int32_t)i;
    }
}

void bucket_collect(const uint16_t* bix, int64_t n, const uint8_t* want, int nb, uint32_t* cur, int32_t* ids,
                    int32_t* hits) {
#if defined(DS4_ARCH_X86)
    if (nb <= 4096 && sampling_avx512()) return bucket_collect_avx512(bix, n, want, nb, cur, ids, hits);
#endif
    bucket_collect_from(bix, 0, n, want, cur, ids);
}

int64_t collect_prefix_from(const float* a, int64_t i0, int64_t n, float floor, const PrefixGrid& g, uint32_t* out,
                            int64_t k) {
    const float top = (float)((1u << g.fine_bits) - 1);
    for (int64_t i = i0; i < n; ++i) {
        const float v = a[i];
        if (!(v >= floor && v - v == 0.0f)) continue;
        float f = (g.hi - v) * g.scale;
        f = f < top ? f : top;
        out[k++] = ((uint32_t)(int32_t)f << g.id_bits) | (uint32_t)i;
    }
    return k;
}

int64_t collect_prefix(const float* a, int64_t n, float floor, const PrefixGrid& g, bool all_finite, uint32_t* out) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return collect_prefix_avx512(a, n, floor, g, all_finite, out);
#endif
    return collect_prefix_from(a, 0, n, floor, g, out, 0);
}

}  // namespace ds4
