#include "sampling/exp_weights.h"

#include "quant/simd.h"
#include "sampling/exp_weights.inc"

namespace ds4 {

void exp_weights_generic(const float* x, float* w, int64_t n) { exp_weights_loop(x, w, n); }

bool sampling_avx512() {
#if defined(DS4_ARCH_X86)
    const SimdPath p = simd_path();
    return p == SimdPath::AVX512 || p == SimdPath::AVX512VNNI;
#else
    return false;
#endif
}

void exp_weights(const float* x, float* w, int64_t n) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return exp_weights_avx512(x, w, n);
#endif
    exp_weights_generic(x, w, n);
}

}  // namespace ds4
