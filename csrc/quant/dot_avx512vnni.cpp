// AVX-512 + VNNI row-dot kernels: the table of dot_avx512_common.inc built with -mavx512vnni, so
// the integer steps use vpdpbusd (Q8_0) and vpdpwssd (Q2_K, IQ2_XXS, multi-activation Q4_K), and
// Q8_0 gathers its group scales. Every int32 block sum and every float operation is the one of the
// plain AVX-512 table: results are bit-identical to it. (IQ2_XXS with the AVX2 block's inserted
// grid rows instead of gathers measured slower here: matvec 7.0 vs 8.1 GB/s.)
#include "quant/avx512_intrinsics.h"

#include <cstring>

#include "common/decode_switches.h"  // prefetch distances (q8_0_dot_vec, dot_half_tile.inc)
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

#include "quant/iq2xxs_rows_vbmi.inc"

// ---- Q8_0 with the activations prepared once per matvec / matmul ------------------------------
// x86_q8_0_n forms each block's sum_i w_i x_i with vpdpbusd as (x + 128) * w minus a weight-side
// correction 128 * sum w that it recomputes for every row and block, and reduces every block's
// eight int32 lanes per activation (hsum8). With the activations shared by all rows, both costs
// move to a once-per-call preparation:
//   * the weight becomes the u8 operand (w ^ 0x80 = w + 128) and the correction -128 * sum x
//     depends on the activation only:
//       sum_i (w_i + 128) x_i - 128 sum_i x_i = sum_i w_i x_i   (exact int32; |lane| <= 8*4*255*128);
//   * the activation codes are stored transposed per chunk of 16 blocks: vector v (64 bytes),
//     lane L = codes 4v..4v+3 of block 16c + L. The kernel transposes the weight chunk the same
//     way in registers (once per row, shared by every activation), so one zmm vpdpbusd per
//     activation per 4 codes of 16 blocks leaves lane L holding block L's whole sum: no
//     per-activation reduction at all. A remaining group of 8 blocks uses the 8-lane (ymm) form,
//     fewer than 8 leftover blocks stay contiguous.
// Prepared activation (q8_0_prep_bytes(n) = 40 * n/32 bytes): the codes as above, then nb float
// scales, then nb int32 corrections -128 * sum(codes of the block), both in block order.
// Every int32 block sum and every float operation is that of x86_q8_0_n<1> (lane j of the float
// accumulator takes blocks 8g + j, then hsum_f32x8, then the leftover blocks in order): results
// are bit-identical to it, for any number of activations. Decode (matvec, one activation) runs
// the same kernel: CPU time per decode step as with the earlier contiguous-layout kernel (both
// stream the weights at the read bandwidth); from 2 activations on it is cheaper than
// x86_q8_0_n, from 4 up to 15 than the GEMM (docs/kernels.md, "Q8_0 small batches").
int64_t q8_0_prep_bytes(int64_t n) { return (n / 32) * (32 + 4 + 4); }

void q8_0_prepare(const void* xq, int64_t n, void* prep) {
    const int64_t nb = n / 32, n16 = nb / 16 * 16, n8 = nb / 8 * 8;
    const uint8_t* x = static_cast<const uint8_t*>(xq);
    uint8_t* codes = static_cast<uint8_t*>(prep);
    float* scales = reinterpret_cast<float*>(codes + nb * 32);
    int32_t* corr = reinterpret_cast<int32_t*>(codes + nb * 36);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* xb = x + b * sizeof(BlockQ8_0Act);
        // Chunk of 16 (or the group of 8 after the chunks): dword v of block b goes to lane b % width.
        const int64_t width = b < n16 ? 16 : b < n8 ? 8 : 0;
        if (width) {
            const int64_t base = b < n16 ? b / 16 * 16 : n16;
            for (int v = 0; v < 8; ++v) std::memcpy(codes + base * 32 + (v * width + (b - base)) * 4, xb + 4 + 4 * v, 4);
        } else {
            std::memcpy(codes + 32 * b, xb + 4, 32);
        }
        scales[b] = load_f32(xb);
        int32_t sum = 0;
        for (int i = 0; i < 32; ++i) sum += (int8_t)xb[4 + i];
        corr[b] = -128 * sum;
    }
}

