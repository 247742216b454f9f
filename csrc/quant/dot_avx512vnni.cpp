// AVX-512 + VNNI row-dot kernels: the table of dot_avx512_common.inc built with -mavx512vnni, so
// the integer steps use vpdpbusd (Q8_0) and vpdpwssd (Q2_K, IQ2_XXS, multi-activation Q4_K), and
// Q8_0 gathers its group scales. Every int32 block sum and every float operation is the one of the
// plain AVX-512 table: results are bit-identical to it. (IQ2_XXS with the AVX2 block's inserted
// grid rows instead of gathers measured slower here: matvec 7.0 vs 8.1 GB/s.)
#include "quant/avx512_intrinsics.h"

#include <cstring>

#include "quant/dot_kernels.h"
#include "quant/formats.h"
#include "quant/iq2xxs_codes.h"
#include "quant/iq2xxs_tables.h"

namespace ds4::quant {

namespace {
#include "quant/dot_avx512_common.inc"

// ---- IQ2_XXS with VBMI byte shuffles instead of gathers ----------------------------------------
// Every byte of the IQ2_XXS grid is 8, 25 or 43, so a grid row is eight 2-bit codes (16 bits,
// iq2xxs_codes.h). Per 256-weight block, with the 64 bytes of qs in one register (qword ib = grid
// index dword, sign/scale dword of sub-block ib):
//  * codes: every byte of qs indexes the low-code and high-code byte tables (two 128-entry vpermi2b
//    each, bit 7 picks; the bytes of the sign words look up garbage that is never used);
//  * per 64 weights (sub-blocks 2p, 2p+1: eight groups) one vpermi2b puts group g's low and high
//    code bytes into bytes 0 and 1 of qword g, vpmultishiftqb moves code j into the low bits of
//    byte j, and vpermb maps the code (its low 2 bits) to the grid byte;
//  * signs: the eight sign words side by side (vpermd), vpmultishiftqb spreads their 7-bit fields
//    to bytes, a 128-entry vpermi2b maps them to the kIq2Ksigns sign bytes: the 256 bit masks.
// This replaces four 8-lane gathers per block (slow on Zen 4 and Ice Lake); the products and int32
// sums are those of Iq2BlockAvx512, so the block sums, and with them the results, are unchanged.

// Per-block constants of Iq2BlockVbmi, loaded from memory (cheaper than rebuilding them per block).
struct alignas(64) Iq2VbmiConsts {
    uint8_t spread[4][64];      // vpermi2b (lo, hi): qword g of vector p <- lo, hi code of group 8p + g
    uint16_t scale_sel[4][32];  // vpermw index: scale of sub-block 2p (low half), 2p+1 (high half)
    uint32_t sign_words[16];    // vpermd index: the eight sign/scale dwords (odd dwords of qs)
    constexpr Iq2VbmiConsts() : spread(), scale_sel(), sign_words() {
        for (int p = 0; p < 4; ++p) {
            for (int i = 0; i < 64; ++i) {
                const int g = i / 8, at = 8 * (2 * p + g / 4) + g % 4;  // group's index byte in qs
                spread[p][i] = (uint8_t)(i % 8 == 0 ? at : i % 8 == 1 ? 64 + at : 0);
            }
            for (int w = 0; w < 32; ++w) scale_sel[p][w] = (uint16_t)(w < 16 ? 4 * p : 4 * p + 2);
        }
        for (int i = 0; i < 16; ++i) sign_words[i] = (uint32_t)(2 * (i % 8) + 1);
    }
};
alignas(64) static constexpr Iq2VbmiConsts kIq2Vbmi{};

static inline __m512i ld64(const void* p) { return _mm512_load_si512(p); }

// 64 byte lookups in a 256-byte table (two 128-entry vpermi2b, index bit 7 picks).
static inline __m512i lookup256(const uint8_t* tab, __m512i idx, __mmask64 bit7) {
    const __m512i a = _mm512_permutex2var_epi8(ld64(tab), idx, ld64(tab + 64));
    const __m512i b = _mm512_permutex2var_epi8(ld64(tab + 128), idx, ld64(tab + 192));
    return _mm512_mask_blend_epi8(bit7, a, b);
}

struct Iq2BlockVbmi {
    template <int NA>
    static inline void block(const uint8_t* qs, const uint8_t* q8, int64_t xs, __m256i* out) {
        const __m512i raw = _mm512_loadu_si512(qs);
        const __mmask64 bit7 = _mm512_movepi8_mask(raw);
        const __m512i lo = lookup256(kIq2GridCodes.lo, raw, bit7), hi = lookup256(kIq2GridCodes.hi, raw, bit7);
        // the eight sign/scale words in the low 256 bits, sub-block order
        const __m512i sw = _mm512_permutexvar_epi32(ld64(kIq2Vbmi.sign_words), raw);
        // Signs: the four 7-bit fields of each sign word to bytes (vpmultishiftqb at bits 0, 7, 14,
        // 21 of each dword; bit 7 of each byte is ignored by the 128-entry vpermi2b), then the sign
        // byte of each group. The 32 sign bytes in (sub-block, group) order are the bit masks of the
        // 256 elements: qword p = elements 64p .. 64p+63.
        const __m512i sfield = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x352E2720150E0700LL), sw);
        const __m512i sbytes = _mm512_permutex2var_epi8(ld64(kIq2Ksigns), sfield, ld64(kIq2Ksigns + 64));
        alignas(32) uint64_t masks[4];
        _mm256_store_si256(reinterpret_cast<__m256i*>(masks), _mm512_castsi512_si256(sbytes));
        // (2*ls + 1) per sub-block as int32 (word 2 ib holds sub-block ib's): bit 0 of sw >> 27 is
        // bit 27 of sw, replaced by the + 1.
        const __m512i scales = _mm512_or_si512(_mm512_srli_epi32(sw, 27), _mm512_set1_epi32(1));
        // byte j of a qword <- bits 2j.. of the qword (only the low two bits are used by vpermb)
        const __m512i shifts = _mm512_set1_epi64(0x0E0C0A0806040200LL);
        const __m512i lut = _mm512_set1_epi32(0x002B1908);  // code 0, 1, 2 -> 8, 25, 43
        __m512i acc[NA];
        for (int k = 0; k < NA; ++k) acc[k] = _mm512_setzero_si512();
        for (int p = 0; p < 4; ++p) {
            const __m512i spread = _mm512_permutex2var_epi8(lo, ld64(kIq2Vbmi.spread[p]), hi);
            const __m512i grid = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(shifts, spread), lut);
            const __m512i scale = _mm512_permutexvar_epi16(ld64(kIq2Vbmi.scale_sel[p]), scales);
            const __mmask64 neg = _cvtu64_mask64(masks[p]);
            for (int k = 0; k < NA; ++k) {
                const __m512i a = _mm512_loadu_si512(q8 + k * xs + 64 * p);
                const __m512i a8 = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
                acc[k] = x86_madd_acc512(acc[k], _mm512_maddubs_epi16(grid, a8), scale);
            }
        }
        for (int k = 0; k < NA; ++k)
            out[k] = _mm256_add_epi32(_mm512_castsi512_si256(acc[k]), _mm512_extracti64x4_epi64(acc[k], 1));
    }
};

