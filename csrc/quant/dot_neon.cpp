// ARM NEON (armv8.2-a dotprod) row-dot kernels, in upstream's NEON float orders (docs/model.md 4.2,
// 4.3, 4.6), so an arm64 build reproduces upstream's Apple-silicon CPU path:
//   F16/BF16: 8 per step into two 4-lane FMA accumulators, horizontal add, scalar tail;
//   Q8_0: 4 int32 dot lanes per block, even blocks FMA into accumulator A, odd into B;
//   Q2_K: per block the min term is added first, then d * isum;
//   IQ2_XXS: per pair of sub-blocks (float)isum * (0.5 + ls) summed in float, final x0.25.
// Q4_K (no upstream CPU kernel) and F32 (double accumulation) keep the scalar order exactly.
// Every integer sum is exact (vdotq_s32 on int8 x int8 into int32).
#include <arm_neon.h>

#include "quant/dot_kernels.h"
#include "quant/formats.h"
#include "quant/iq2xxs_tables.h"

namespace ds4::quant {

namespace {

// Loads through uint8 so no alignment beyond one byte is assumed.
inline int8x16_t ld_s8(const uint8_t* p) { return vreinterpretq_s8_u8(vld1q_u8(p)); }
inline float32x4_t ld_f32(const uint8_t* p) { return vreinterpretq_f32_u8(vld1q_u8(p)); }

#include "quant/half_tile_neon.inc"

// The F16/BF16 row kernel is the 1 x 1 tile (half_tile_neon.inc), so the tiles give its bits.
template <bool kBf16>
float neon_dot_half(const void* w, const void* xq, int64_t n) {
    float y;
    neon_half_tile<kBf16, 1, 1>(static_cast<const uint8_t*>(w), 0, static_cast<const float*>(xq), 0, n, &y, 0);
    return y;
}

inline int32x4_t q8_0_dot_lanes(const uint8_t* wq, const uint8_t* aq) {
    int32x4_t d = vdotq_s32(vdupq_n_s32(0), ld_s8(wq), ld_s8(aq));
    return vdotq_s32(d, ld_s8(wq + 16), ld_s8(aq + 16));
}

float neon_dot_q8_0(const void* w, const void* xq, int64_t n) {
    const uint8_t* wp = static_cast<const uint8_t*>(w);
    const uint8_t* xp = static_cast<const uint8_t*>(xq);
    const int64_t nb = n / 32;
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        const uint8_t* w0 = wp + b * 34;
        const uint8_t* w1 = w0 + 34;
        const uint8_t* x0 = xp + b * 36;
        const uint8_t* x1 = x0 + 36;
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(q8_0_dot_lanes(w0 + 2, x0 + 4)), f16_to_f32(load_u16(w0)) * load_f32(x0));
        acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(q8_0_dot_lanes(w1 + 2, x1 + 4)), f16_to_f32(load_u16(w1)) * load_f32(x1));
    }
    if (b < nb) {
        const uint8_t* w0 = wp + b * 34;
        const uint8_t* x0 = xp + b * 36;
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(q8_0_dot_lanes(w0 + 2, x0 + 4)), f16_to_f32(load_u16(w0)) * load_f32(x0));
    }
    return vaddvq_f32(vaddq_f32(acc0, acc1));
}

float neon_dot_q2_k(const void* w, const void* xq, int64_t n) {
    const uint8_t* wp = static_cast<const uint8_t*>(w);
    const uint8_t* xp = static_cast<const uint8_t*>(xq);
    const uint8x16_t m3 = vdupq_n_u8(3);
    const uint8x16_t m4 = vdupq_n_u8(15);
    const int32x4_t zero = vdupq_n_s32(0);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK; ++b, wp += sizeof(BlockQ2K), xp += sizeof(BlockQ8K)) {
        const BlockQ2K* x = reinterpret_cast<const BlockQ2K*>(wp);
        const float yd = load_f32(xp);
        const float d = yd * f16_to_f32(load_u16(&x->d));
        const float dmin = -yd * f16_to_f32(load_u16(&x->dmin));
        const uint8x16_t sc = vld1q_u8(x->scales);
        uint8_t scale_lanes[16];
        vst1q_u8(scale_lanes, vandq_u8(sc, m4));
        const uint8x16_t mins = vshrq_n_u8(sc, 4);
        const int16x8_t bs0 = vreinterpretq_s16_u8(vld1q_u8(xp + 260));
        const int16x8_t bs1 = vreinterpretq_s16_u8(vld1q_u8(xp + 276));
        const int16x8_t mn0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins)));
        const int16x8_t mn1 = vreinterpretq_s16_u16(vmovl_u8(vget_high_u8(mins)));
        const int32x4_t s0 = vaddq_s32(vmull_s16(vget_low_s16(mn0), vget_low_s16(bs0)),
                                       vmull_s16(vget_high_s16(mn0), vget_high_s16(bs0)));
        const int32x4_t s1 = vaddq_s32(vmull_s16(vget_low_s16(mn1), vget_low_s16(bs1)),
                                       vmull_s16(vget_high_s16(mn1), vget_high_s16(bs1)));
        sum += dmin * (float)vaddvq_s32(vaddq_s32(s0, s1));

        const uint8_t* q2 = x->qs;
        const uint8_t* q8 = xp + 4;
        int32_t isum = 0;
        for (int h = 0; h < 2; ++h, q2 += 32) {
            const uint8x16_t lo = vld1q_u8(q2), hi = vld1q_u8(q2 + 16);
            for (int j = 0; j < 4; ++j, q8 += 32) {
                const int8x16_t c0 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(lo, vdupq_n_s8((int8_t)(-2 * j))), m3));
                const int8x16_t c1 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(hi, vdupq_n_s8((int8_t)(-2 * j))), m3));
                isum += vaddvq_s32(vdotq_s32(zero, c0, ld_s8(q8))) * scale_lanes[8 * h + 2 * j];
                isum += vaddvq_s32(vdotq_s32(zero, c1, ld_s8(q8 + 16))) * scale_lanes[8 * h + 2 * j + 1];
            }
        }
        sum += d * (float)isum;
    }
    return sum;
}

