// AVX-512 (F/BW/VL/DQ) row-dot kernels. Q2_K/Q4_K share the AVX2 formulation (compiled here with
// AVX-512 flags); IQ2_XXS works on pairs of sub-blocks in 512-bit vectors (gathered grid rows,
// sign masks applied as k-masks); F16/BF16 use 16-wide vectors.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
// GCC 12's AVX-512 headers trip -W(maybe-)uninitialized on their own _mm512_undefined_* idiom
// (GCC PR 105593, fixed in 13); nothing in this file reads an uninitialised value.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include "quant/dot_kernels.h"
#include "quant/formats.h"
#include "quant/iq2xxs_tables.h"

namespace ds4::quant {

namespace {
#include "quant/dot_x86_common.inc"

// Same integer result as iq2xxs_block_avx2 (the partial lanes differ, their sum does not).
static inline __m256i iq2xxs_block_avx512(const uint8_t* qs, const uint8_t* q8) {
    __m256i gidx, swords;
    iq2xxs_split_words(qs, &gidx, &swords);
    alignas(32) uint64_t masks[4];  // sign bits of sub-blocks 2p and 2p+1
    alignas(32) uint32_t aidx[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(masks), iq2xxs_sign_masks(swords));
    _mm256_store_si256(reinterpret_cast<__m256i*>(aidx), gidx);
    // (2*ls + 1) per sub-block as int32; vpermw spreads sub-block 2p's (word 4p) over the low 256
    // bits and 2p+1's (word 4p+2) over the high 256 bits.
    const __m512i scales = _mm512_zextsi256_si512(
        _mm256_add_epi32(_mm256_slli_epi32(_mm256_srli_epi32(swords, 28), 1), _mm256_set1_epi32(1)));
    __m512i acc = _mm512_setzero_si512();
    for (int p = 0; p < 4; ++p) {
        const __m512i sel = _mm512_inserti64x4(_mm512_zextsi256_si512(_mm256_set1_epi16((short)(4 * p))),
                                               _mm256_set1_epi16((short)(4 * p + 2)), 1);
        const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(aidx + 2 * p)));
        const __m512i grid = _mm512_mask_i32gather_epi64(_mm512_setzero_si512(), 0xFF, idx,
                                                           reinterpret_cast<const long long*>(kIq2xxsGrid), 8);
        const __m512i a = _mm512_loadu_si512(q8 + 64 * p);
        const __m512i a8 = _mm512_mask_sub_epi8(a, _cvtu64_mask64(masks[p]), _mm512_setzero_si512(), a);
        const __m512i prod = _mm512_maddubs_epi16(grid, a8);
        acc = _mm512_add_epi32(acc, _mm512_madd_epi16(prod, _mm512_permutexvar_epi16(sel, scales)));
    }
    return _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
}

static inline float hsum_f32x16(__m512 v) {
    return hsum_f32x8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

template <bool kBf16>
static float avx512_dot_half(const void* w, const void* xq, int64_t n) {
    const uint8_t* wp = static_cast<const uint8_t*>(w);
    const float* x = static_cast<const float*>(xq);
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    auto load16 = [](const uint8_t* p) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        if (kBf16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        return _mm512_cvtph_ps(h);
    };
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        for (int k = 0; k < 4; ++k) {
            acc[k] = _mm512_fmadd_ps(load16(wp + 2 * (i + 16 * k)), _mm512_loadu_ps(x + i + 16 * k), acc[k]);
        }
    }
    for (; i + 16 <= n; i += 16) acc[0] = _mm512_fmadd_ps(load16(wp + 2 * i), _mm512_loadu_ps(x + i), acc[0]);
    float sum = hsum_f32x16(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
    for (; i < n; ++i) {
        const uint16_t h = load_u16(wp + 2 * i);
        sum += (kBf16 ? bf16_to_f32(h) : _cvtsh_ss(h)) * load_f32(x + i);
    }
    return sum;
}

const DotKernels kAvx512{x86_dot_f32, avx512_dot_half<false>, avx512_dot_half<true>, x86_dot_q8_0,
                         x86_dot_q2_k, x86_dot_q4_k, x86_dot_iq2_xxs_t<iq2xxs_block_avx512>};
}  // namespace

const DotKernels& avx512_kernels() { return kAvx512; }

}  // namespace ds4::quant