// ---- Q8_0 decode with the activation prepared once per matvec -----------------------------------
// x86_q8_0_n forms each block's sum_i w_i x_i with vpdpbusd as (x + 128) * w minus a weight-side
// correction 128 * sum w that it recomputes for every row and block (two extra operations per
// 32 weights) and gathers the activation scales per group of eight blocks. With one activation
// shared by all rows (matvec), the roles swap: the weight becomes the u8 operand (w ^ 0x80 =
// w + 128) and the correction 128 * sum x depends on the activation only, so it is formed once:
//   sum_i (w_i + 128) x_i - 128 sum_i x_i = sum_i w_i x_i   (exact int32; |lane| <= 4*255*128).
// The prepared activation: nb blocks of 32 codes, then nb float scales, then nb int32 corrections.
// Every block sum and float operation is that of x86_q8_0_n<1>: results are bit-identical.
int64_t q8_0_prep_bytes(int64_t n) { return (n / 32) * (32 + 4 + 4); }

void q8_0_prepare(const void* xq, int64_t n, void* prep) {
    const int64_t nb = n / 32;
    const uint8_t* x = static_cast<const uint8_t*>(xq);
    uint8_t* codes = static_cast<uint8_t*>(prep);
    float* scales = reinterpret_cast<float*>(codes + nb * 32);
    int32_t* corr = reinterpret_cast<int32_t*>(codes + nb * 36);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* xb = x + b * sizeof(BlockQ8_0Act);
        std::memcpy(codes + 32 * b, xb + 4, 32);
        scales[b] = load_f32(xb);
        int32_t sum = 0;
        for (int i = 0; i < 32; ++i) sum += (int8_t)xb[4 + i];
        corr[b] = 128 * sum;
    }
}

