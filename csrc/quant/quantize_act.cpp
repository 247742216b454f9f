// Activation quantisation (docs/model.md 4.1 Q8_K, 4.2 Q8_0-act), with upstream's float order:
// the scale and its reciprocal are plain float32 operations and rounding is lrintf (ties to even
// under the default rounding mode). Values beyond the int8 range saturate (this only happens when
// a subnormal block makes the reciprocal scale overflow to inf, where upstream's (int)lrintf(inf)
// is platform-defined garbage); NaN quantises to 0. With a finite reciprocal |x*id| <= 127, so a
// Q8_K code of -128 implies d == 0 (the IQ2_XXS SIMD kernels rely on this).
#include <cmath>
#include <cstring>
#include <string>

#include "common/errors.h"
#include "quant/formats.h"
#include "quant/kernels.h"
#include "quant/quantize_act_simd.h"
#include "quant/simd.h"

namespace ds4 {

using namespace quant;

namespace {

inline int8_t round_clamp(float v) {
    if (v >= 127.0f) return 127;
    if (v <= -128.0f) return -128;
    if (v != v) return 0;
    return (int8_t)std::lrintf(v);
}

void check_len(const char* what, int64_t n, int64_t block) {
    if (n < 0 || n % block != 0) {
        fail(ErrorKind::InvalidArgument, std::string(what) + ": length " + std::to_string(n) +
                                             " is not a non-negative multiple of " + std::to_string(block));
    }
}

void quantize_q8_0_act_scalar(const float* x, BlockQ8_0Act* out, int64_t n) {
    unsigned char* dst = reinterpret_cast<unsigned char*>(out);
    for (int64_t b = 0; b < n / 32; ++b, x += 32, dst += sizeof(BlockQ8_0Act)) {
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) {
            const float ax = std::fabs(x[i]);
            if (ax > amax) amax = ax;
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int8_t q[32];
        for (int i = 0; i < 32; ++i) q[i] = round_clamp(x[i] * id);
        std::memcpy(dst, &d, 4);
        std::memcpy(dst + 4, q, 32);
    }
}

void quantize_q8_K_scalar(const float* x, BlockQ8K* out, int64_t n) {
    unsigned char* dst = reinterpret_cast<unsigned char*>(out);
    for (int64_t b = 0; b < n / QK; ++b, x += QK, dst += sizeof(BlockQ8K)) {
        BlockQ8K blk;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK; ++j) {
            const float ax = std::fabs(x[j]);
            if (ax > amax) {  // strict: the first element of largest magnitude wins
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0.0f) {
            std::memset(&blk, 0, sizeof(blk));
        } else {
            const float iscale = -127.0f / max;
            for (int j = 0; j < QK; ++j) blk.qs[j] = round_clamp(iscale * x[j]);
            for (int j = 0; j < QK / 16; ++j) {
                int sum = 0;
                for (int i = 0; i < 16; ++i) sum += blk.qs[16 * j + i];
                blk.bsums[j] = (int16_t)sum;
            }
            blk.d = 1.0f / iscale;
        }
        std::memcpy(dst, &blk, sizeof(blk));
    }
}

}  // namespace

// The vector quantisers compute the scalar ones' bits (quantize_act_simd.inc), so every SIMD path
// writes the same activation bytes; DS4_SIMD=scalar keeps the loops above.
void quantize_q8_0_act(const float* x, BlockQ8_0Act* out, int64_t n) {
    check_len("quantize_q8_0_act", n, 32);
    switch (simd_path()) {
#if defined(DS4_ARCH_X86)
        case SimdPath::AVX2: quantize_q8_0_act_blocks_avx2(x, out, n / 32); return;
        case SimdPath::AVX512:
        case SimdPath::AVX512VNNI: quantize_q8_0_act_blocks_avx512(x, out, n / 32); return;
#endif
        default: quantize_q8_0_act_scalar(x, out, n); return;
    }
}

void quantize_q8_K(const float* x, BlockQ8K* out, int64_t n) {
    check_len("quantize_q8_K", n, QK);
    switch (simd_path()) {
#if defined(DS4_ARCH_X86)
        case SimdPath::AVX2: quantize_q8_K_blocks_avx2(x, out, n / QK); return;
        case SimdPath::AVX512:
        case SimdPath::AVX512VNNI: quantize_q8_K_blocks_avx512(x, out, n / QK); return;
#endif
        default: quantize_q8_K_scalar(x, out, n); return;
    }
}

GgmlType act_type_for(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::F32:
        case GgmlType::F16:
        case GgmlType::BF16: return GgmlType::F32;
        case GgmlType::Q8_0: return GgmlType::Q8_0;
        case GgmlType::Q2_K:
        case GgmlType::Q4_K:
        case GgmlType::IQ2_XXS: return GgmlType::Q8_K;
        default: break;
    }
    fail(ErrorKind::Unsupported,
         std::string("type ") + type_traits(weight_type).name + " is not a weight type with a CPU dot kernel");
}

int64_t act_bytes(GgmlType weight_type, int64_t n) {
    switch (act_type_for(weight_type)) {
        case GgmlType::Q8_0: check_len("Q8_0 activation", n, 32); return n / 32 * (int64_t)sizeof(BlockQ8_0Act);
        case GgmlType::Q8_K: check_len("Q8_K activation", n, QK); return n / QK * (int64_t)sizeof(BlockQ8K);
        default: check_len("F32 activation", n, 1); return n * 4;
    }
}

void quantize_act(GgmlType weight_type, const float* x, void* out, int64_t n) {
    switch (act_type_for(weight_type)) {
        case GgmlType::Q8_0: quantize_q8_0_act(x, static_cast<BlockQ8_0Act*>(out), n); return;
        case GgmlType::Q8_K: quantize_q8_K(x, static_cast<BlockQ8K*>(out), n); return;
        default:
            check_len("F32 activation", n, 1);
            std::memcpy(out, x, (size_t)n * 4);
            return;
    }
}

}  // namespace ds4
