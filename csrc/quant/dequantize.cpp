// Exact dequantisation of whole blocks (docs/model.md 4.1). The float expression order follows ggml's
// reference dequantisers so results match gguf-py's independent implementation.
#include <string>

#include "common/errors.h"
#include "quant/formats.h"
#include "quant/iq2xxs_tables.h"
#include "quant/kernels.h"

namespace ds4 {

using namespace quant;

namespace {

void deq_q8_0(const uint8_t* src, float* y, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += sizeof(BlockQ8_0), y += 32) {
        const float d = f16_to_f32(load_u16(src));
        const int8_t* qs = reinterpret_cast<const int8_t*>(src + 2);
        for (int i = 0; i < 32; ++i) y[i] = d * (float)qs[i];
    }
}

void deq_q8_k(const uint8_t* src, float* y, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += sizeof(BlockQ8K), y += QK) {
        const float d = load_f32(src);
        const int8_t* qs = reinterpret_cast<const int8_t*>(src + 4);
        for (int i = 0; i < QK; ++i) y[i] = d * (float)qs[i];
    }
}

void deq_q2_k(const uint8_t* src, float* y, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += sizeof(BlockQ2K)) {
        const BlockQ2K* x = reinterpret_cast<const BlockQ2K*>(src);
        const float d = f16_to_f32(load_u16(&x->d));
        const float dmin = f16_to_f32(load_u16(&x->dmin));
        for (int h = 0; h < 2; ++h) {
            const uint8_t* q = x->qs + 32 * h;
            for (int j = 0; j < 4; ++j) {
                for (int half = 0; half < 2; ++half) {
                    const uint8_t sc = x->scales[8 * h + 2 * j + half];
                    const float dl = d * (float)(sc & 15);
                    const float ml = dmin * (float)(sc >> 4);
                    for (int l = 16 * half; l < 16 * half + 16; ++l) *y++ = dl * (float)((q[l] >> (2 * j)) & 3) - ml;
                }
            }
        }
    }
}

void deq_q4_k(const uint8_t* src, float* y, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += sizeof(BlockQ4K)) {
        const BlockQ4K* x = reinterpret_cast<const BlockQ4K*>(src);
        const float d = f16_to_f32(load_u16(&x->d));
        const float dmin = f16_to_f32(load_u16(&x->dmin));
        for (int c = 0; c < 4; ++c) {
            uint8_t sc0, m0, sc1, m1;
            q4k_scale_min(x->scales, 2 * c, &sc0, &m0);
            q4k_scale_min(x->scales, 2 * c + 1, &sc1, &m1);
            const float d0 = d * (float)sc0, mm0 = dmin * (float)m0;
            const float d1 = d * (float)sc1, mm1 = dmin * (float)m1;
            const uint8_t* q = x->qs + 32 * c;
            for (int l = 0; l < 32; ++l) *y++ = d0 * (float)(q[l] & 15) - mm0;
            for (int l = 0; l < 32; ++l) *y++ = d1 * (float)(q[l] >> 4) - mm1;
        }
    }
}

void deq_iq2_xxs(const uint8_t* src, float* y, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += sizeof(BlockIQ2XXS)) {
        const float d = f16_to_f32(load_u16(src));
        const uint8_t* qs = src + 2;
        for (int ib = 0; ib < 8; ++ib) {
            const uint32_t a = load_u32(qs + 8 * ib);
            const uint32_t s = load_u32(qs + 8 * ib + 4);
            const float db = d * (0.5f + (float)(s >> 28)) * 0.25f;
            for (int l = 0; l < 4; ++l) {
                const uint64_t g = kIq2xxsGrid[(a >> (8 * l)) & 255];
                const uint8_t signs = kIq2Ksigns[(s >> (7 * l)) & 127];
                for (int j = 0; j < 8; ++j) {
                    const float v = (float)((g >> (8 * j)) & 255);
                    *y++ = db * v * ((signs >> j) & 1 ? -1.0f : 1.0f);
                }
            }
        }
    }
}

}  // namespace

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
    const TypeTraits& tr = type_traits(t);
    row_bytes(t, n);  // validates n against the block size
    const uint8_t* s = static_cast<const uint8_t*>(src);
    const int64_t nb = n / tr.block_elems;
    switch (t) {
        case GgmlType::F32:
            for (int64_t i = 0; i < n; ++i) dst[i] = load_f32(s + 4 * i);
            return;
        case GgmlType::F16:
            for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_u16(s + 2 * i));
            return;
        case GgmlType::BF16:
            for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(s + 2 * i));
            return;
        case GgmlType::Q8_0: deq_q8_0(s, dst, nb); return;
        case GgmlType::Q8_K: deq_q8_k(s, dst, nb); return;
        case GgmlType::Q2_K: deq_q2_k(s, dst, nb); return;
        case GgmlType::Q4_K: deq_q4_k(s, dst, nb); return;
        case GgmlType::IQ2_XXS: deq_iq2_xxs(s, dst, nb); return;
        default: break;
    }
    fail(ErrorKind::Unsupported, std::string("dequantize_row: type ") + tr.name + " holds no float weights");
}

}  // namespace ds4