static inline __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// In-lane 4x4 dword transpose of a[0..3] (every 128-bit lane on its own): out[q] lane element i
// = a[i] element q. Then + 128 on every byte (xor 0x80): the u8 operand of vpdpbusd.
static inline void transpose4_flip(const __m512i* a, __m512i* out) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m512i t0 = _mm512_unpacklo_epi32(a[0], a[1]), t1 = _mm512_unpackhi_epi32(a[0], a[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(a[2], a[3]), t3 = _mm512_unpackhi_epi32(a[2], a[3]);
    out[0] = _mm512_xor_si512(_mm512_unpacklo_epi64(t0, t2), flip);
    out[1] = _mm512_xor_si512(_mm512_unpackhi_epi64(t0, t2), flip);
    out[2] = _mm512_xor_si512(_mm512_unpacklo_epi64(t1, t3), flip);
    out[3] = _mm512_xor_si512(_mm512_unpackhi_epi64(t1, t3), flip);
}

static inline void transpose4_flip(const __m256i* a, __m256i* out) {
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
    out[0] = _mm256_xor_si256(_mm256_unpacklo_epi64(t0, t2), flip);
    out[1] = _mm256_xor_si256(_mm256_unpackhi_epi64(t0, t2), flip);
    out[2] = _mm256_xor_si256(_mm256_unpacklo_epi64(t1, t3), flip);
    out[3] = _mm256_xor_si256(_mm256_unpackhi_epi64(t1, t3), flip);
}

// The 16 weight blocks at wb as eight u8 vectors in the prepared layout (vector v, lane L =
// codes 4v..4v+3 of block L, + 128). 128-bit lane l of input i (i < 4) is half h of block 4l + i;
// the in-lane transpose puts that block's dwords 4h..4h+3 into lane 4l + i of four vectors.
static inline void q8_0_weights16(const uint8_t* wb, __m512i* wv) {
    for (int h = 0; h < 2; ++h) {
        __m512i a[4];
        for (int i = 0; i < 4; ++i) {
            const uint8_t* p = wb + i * 34 + 2 + 16 * h;
            __m512i v = _mm512_castsi128_si512(load128(p));
            v = _mm512_inserti32x4(v, load128(p + 4 * 34), 1);
            v = _mm512_inserti32x4(v, load128(p + 8 * 34), 2);
            a[i] = _mm512_inserti32x4(v, load128(p + 12 * 34), 3);
        }
        transpose4_flip(a, wv + 4 * h);
    }
}

// The same for 8 blocks in ymm (lane L < 8).
static inline void q8_0_weights8(const uint8_t* wb, __m256i* wv) {
    for (int h = 0; h < 2; ++h) {
        __m256i a[4];
        for (int i = 0; i < 4; ++i) {
            const uint8_t* p = wb + i * 34 + 2 + 16 * h;
            a[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(load128(p)), load128(p + 4 * 34), 1);
        }
        transpose4_flip(a, wv + 4 * h);
    }
}

// f16 scales of 8 consecutive blocks (4 bytes gathered at each block start: d plus two codes,
// inside the block; vpmovdw keeps d). Once per row at most (the trailing group of 8).
static inline __m256 q8_0_scales8(const uint8_t* wb) {
    const __m256i ofs = _mm256_setr_epi32(0, 34, 68, 102, 136, 170, 204, 238);
    return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_i32gather_epi32(reinterpret_cast<const int*>(wb), ofs, 1)));
}

