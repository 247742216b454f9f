// Byte layouts of the weight block formats (docs/model.md 4.1) and the scalar half/bfloat16 conversions.
// Internal to csrc/quant. Multi-byte fields are read with load_*() (memcpy) because weight rows and
// activation buffers may start at any byte offset. The helpers are `static` so that per-ISA files
// (compiled with AVX-512 etc.) never provide the out-of-line copy the portable code links to.
#pragma once
#include <cstdint>
#include <cstring>

#include "quant/kernels.h"

namespace ds4::quant {

constexpr int QK = 256;  // super-block size of the K and IQ formats

struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };
struct BlockQ2K { uint8_t scales[16]; uint8_t qs[64]; uint16_t d; uint16_t dmin; };
struct BlockQ4K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct BlockIQ2XXS { uint16_t d; uint16_t qs[32]; };
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block layout");
static_assert(sizeof(BlockQ2K) == 84, "Q2_K block layout");
static_assert(sizeof(BlockQ4K) == 144, "Q4_K block layout");
static_assert(sizeof(BlockIQ2XXS) == 66, "IQ2_XXS block layout");
static_assert(sizeof(BlockQ8_0Act) == 36, "Q8_0 activation block layout");

static inline float load_f32(const void* p) { float v; std::memcpy(&v, p, 4); return v; }
static inline uint16_t load_u16(const void* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
static inline uint32_t load_u32(const void* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }

// IEEE binary16 -> binary32, exact for every input (subnormals, inf, NaN payload kept).
static inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {
        // Subnormal half: normalise the mantissa into a float exponent.
        int e = -1;
        do { mant <<= 1; ++e; } while ((mant & 0x400u) == 0);
        bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

static inline float bf16_to_f32(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// Q4_K packs eight 6-bit (scale, min) pairs into 12 bytes (docs/model.md 4.1).
static inline void q4k_scale_min(const uint8_t* s, int k, uint8_t* sc, uint8_t* m) {
    if (k < 4) {
        *sc = s[k] & 63;
        *m = s[k + 4] & 63;
    } else {
        *sc = (uint8_t)((s[k + 4] & 15) | ((s[k - 4] >> 6) << 4));
        *m = (uint8_t)((s[k + 4] >> 4) | ((s[k] >> 6) << 4));
    }
}

// The per-block parts every Q4_K x Q8_K kernel shares (the integer dot is each kernel's own):
// the 6-bit sub-block scales, and the exact min term sum_j bsums[j] * m[j/2] (Q8_K bsums[j]
// covers 16 activations of sub-block j/2).
static inline int32_t q4k_scales_and_min_sum(const BlockQ4K* x, const uint8_t* q8k_block, uint8_t sc[8]) {
    uint8_t m[8];
    for (int k = 0; k < 8; ++k) q4k_scale_min(x->scales, k, &sc[k], &m[k]);
    int32_t summs = 0;
    for (int j = 0; j < 16; ++j) summs += (int32_t)(int16_t)load_u16(q8k_block + 260 + 2 * j) * m[j / 2];
    return summs;
}

// One block's float contribution d*isum - dmin*summs, with both scales first multiplied by the
// activation's d (the order every path uses, so results stay bit-identical across paths).
static inline float q4k_block_value(const BlockQ4K* x, const uint8_t* q8k_block, int32_t isum, int32_t summs) {
    const float yd = load_f32(q8k_block);
    const float d = yd * f16_to_f32(load_u16(&x->d));
    const float dmin = yd * f16_to_f32(load_u16(&x->dmin));
    return d * (float)isum - dmin * (float)summs;
}

}  // namespace ds4::quant
