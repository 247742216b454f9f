#include "sampling/scale_weights.h"

#include "sampling/exp_weights.h"

namespace ds4 {

void scale_weights_generic(const float* w, int64_t n, double inv, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = (float)((double)w[i] * inv);
}

void scale_weights(const float* w, int64_t n, double inv, float* out) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return scale_weights_avx512(w, n, inv, out);
#endif
    scale_weights_generic(w, n, inv, out);
}

}  // namespace ds4