// f16 scales of 16 consecutive blocks: four scales per 64-bit word assembled in general
// registers, two words per 128 bits. (A 16-lane gather of them took ~30 % of the one-activation
// kernel's time on Zen 4; the integer pipes doing this are otherwise idle in these kernels.)
static inline __m512 q8_0_scales16(const uint8_t* wb) {
    uint64_t q[4];
    for (int h = 0; h < 4; ++h) {
        const uint8_t* s = wb + 4 * h * 34;
        q[h] = (uint64_t)load_u16(s) | (uint64_t)load_u16(s + 34) << 16 | (uint64_t)load_u16(s + 68) << 32 |
               (uint64_t)load_u16(s + 102) << 48;
    }
    const __m128i lo = _mm_insert_epi64(_mm_cvtsi64_si128((long long)q[0]), (long long)q[1], 1);
    const __m128i hi = _mm_insert_epi64(_mm_cvtsi64_si128((long long)q[2]), (long long)q[3], 1);
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

template <int NA>
static void q8_0_prepared_n(const uint8_t* wp, const uint8_t* xp, int64_t xs, int64_t n, float* out) {
    const int64_t nb = n / 32, n16 = nb / 16 * 16, n8 = nb / 8 * 8;
    const uint8_t* codes[NA];
    const float* xd[NA];
    const int32_t* corr[NA];
    for (int k = 0; k < NA; ++k) {
        codes[k] = xp + k * xs;
        xd[k] = reinterpret_cast<const float*>(codes[k] + nb * 32);
        corr[k] = reinterpret_cast<const int32_t*>(codes[k] + nb * 36);
    }
    __m256 acc[NA];
    for (int k = 0; k < NA; ++k) acc[k] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b < n16; b += 16) {
        const uint8_t* wb = wp + b * 34;
        __m512i wv[8];
        q8_0_weights16(wb, wv);
        const __m512 wd = q8_0_scales16(wb);
        for (int k = 0; k < NA; ++k) {
            const uint8_t* xc = codes[k] + b * 32;
            __m512i isum = _mm512_loadu_si512(corr[k] + b);
            for (int v = 0; v < 8; ++v) isum = _mm512_dpbusd_epi32(isum, wv[v], _mm512_loadu_si512(xc + 64 * v));
            // Lane L: block b+L's term (wd*xd)*(float)isum; blocks b..b+7 are one group of the
            // eight-lane order, b+8..b+15 the next, added in that order.
            const __m512 term = _mm512_mul_ps(_mm512_mul_ps(wd, _mm512_loadu_ps(xd[k] + b)), _mm512_cvtepi32_ps(isum));
            acc[k] = _mm256_add_ps(acc[k], _mm512_castps512_ps256(term));
            acc[k] = _mm256_add_ps(acc[k], _mm512_extractf32x8_ps(term, 1));
        }
    }
    if (b < n8) {
        const uint8_t* wb = wp + b * 34;
        __m256i wv[8];
        q8_0_weights8(wb, wv);
        const __m256 wd = q8_0_scales8(wb);
        for (int k = 0; k < NA; ++k) {
            const uint8_t* xc = codes[k] + b * 32;
            __m256i isum = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr[k] + b));
            for (int v = 0; v < 8; ++v) {
                isum = _mm256_dpbusd_epi32(isum, wv[v], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xc + 32 * v)));
            }
            const __m256 term = _mm256_mul_ps(_mm256_mul_ps(wd, _mm256_loadu_ps(xd[k] + b)), _mm256_cvtepi32_ps(isum));
            acc[k] = _mm256_add_ps(acc[k], term);
        }
        b += 8;
    }
    float sum[NA];
    for (int k = 0; k < NA; ++k) sum[k] = hsum_f32x8(acc[k]);
    for (; b < nb; ++b) {
        const uint8_t* wb = wp + b * 34;
        const __m256i wu = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 2)),
                                            _mm256_set1_epi8((char)0x80));
        const float wd = _cvtsh_ss(load_u16(wb));
        for (int k = 0; k < NA; ++k) {
            const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes[k] + b * 32));
            const int32_t isum = hsum_i32x8(_mm256_dpbusd_epi32(_mm256_setzero_si256(), wu, x)) + corr[k][b];
            sum[k] += (wd * xd[k][b]) * (float)isum;
        }
    }
    for (int k = 0; k < NA; ++k) out[k] = sum[k];
}

