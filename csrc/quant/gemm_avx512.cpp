// Plain AVX-512 (AVX-512BW without VNNI) group kernels of the prefill GEMM (gemm.h,
// docs/gemm.md) for all four types.
//
// The VNNI design without vpdpbusd / vpdpwssd: the same 16-row panels (gemm_avx512_panels.inc), the
// same tiles (gemm_tiles.inc), and each 4-byte dot step is vpmaddubsw (unsigned panel byte x signed
// activation code, pairs summed in int16) + vpmaddwd by ones + add, as gemm_avx2.cpp does at 256
// bits. No int16 pair sum saturates:
//  * Q2_K panel bytes are sc * q <= 45 and Q4_K nibbles <= 15, so |pair| <= 2 * 45 * 128;
//  * Q8_0 and IQ2_XXS panels hold the signed codes (not code + 128, whose pairs would reach
//    2 * 255 * 128): each step takes |w| (<= 128) as the unsigned side and the activation code
//    negated in the lanes where w < 0 (a masked vpsubb; AVX-512 has no vpsignb), so every product
//    lies in [-128 * 128, 128 * 127] and a pair in [-32768, 32512]. Negating a code of -128 wraps;
//    for Q8_0 the tile corrects those products (GemmCorr::MinCodeMask, gemm_tiles.inc), for IQ2_XXS
//    the avx512 row kernel wraps the same way (mask_sub on the Q8_K codes), so the integers agree.
// Every int32 block sum is therefore the row kernel's, and the float finish is the shared one in the
// row kernels' order, so the results are the avx512 row kernels' bits.
#include "quant/avx512_intrinsics.h"

#include <type_traits>

#include "quant/formats.h"
#include "quant/gemm.h"
#include "quant/iq2xxs_tables.h"

namespace ds4::quant {

namespace {

constexpr int kTokTile = 8;  // tokens per register tile, as in the VNNI file

#include "quant/gemm_avx512_panels.inc"
#include "quant/gemm_avx512_vec.inc"

size_t panel_bytes(GgmlType t, int64_t n) {
    switch (t) {
        case GgmlType::Q8_0: return (size_t)(n / 32 * kQ8_0Blk);
        case GgmlType::Q2_K: return (size_t)(n / QK * kQ2KBlk);
        case GgmlType::Q4_K: return (size_t)(n / QK * kQ4KBlk);
        case GgmlType::IQ2_XXS: return (size_t)(n / QK * kIq2Blk);
        default: return 0;
    }
}

// IQ2_XXS without VBMI: the 64 bytes after d of 16 rows are transposed as in the VNNI decoder
// (vector 2ib: the four grid indices of sub-block ib, vector 2ib+1: its sign/scale word, lane r =
// row r), then per (group l, half) one 16-lane gather reads 4 grid bytes of each row's index from
// the 2 KiB grid table (L1-resident), and the sign bits negate the bytes they cover (masked vpsubb):
// the panel holds +-grid, the signed codes the tile expects.
void decode_iq2_xxs(const GemmGroup& g) {
    const int* grid = reinterpret_cast<const int*>(kIq2xxsGrid);  // dword 2i + half: half of grid row i
    const __m512i b127 = _mm512_set1_epi32(127), one = _mm512_set1_epi32(1), bits = _mm512_set1_epi32(0x01010101);
    for (int64_t b = 0; b < g.n / QK; ++b) {
        const uint8_t* blk = g.w + b * (int64_t)sizeof(BlockIQ2XXS);
        uint8_t* pb = g.panel + b * kIq2Blk;
        __m512i v[16];
        load_rows(g, blk + 2, 0xFFFF, v);
        transpose_16x16(v);
        for (int ib = 0; ib < 8; ++ib) {
            const __m512i a = v[2 * ib], sw = v[2 * ib + 1];
            for (int l = 0; l < 4; ++l) {
                // The 8-bit sign pattern: the 7 stored bits and their parity in bit 7 (kIq2Ksigns).
                const __m512i s7 = _mm512_and_si512(_mm512_srli_epi32(sw, 7 * l), b127);
                __m512i par = _mm512_xor_si512(s7, _mm512_srli_epi32(s7, 4));
                par = _mm512_xor_si512(par, _mm512_srli_epi32(par, 2));
                par = _mm512_and_si512(_mm512_xor_si512(par, _mm512_srli_epi32(par, 1)), one);
                const __m512i s8 = _mm512_or_si512(s7, _mm512_slli_epi32(par, 7));
                const __m512i gi = _mm512_slli_epi32(byte_of(a, l), 1);
                for (int half = 0; half < 2; ++half) {
                    const __m512i gv = _mm512_i32gather_epi32(_mm512_add_epi32(gi, _mm512_set1_epi32(half)), grid, 4);
                    // Sign bits 4 half .. 4 half + 3 of each lane, one to bit 0 of each byte.
                    const __m512i x = _mm512_and_si512(_mm512_srli_epi32(s8, 4 * half), _mm512_set1_epi32(15));
                    const __m512i spread = _mm512_or_si512(_mm512_or_si512(x, _mm512_slli_epi32(x, 7)),
                                                           _mm512_or_si512(_mm512_slli_epi32(x, 14), _mm512_slli_epi32(x, 21)));
                    const __mmask64 neg = _mm512_test_epi8_mask(spread, bits);
                    vst(pb + (8 * ib + 2 * l + half) * kVec, _mm512_mask_sub_epi8(gv, neg, _mm512_setzero_si512(), gv));
                }
            }
            vst(pb + kCodes256 + ib * kVec, _mm512_add_epi32(_mm512_slli_epi32(_mm512_srli_epi32(sw, 28), 1), one));
        }
        __m512i dv[4];  // lane r of dv[0]: row r's f16 d (2 bytes read per row)
        load_transpose_16x4(g, blk, 0x3, dv);
        _mm512_store_ps(pb + kCodes256 + 8 * kVec, f16_lo(dv[0]));
    }
}

inline __m512i madd_ones(__m512i pairs) { return _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)); }

