// AVX-512 (F/BW/VL/DQ) row-dot kernels. Q8_0/Q2_K share the AVX2 formulation (compiled here with
// AVX-512 flags), Q4_K uses the AVX2 build itself; IQ2_XXS works on pairs of sub-blocks in 512-bit vectors (gathered grid rows,
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

// Same integer result as Iq2BlockAvx2 (the partial lanes differ, their sum does not).
struct Iq2BlockAvx512 {
    template <int NA>
    static inline void block(const uint8_t* qs, const uint8_t* q8, int64_t xs, __m256i* out) {
        __m256i gidx, swords;
        iq2xxs_split_words(qs, &gidx, &swords);
        alignas(32) uint64_t masks[4];  // sign bits of sub-blocks 2p and 2p+1
        alignas(32) uint32_t aidx[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(masks), iq2xxs_sign_masks(swords));
        _mm256_store_si256(reinterpret_cast<__m256i*>(aidx), gidx);
        // (2*ls + 1) per sub-block as int32; vpermw spreads sub-block 2p's (word 4p) over the low
        // 256 bits and 2p+1's (word 4p+2) over the high 256 bits.
        const __m512i scales = _mm512_zextsi256_si512(
            _mm256_add_epi32(_mm256_slli_epi32(_mm256_srli_epi32(swords, 28), 1), _mm256_set1_epi32(1)));
        __m512i acc[NA];
        for (int k = 0; k < NA; ++k) acc[k] = _mm512_setzero_si512();
        for (int p = 0; p < 4; ++p) {
            const __m512i sel = _mm512_inserti64x4(_mm512_zextsi256_si512(_mm256_set1_epi16((short)(4 * p))),
                                                   _mm256_set1_epi16((short)(4 * p + 2)), 1);
            const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(aidx + 2 * p)));
            const __m512i grid = _mm512_mask_i32gather_epi64(_mm512_setzero_si512(), 0xFF, idx,
                                                             reinterpret_cast<const long long*>(kIq2xxsGrid), 8);
            const __m512i scale = _mm512_permutexvar_epi16(sel, scales);
            const __mmask64 neg = _cvtu64_mask64(masks[p]);
            for (int k = 0; k < NA; ++k) {
                const __m512i a = _mm512_loadu_si512(q8 + k * xs + 64 * p);
                const __m512i a8 = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
                acc[k] = _mm512_add_epi32(acc[k], _mm512_madd_epi16(_mm512_maddubs_epi16(grid, a8), scale));
            }
        }
        for (int k = 0; k < NA; ++k)
            out[k] = _mm256_add_epi32(_mm512_castsi512_si256(acc[k]), _mm512_extracti64x4_epi64(acc[k], 1));
    }
};

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

// Q4_K keeps the AVX2-compiled kernel: the same source built with AVX-512 flags measured ~35%
// slower here (EVEX encodings of the nibble unpacking), and both are bit-identical to scalar.
DotKernels make_avx512_table() {
    DotKernels k = avx2_kernels();
    k.f32 = x86_dot_f32;
    k.f16 = avx512_dot_half<false>;
    k.bf16 = avx512_dot_half<true>;
    k.iq2_xxs = x86_single<x86_iq2_xxs_n<Iq2BlockAvx512, 1>>;
    k.iq2_xxs_n = x86_multi<x86_iq2_xxs_n<Iq2BlockAvx512, 1>, x86_iq2_xxs_n<Iq2BlockAvx512, 2>,
                            x86_iq2_xxs_n<Iq2BlockAvx512, 3>, x86_iq2_xxs_n<Iq2BlockAvx512, 4>>;
    k.q8_0 = DS4_X86_SINGLE(x86_q8_0_n);
    k.q8_0_n = DS4_X86_MULTI(x86_q8_0_n);
    k.q2_k = DS4_X86_SINGLE(x86_q2_k_n);
    k.q2_k_n = DS4_X86_MULTI(x86_q2_k_n);
    return k;
}
}  // namespace

const DotKernels& avx512_kernels() {
    static const DotKernels k = make_avx512_table();
    return k;
}

}  // namespace ds4::quant
