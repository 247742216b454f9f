// Scalar reference row-dot kernels: the orders of docs/model.md 4.2/4.3/4.6 (upstream's non-NEON
// build), written out literally. Every integer sum is exact; the float combination is sequential.
#include "quant/dot_kernels.h"
#include "quant/formats.h"
#include "quant/iq2xxs_tables.h"

namespace ds4::quant {

namespace {

float dot_f32(const void* w, const void* xq, int64_t n) {
    // F32 weights accumulate in double (only reachable for small plain MTP tensors).
    const uint8_t* wp = static_cast<const uint8_t*>(w);
    const uint8_t* xp = static_cast<const uint8_t*>(xq);
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) acc += (double)load_f32(wp + 4 * i) * (double)load_f32(xp + 4 * i);
    return (float)acc;
}

float dot_f16(const void* w, const void* xq, int64_t n) {
    const uint8_t* wp = static_cast<const uint8_t*>(w);
    const uint8_t* xp = static_cast<const uint8_t*>(xq);
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc += f16_to_f32(load_u16(wp + 2 * i)) * load_f32(xp + 4 * i);
    return acc;
}

float dot_bf16(const void* w, const void* xq, int64_t n) {
    const uint8_t* wp = static_cast<const uint8_t*>(w);
    const uint8_t* xp = static_cast<const uint8_t*>(xq);
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc += bf16_to_f32(load_u16(wp + 2 * i)) * load_f32(xp + 4 * i);
    return acc;
}

float dot_q8_0(const void* w, const void* xq, int64_t n) {
    const uint8_t* wp = static_cast<const uint8_t*>(w);
    const uint8_t* xp = static_cast<const uint8_t*>(xq);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 32; ++b, wp += sizeof(BlockQ8_0), xp += sizeof(BlockQ8_0Act)) {
        const int8_t* wq = reinterpret_cast<const int8_t*>(wp + 2);
        const int8_t* aq = reinterpret_cast<const int8_t*>(xp + 4);
        int32_t isum = 0;
        for (int i = 0; i < 32; ++i) isum += (int32_t)wq[i] * (int32_t)aq[i];
        acc += (f16_to_f32(load_u16(wp)) * load_f32(xp)) * (float)isum;
    }
    return acc;
}

float dot_q2_k(const void* w, const void* xq, int64_t n) {
    const uint8_t* wp = static_cast<const uint8_t*>(w);
    const uint8_t* xp = static_cast<const uint8_t*>(xq);
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / QK; ++b, wp += sizeof(BlockQ2K), xp += sizeof(BlockQ8K)) {
        const BlockQ2K* x = reinterpret_cast<const BlockQ2K*>(wp);
        const int8_t* q8 = reinterpret_cast<const int8_t*>(xp + 4);
        const uint8_t* bs = xp + 260;
        int32_t summs = 0;
        for (int j = 0; j < 16; ++j) summs += (int32_t)(int16_t)load_u16(bs + 2 * j) * (x->scales[j] >> 4);
        const float yd = load_f32(xp);
        const float dall = yd * f16_to_f32(load_u16(&x->d));
        const float dmin = yd * f16_to_f32(load_u16(&x->dmin));
        int32_t isum = 0;
        for (int h = 0; h < 2; ++h) {
            const uint8_t* q2 = x->qs + 32 * h;
            for (int j = 0; j < 4; ++j) {
                for (int half = 0; half < 2; ++half) {
                    int32_t s = 0;
                    for (int l = 16 * half; l < 16 * half + 16; ++l) s += (int32_t)q8[l] * ((q2[l] >> (2 * j)) & 3);
                    isum += (x->scales[8 * h + 2 * j + half] & 15) * s;
                }
                q8 += 32;
            }
        }
        sumf += dall * (float)isum - dmin * (float)summs;
    }
    return sumf;
}

float dot_q4_k(const void* w, const void* xq, int64_t n) {
    const uint8_t* wp = static_cast<const uint8_t*>(w);
    const uint8_t* xp = static_cast<const uint8_t*>(xq);
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / QK; ++b, wp += sizeof(BlockQ4K), xp += sizeof(BlockQ8K)) {
        const BlockQ4K* x = reinterpret_cast<const BlockQ4K*>(wp);
        const int8_t* q8 = reinterpret_cast<const int8_t*>(xp + 4);
        uint8_t sc[8];
        const int32_t summs = q4k_scales_and_min_sum(x, xp, sc);
        int32_t isum = 0;
        for (int c = 0; c < 4; ++c) {
            const uint8_t* q = x->qs + 32 * c;
            int32_t lo = 0, hi = 0;
            for (int l = 0; l < 32; ++l) {
                lo += (int32_t)q8[64 * c + l] * (q[l] & 15);
                hi += (int32_t)q8[64 * c + 32 + l] * (q[l] >> 4);
            }
            isum += sc[2 * c] * lo + sc[2 * c + 1] * hi;
        }
        sumf += q4k_block_value(x, xp, isum, summs);
    }
    return sumf;
}

float dot_iq2_xxs(const void* w, const void* xq, int64_t n) {
    const uint8_t* wp = static_cast<const uint8_t*>(w);
    const uint8_t* xp = static_cast<const uint8_t*>(xq);
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / QK; ++b, wp += sizeof(BlockIQ2XXS), xp += sizeof(BlockQ8K)) {
        const float d = f16_to_f32(load_u16(wp)) * load_f32(xp);
        const uint8_t* qs = wp + 2;
        const int8_t* q8 = reinterpret_cast<const int8_t*>(xp + 4);
        int32_t bsum = 0;
        for (int ib = 0; ib < 8; ++ib) {
            const uint32_t a = load_u32(qs + 8 * ib);
            const uint32_t s = load_u32(qs + 8 * ib + 4);
            int32_t sumi = 0;
            for (int l = 0; l < 4; ++l) {
                const uint64_t g = kIq2xxsGrid[(a >> (8 * l)) & 255];
                const uint8_t signs = kIq2Ksigns[(s >> (7 * l)) & 127];
                for (int j = 0; j < 8; ++j) {
                    const int32_t v = (int32_t)((g >> (8 * j)) & 255);
                    sumi += ((signs >> j) & 1 ? -v : v) * (int32_t)q8[8 * l + j];
                }
            }
            bsum += sumi * (int32_t)(2 * (s >> 28) + 1);
            q8 += 32;
        }
        sumf += d * (float)bsum;
    }
    return 0.125f * sumf;
}

const DotKernels kScalar{dot_f32,  dot_f16, dot_bf16, dot_q8_0, dot_q2_k, dot_q4_k, dot_iq2_xxs,
                         nullptr, nullptr, nullptr, nullptr};

}  // namespace

const DotKernels& scalar_kernels() { return kScalar; }

}  // namespace ds4::quant