float neon_dot_q4_k(const void* w, const void* xq, int64_t n) {
    const uint8_t* wp = static_cast<const uint8_t*>(w);
    const uint8_t* xp = static_cast<const uint8_t*>(xq);
    const uint8x16_t m4 = vdupq_n_u8(15);
    const int32x4_t zero = vdupq_n_s32(0);
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / QK; ++b, wp += sizeof(BlockQ4K), xp += sizeof(BlockQ8K)) {
        const BlockQ4K* x = reinterpret_cast<const BlockQ4K*>(wp);
        const uint8_t* q8 = xp + 4;
        uint8_t sc[8];
        const int32_t summs = q4k_scales_and_min_sum(x, xp, sc);
        int32_t isum = 0;
        for (int c = 0; c < 4; ++c) {
            const uint8x16_t q0 = vld1q_u8(x->qs + 32 * c), q1 = vld1q_u8(x->qs + 32 * c + 16);
            const int8x16_t l0 = vreinterpretq_s8_u8(vandq_u8(q0, m4)), l1 = vreinterpretq_s8_u8(vandq_u8(q1, m4));
            const int8x16_t h0 = vreinterpretq_s8_u8(vshrq_n_u8(q0, 4)), h1 = vreinterpretq_s8_u8(vshrq_n_u8(q1, 4));
            const int32_t lo = vaddvq_s32(vdotq_s32(vdotq_s32(zero, l0, ld_s8(q8 + 64 * c)), l1, ld_s8(q8 + 64 * c + 16)));
            const int32_t hi = vaddvq_s32(vdotq_s32(vdotq_s32(zero, h0, ld_s8(q8 + 64 * c + 32)), h1, ld_s8(q8 + 64 * c + 48)));
            isum += sc[2 * c] * lo + sc[2 * c + 1] * hi;
        }
        sumf += q4k_block_value(x, xp, isum, summs);
    }
    return sumf;
}

// ksigns_iq2xs as eight int8 factors (+1 / -1) per entry, for vmulq_s8 on the grid bytes.
struct Iq2Signs {
    int8_t v[128][8];
    constexpr Iq2Signs() : v() {
        for (int i = 0; i < 128; ++i)
            for (int j = 0; j < 8; ++j) v[i][j] = ((kIq2Ksigns[i] >> j) & 1) ? -1 : 1;
    }
};
constexpr Iq2Signs kIq2Signs{};

inline int8x16_t iq2_signed_pair(uint32_t grid_word, uint32_t sign_word, int first) {
    const uint8_t g0 = (uint8_t)(grid_word >> (8 * first)), g1 = (uint8_t)(grid_word >> (8 * first + 8));
    const int8x16_t g = vreinterpretq_s8_u64(vcombine_u64(vcreate_u64(kIq2xxsGrid[g0]), vcreate_u64(kIq2xxsGrid[g1])));
    const int8x16_t s = vcombine_s8(vld1_s8(kIq2Signs.v[(sign_word >> (7 * first)) & 127]),
                                    vld1_s8(kIq2Signs.v[(sign_word >> (7 * first + 7)) & 127]));
    return vmulq_s8(g, s);
}

float neon_dot_iq2_xxs(const void* w, const void* xq, int64_t n) {
    const uint8_t* wp = static_cast<const uint8_t*>(w);
    const uint8_t* xp = static_cast<const uint8_t*>(xq);
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / QK; ++b, wp += sizeof(BlockIQ2XXS), xp += sizeof(BlockQ8K)) {
        const float d = f16_to_f32(load_u16(wp)) * load_f32(xp);
        const uint8_t* qs = wp + 2;
        const uint8_t* q8 = xp + 4;
        float sumf1 = 0.0f, sumf2 = 0.0f;
        for (int ib = 0; ib < 8; ib += 2, qs += 16, q8 += 64) {
            const uint32_t a0 = load_u32(qs), s0 = load_u32(qs + 4), a1 = load_u32(qs + 8), s1 = load_u32(qs + 12);
            const int32x4_t p1 = vdotq_s32(vdotq_s32(vdupq_n_s32(0), iq2_signed_pair(a0, s0, 0), ld_s8(q8)),
                                           iq2_signed_pair(a0, s0, 2), ld_s8(q8 + 16));
            const int32x4_t p2 = vdotq_s32(vdotq_s32(vdupq_n_s32(0), iq2_signed_pair(a1, s1, 0), ld_s8(q8 + 32)),
                                           iq2_signed_pair(a1, s1, 2), ld_s8(q8 + 48));
            sumf1 += (float)vaddvq_s32(p1) * (0.5f + (float)(s0 >> 28));
            sumf2 += (float)vaddvq_s32(p2) * (0.5f + (float)(s1 >> 28));
        }
        sumf += d * (sumf1 + sumf2);
    }
    return 0.25f * sumf;
}

}  // namespace

const DotKernels& neon_kernels() {
    static const DotKernels k{scalar_kernels().f32, neon_dot_half<false>, neon_dot_half<true>, neon_dot_q8_0,
                              neon_dot_q2_k, neon_dot_q4_k, neon_dot_iq2_xxs, nullptr, nullptr, nullptr, nullptr,
                              PreparedDot{}, neon_half_block<false>, neon_half_block<true>};
    return k;
}

}  // namespace ds4::quant