float q8_0_dot_prepared(const void* w, const void* prep, int64_t n) {
    float out;
    q8_0_prepared_n<1>(static_cast<const uint8_t*>(w), static_cast<const uint8_t*>(prep), 0, n, &out);
    return out;
}

void q8_0_dot_prepared_n(const void* w, const void* prep, int64_t stride, int na, int64_t n, float* out) {
    const uint8_t* wp = static_cast<const uint8_t*>(w);
    const uint8_t* xp = static_cast<const uint8_t*>(prep);
    switch (na) {
        case 1: q8_0_prepared_n<1>(wp, xp, stride, n, out); return;
        case 2: q8_0_prepared_n<2>(wp, xp, stride, n, out); return;
        case 3: q8_0_prepared_n<3>(wp, xp, stride, n, out); return;
        case 4: q8_0_prepared_n<4>(wp, xp, stride, n, out); return;
        case 5: q8_0_prepared_n<5>(wp, xp, stride, n, out); return;
        case 6: q8_0_prepared_n<6>(wp, xp, stride, n, out); return;
        case 7: q8_0_prepared_n<7>(wp, xp, stride, n, out); return;
        default: q8_0_prepared_n<8>(wp, xp, stride, n, out); return;
    }
}

// ---- Q8_0 matvec: one activation, codes in block order -----------------------------------------
// With a single activation the transposed layout above costs more than it saves: transposing a
// 16-block weight chunk takes 40 512-bit shuffles (Zen 4 runs each as two 256-bit halves) to spare
// one reduction per activation. Decode's Q8_0 matvec is as much compute- as memory-bound (the
// kernel ran at ~23 GB/s per thread in L2 against ~23 GB/s per thread of DRAM read bandwidth),
// so this form does the reverse: each weight block is one 256-bit vpdpbusd straight from memory
// against its block of prepared codes, and the eight partial vectors of a group of 8 blocks are
// reduced by one transposing add tree (hsum8_i32x8, 14 256-bit shuffles per 8 blocks) into lane
// j = block 8g + j. The correction -128 * sum(x) is added after the tree (int32 sums are exact
// in any order), then the float steps are the row kernel's: term = (wd * xd) * (float)isum in
// lane j, groups added in order, hsum_f32x8, leftover blocks in order. Bit-identical to
// q8_0_dot_prepared and x86_q8_0_n<1> (tests/test_kernels_vnni.py). docs/kernels.md.
// Prepared activation (q8_0_prep_bytes(n) bytes, the same size): nb blocks of 32 codes in block
// order, then the nb float scales, then the nb int32 corrections.
void q8_0_prepare_vec(const void* xq, int64_t n, void* prep) {
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
        corr[b] = -128 * sum;
    }
}

// Eight blocks from wb against their prepared codes xc: lane j = sum of block j's code products
// with the weight offset to u8 (w ^ 0x80 = w + 128), without the correction.
__attribute__((always_inline)) static inline __m256i q8_0_vec_group8(const uint8_t* wb, const uint8_t* xc) {
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    __m256i p[8];
    for (int j = 0; j < 8; ++j) {
        const __m256i w = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 34 * j + 2)), flip);
        p[j] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w,
                                   _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xc + 32 * j)));
    }
    // Transposing add tree (unpack, not vphaddd: fewer shuffle uops), lanes end in block order.
    __m256i s[4];
    for (int i = 0; i < 4; ++i)
        s[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2 * i], p[2 * i + 1]), _mm256_unpackhi_epi32(p[2 * i], p[2 * i + 1]));
    const __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi64(s[0], s[1]), _mm256_unpackhi_epi64(s[0], s[1]));
    const __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi64(s[2], s[3]), _mm256_unpackhi_epi64(s[2], s[3]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(t0, t1, 0x20), _mm256_permute2x128_si256(t0, t1, 0x31));
}