// sum over lanes = (sum_i (w_i + 128) x_i) for one block
static inline __m256i q8_0_prep_part(const uint8_t* wb, const uint8_t* xc) {
    const __m256i wu = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 2)),
                                        _mm256_set1_epi8((char)0x80));
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), wu, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xc)));
}

float q8_0_dot_prepared(const void* w, const void* prep, int64_t n) {
    const int64_t nb = n / 32;
    const uint8_t* wp = static_cast<const uint8_t*>(w);
    const uint8_t* codes = static_cast<const uint8_t*>(prep);
    const float* xd = reinterpret_cast<const float*>(codes + nb * 32);
    const int32_t* corr = reinterpret_cast<const int32_t*>(codes + nb * 36);
    __m256 acc = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        __m256i part[8];
        for (int j = 0; j < 8; ++j) part[j] = q8_0_prep_part(wp + (b + j) * 34, codes + (b + j) * 32);
        const __m256i wofs = _mm256_setr_epi32(0, 34, 68, 102, 136, 170, 204, 238);
        const __m256 wdv = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(
            _mm256_i32gather_epi32(reinterpret_cast<const int*>(wp + b * 34), wofs, 1)));
        const __m256i isum = _mm256_sub_epi32(hsum8_i32x8(part),
                                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr + b)));
        const __m256 scale = _mm256_mul_ps(wdv, _mm256_loadu_ps(xd + b));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(isum)));
    }
    float sum = hsum_f32x8(acc);
    for (; b < nb; ++b) {
        const uint8_t* wb = wp + b * 34;
        const int32_t isum = hsum_i32x8(q8_0_prep_part(wb, codes + b * 32)) - corr[b];
        sum += (_cvtsh_ss(load_u16(wb)) * xd[b]) * (float)isum;
    }
    return sum;
}

DotKernels make_avx512vnni_table() {
    DotKernels k = make_avx512_table();
    // Q4_K: one activation keeps the AVX2 build (matvec 4096x4096: 19.5 GB/s vs 16.2 for this
    // build); several use this build's vpdpwssd form (matmul b=512: 161 vs 149 GFLOP/s). Both
    // form the scalar int32 block sums and float expression, so they agree bit for bit.
    k.q4_k_n = DS4_X86_MULTI(x86_q4_k_n);
    k.q8_0_prep = PreparedDot{q8_0_prep_bytes, q8_0_prepare, q8_0_dot_prepared};
    k.iq2_xxs = x86_single<x86_iq2_xxs_n<Iq2BlockVbmi, 1>>;
    k.iq2_xxs_n = x86_multi<x86_iq2_xxs_n<Iq2BlockVbmi, 1>, x86_iq2_xxs_n<Iq2BlockVbmi, 2>,
                            x86_iq2_xxs_n<Iq2BlockVbmi, 3>, x86_iq2_xxs_n<Iq2BlockVbmi, 4>>;
    k.iq2_xxs_rows = x86_iq2_xxs_rows<Iq2BlockVbmi>;
    return k;
}
}  // namespace

const DotKernels& avx512vnni_kernels() {
    static const DotKernels k = make_avx512vnni_table();
    return k;
}

}  // namespace ds4::quant
