#include "sampling/exp_weights.h"

#include "quant/simd.h"
#include "sampling/exp_weights.inc"
#include "sampling/scan.h"

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

void exp_weights_of_logits(const float* a, int64_t n, float m, float t, bool all_finite, float* w) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return exp_weights_of_logits_avx512(a, n, m, t, all_finite, w);
#endif
    constexpr int64_t kPiece = 256;
    alignas(64) float xb[kPiece];
    for (int64_t i = 0; i < n; i += kPiece) {
        const int64_t len = n - i < kPiece ? n - i : kPiece;
        shifted_args(a + i, len, m, t, xb);   // all_finite only spares the AVX-512 loop a test
        exp_weights_generic(xb, w + i, len);
    }
}

}  // namespace ds4