// A panel vector of signed codes made ready for every token of the tile: |w| and the lanes w < 0.
struct SignedCodes {
    __m512i abs;
    __mmask64 neg;
};

// The 512-bit vectors of gemm_tiles.inc with AVX-512BW only (no saturation, see top).
struct Avx512Vec : Avx512VecBase {
    static constexpr bool kOffsetCodes = false;
    static constexpr bool kPairSteps = true;  // one vpmaddwd + add per two steps where bytes <= 63
    using Codes = SignedCodes;
    static Codes codes(const uint8_t* p) {
        const __m512i w = load_i(p);
        return {_mm512_abs_epi8(w), _mm512_movepi8_mask(w)};
    }
    static __m512i signed_pairs(const Codes& w, const uint8_t* x) {
        const __m512i a = bcast32(x);
        return _mm512_maddubs_epi16(w.abs, _mm512_mask_sub_epi8(a, w.neg, zero_i(), a));
    }
    static vi dot_codes(vi acc, const Codes& w, const uint8_t* x) { return _mm512_add_epi32(acc, madd_ones(signed_pairs(w, x))); }
    // |w| <= 63 only (IQ2_XXS): the two steps' int16 pair sums added before the widening.
    static vi dot_codes2(vi acc, const Codes& w0, const Codes& w1, const uint8_t* x) {
        return _mm512_add_epi32(acc, madd_ones(_mm512_add_epi16(signed_pairs(w0, x), signed_pairs(w1, x + 4))));
    }
    // 256 |w_i| for every code i of mask (activation code -128) where w_i < 0: the products the
    // wrapped negation got as -128 |w_i| instead of +128 |w_i| (rare: subnormal activation scales).
    static vi min_code_fix(const uint8_t* pb, uint32_t mask) {
        __m512i neg_sum = zero_i();
        for (; mask; mask &= mask - 1) {
            const int i = __builtin_ctz(mask);
            const __m512i w = load_i(pb + (i / 4) * kVec);
            const __m512i wi = _mm512_srai_epi32(_mm512_sll_epi32(w, _mm_cvtsi32_si128(24 - 8 * (i % 4))), 24);
            neg_sum = _mm512_add_epi32(neg_sum, _mm512_min_epi32(wi, zero_i()));
        }
        return _mm512_mullo_epi32(neg_sum, _mm512_set1_epi32(-256));
    }
    // Panel bytes <= 63 (Q2_K, Q4_K): the two steps' int16 pair sums added before the widening.
    static vi dot4x2(vi acc, vi w0, vi w1, const uint8_t* x) {
        const __m512i p = _mm512_add_epi16(_mm512_maddubs_epi16(w0, bcast32(x)), _mm512_maddubs_epi16(w1, bcast32(x + 4)));
        return _mm512_add_epi32(acc, madd_ones(p));
    }
    static vi dot2(vi acc, vi m, const uint8_t* x) { return _mm512_add_epi32(acc, _mm512_madd_epi16(m, bcast32(x))); }
};

#include "quant/gemm_tiles.inc"

const GemmKernels kAvx512{16,
                          run_group<Avx512Vec, decode_q8_0<false>, TileQ8_0<Avx512Vec>::T>,
                          run_group<Avx512Vec, decode_q2_k, TileQ2K<Avx512Vec>::T>,
                          run_group<Avx512Vec, decode_q4_k, TileQ4K<Avx512Vec>::T>,
                          run_group<Avx512Vec, decode_iq2_xxs, TileIq2<Avx512Vec>::T>,
                          panel_bytes,
                          GemmCorr::MinCodeMask,
                          GemmCorr::None,
                          8};

}  // namespace

const GemmKernels& avx512_gemm() { return kAvx512; }

}  // namespace ds4::quant