float q8_0_dot_vec(const void* w, const void* prep, int64_t n) {
    const int64_t nb = n / 32, n8 = nb / 8 * 8;
    const uint8_t* wp = static_cast<const uint8_t*>(w);
    const uint8_t* codes = static_cast<const uint8_t*>(prep);
    const float* xd = reinterpret_cast<const float*>(codes + nb * 32);
    const int32_t* corr = reinterpret_cast<const int32_t*>(codes + nb * 36);
    // The prefetch of the bytes `pf` ahead, 9 lines per 16 blocks (544 bytes), spread over the row
    // rather than issued as one burst per row (dot_kernels.h, PreparedDot::prefetches). Near the
    // end of a range it reaches into the next rows (another thread's, or past the matrix): a
    // prefetch never faults, and those lines are at most the distance's worth.
    const DecodeSwitches& sw = decode_switches();
    const int64_t pf = sw.q8_prefetch_inline.load(std::memory_order_relaxed)
                           ? sw.q8_prefetch.load(std::memory_order_relaxed)
                           : 0;
    __m256 acc = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 16 <= n8; b += 16) {
        const uint8_t* wb = wp + b * 34;
        if (pf > 0) {
            for (int k = 0; k < 16 * 34; k += 64) _mm_prefetch(reinterpret_cast<const char*>(wb + pf + k), _MM_HINT_T1);
        }
        const __m512 wd = q8_0_scales16(wb);
        for (int g = 0; g < 2; ++g) {
            const int64_t bg = b + 8 * g;
            const __m256i isum = _mm256_add_epi32(q8_0_vec_group8(wp + bg * 34, codes + bg * 32),
                                                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr + bg)));
            const __m256 wdg = g == 0 ? _mm512_castps512_ps256(wd) : _mm512_extractf32x8_ps(wd, 1);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(wdg, _mm256_loadu_ps(xd + bg)), _mm256_cvtepi32_ps(isum)));
        }
    }
    if (b < n8) {
        const __m256i isum = _mm256_add_epi32(q8_0_vec_group8(wp + b * 34, codes + b * 32),
                                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr + b)));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(q8_0_scales8(wp + b * 34), _mm256_loadu_ps(xd + b)),
                                               _mm256_cvtepi32_ps(isum)));
        b += 8;
    }
    float sum = hsum_f32x8(acc);
    for (; b < nb; ++b) {
        const uint8_t* wb = wp + b * 34;
        const __m256i wu = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 2)),
                                            _mm256_set1_epi8((char)0x80));
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + b * 32));
        const int32_t isum = hsum_i32x8(_mm256_dpbusd_epi32(_mm256_setzero_si256(), wu, x)) + corr[b];
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
    k.q8_0_prep = PreparedDot{q8_0_prep_bytes, q8_0_prepare, q8_0_dot_prepared, q8_0_dot_prepared_n};
    k.q8_0_vec_prep = PreparedDot{q8_0_prep_bytes, q8_0_prepare_vec, q8_0_dot_vec, nullptr, true};
    k.iq2_xxs = x86_single<x86_iq2_xxs_n<Iq2BlockVbmi, 1>>;
    k.iq2_xxs_n = x86_multi<x86_iq2_xxs_n<Iq2BlockVbmi, 1>, x86_iq2_xxs_n<Iq2BlockVbmi, 2>,
                            x86_iq2_xxs_n<Iq2BlockVbmi, 3>, x86_iq2_xxs_n<Iq2BlockVbmi, 4>>;
    k.iq2_xxs_rows = iq2_xxs_rows_vbmi;
    return k;
}
}  // namespace

const DotKernels& avx512vnni_kernels() {
    static const DotKernels k = make_avx512vnni_table();
    return k;
}

}  // namespace ds4::quant
