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

}  // namespace ds4
