// AVX-512 VNNI group kernels of the prefill GEMM (gemm.h, docs/gemm.md).
//
// Panel: per 256- or 32-block, the codes of 16 rows as one 64-byte vector per 4 consecutive k
// (lane r = row r's 4 codes, as bytes), followed by the per-row block data (float scales, int32
// sub-block scales, int16 min pairs). A tile of NT tokens x 16 rows accumulates with
//   vpdpbusd acc[t], panel_vector, broadcast(4 activation codes of token t)
// i.e. unsigned weight bytes times signed activation codes, 64 products per instruction, every
// activation dword loaded once per tile row-vector and every panel vector once per NT tokens.
// Unsigned weights: Q2_K stores sc * q (<= 15 * 3 = 45: the sub-block scale folded in, exact),
// Q4_K its nibble q; Q8_0 and IQ2_XXS store code + 128 and the driver's per-32 correction
// -128 * sum(activation codes) is the accumulator's start value, so every int32 block sum is exact.
//
// Float order: per (row, token) exactly the row kernel of the avx512 / avx512vnni paths:
//   Q2_K, Q4_K: sumf += (yd*d)*(float)isum - (yd*dmin)*(float)summs, blocks in order;
//   IQ2_XXS:    sumf += (d*yd)*(float)bsum, blocks in order, then 0.125f * sumf;
//   Q8_0:       term_b = (d*xd)*(float)isum; lane j = sum over groups g of term_{8g+j} (j < 8,
//               whole groups of 8 blocks), reduced as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), then
//               the remaining blocks added one by one (x86_q8_0_n in dot_x86_common.inc).
// The tiles themselves are gemm_tiles.inc's, shared with the plain AVX-512 and AVX2 files; this
// file supplies the vpdpbusd vector struct and the VBMI IQ2_XXS decoder.
#include "quant/avx512_intrinsics.h"

#include <type_traits>

#include "quant/formats.h"
#include "quant/gemm.h"
#include "quant/iq2xxs_codes.h"
#include "quant/iq2xxs_tables.h"

namespace ds4::quant {

namespace {

constexpr int kTokTile = 8;  // tokens per register tile (8 x 3 accumulators + operands fit 32 zmm)

// Panels of Q8_0, Q2_K, Q4_K: layout constants and decoders shared with the plain AVX-512 file.
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

// IQ2_XXS without gathers: after the transpose, vector 2ib holds the four grid indices of
// sub-block ib of every row (byte 4r + l: group l of row r) and vector 2ib+1 the sign/scale words.
//  * codes: each index byte looks up its grid row's 2-bit codes (iq2xxs_codes.h), the low byte
//    (elements 0..3) and high byte (4..7) separately: two 128-entry vpermi2b each, bit 7 picks;
//  * signs: vpmultishiftqb spreads the four 7-bit fields of each sign word to bytes and a 128-entry
//    vpermi2b maps them to the kIq2Ksigns sign bytes (bit 7: parity), byte 4r + l again;
//  * one panel vector (group l, half) then needs in byte b of lane r code b and sign bit 4*half + b
//    of row r's group l. Rows 2q and 2q+1 share qword q, so vpmultishiftqb picks both straight out
//    of the code and sign vectors: code bits to bits 0..1, the sign bit to bit 2 (a rotate by 2
//    bits less), a bit select joins them, and vpermb maps the 3-bit (sign, code) to the stored byte
//    (code value, negated when the sign is set) + 128 (the old sub/xor sequence, the same bytes).
struct Iq2PanelConsts {
    int8_t sign_field[64];   // vpmultishiftqb: byte 4r + l of a qword pair <- 7-bit field l
    int8_t code_pick[4][64];  // per group l: byte b of each dword <- code b (bits 8l + 2b)
    int8_t sign_pick[8][64];  // per (l, half): bit 2 of byte b <- sign bit 8l + 4 half + b
    uint8_t value[64];       // (sign, code) in bits 2, 1..0 -> stored byte
    constexpr Iq2PanelConsts() : sign_field(), code_pick(), sign_pick(), value() {
        const int grid[4] = {8, 25, 43, 0};
        for (int i = 0; i < 64; ++i) {
            const int dword = (i & 7) >> 2, b = i & 3;  // position inside the qword
            sign_field[i] = (int8_t)(32 * dword + 7 * b);
            for (int l = 0; l < 4; ++l) {
                code_pick[l][i] = (int8_t)(32 * dword + 8 * l + 2 * b);
                for (int half = 0; half < 2; ++half)
                    sign_pick[2 * l + half][i] = (int8_t)((32 * dword + 8 * l + 4 * half + b - 2) & 63);
            }
            const int g = grid[i & 3];
            value[i] = (uint8_t)((i & 4) ? 128 - g : 128 + g);
        }
    }
};
alignas(64) constexpr Iq2PanelConsts kIq2Panel{};

inline __m512i ld64(const void* p) { return _mm512_load_si512(p); }

// 64 byte lookups in a 256-byte table (two 128-entry vpermi2b, index bit 7 picks).
inline __m512i lookup256(const uint8_t* tab, __m512i idx, __mmask64 bit7) {
    const __m512i a = _mm512_permutex2var_epi8(ld64(tab), idx, ld64(tab + 64));
    const __m512i b = _mm512_permutex2var_epi8(ld64(tab + 128), idx, ld64(tab + 192));
    return _mm512_mask_blend_epi8(bit7, a, b);
}

void decode_iq2_xxs(const GemmGroup& g) {
    const __m512i m3 = _mm512_set1_epi8(3);
    for (int64_t b = 0; b < g.n / QK; ++b) {
        const uint8_t* blk = g.w + b * (int64_t)sizeof(BlockIQ2XXS);
        uint8_t* pb = g.panel + b * kIq2Blk;
        __m512i v[16];  // the 64 bytes of qs: (grid-index word, sign/scale word) per sub-block
        load_rows(g, blk + 2, 0xFFFF, v);
        transpose_16x16(v);
        for (int ib = 0; ib < 8; ++ib) {
            const __m512i a = v[2 * ib], sw = v[2 * ib + 1];
            const __mmask64 bit7 = _mm512_movepi8_mask(a);
            const __m512i codes[2] = {lookup256(kIq2GridCodes.lo, a, bit7), lookup256(kIq2GridCodes.hi, a, bit7)};
            const __m512i signs = _mm512_permutex2var_epi8(
                ld64(kIq2Ksigns), _mm512_multishift_epi64_epi8(ld64(kIq2Panel.sign_field), sw), ld64(kIq2Ksigns + 64));
            for (int l = 0; l < 4; ++l) {
                for (int half = 0; half < 2; ++half) {
                    const __m512i c = _mm512_multishift_epi64_epi8(ld64(kIq2Panel.code_pick[l]), codes[half]);
                    const __m512i s = _mm512_multishift_epi64_epi8(ld64(kIq2Panel.sign_pick[2 * l + half]), signs);
                    const __m512i sel = _mm512_ternarylogic_epi32(c, s, m3, 0xE4);  // m3 ? c : s, bitwise
                    vst(pb + (8 * ib + 2 * l + half) * kVec, _mm512_permutexvar_epi8(sel, ld64(kIq2Panel.value)));
                }
            }
            vst(pb + kCodes256 + ib * kVec,
                _mm512_add_epi32(_mm512_slli_epi32(_mm512_srli_epi32(sw, 28), 1), _mm512_set1_epi32(1)));
        }
        __m512i dv[4];  // lane r of dv[0]: row r's f16 d (2 bytes read per row)
        load_transpose_16x4(g, blk, 0x3, dv);
        _mm512_store_ps(pb + kCodes256 + 8 * kVec, f16_lo(dv[0]));
    }
}

// ---- micro-kernels: 16 rows x NT tokens ---------------------------------------------------------

inline __m512i vld(const uint8_t* p) { return _mm512_load_si512(reinterpret_cast<const void*>(p)); }

// The 512-bit vectors of gemm_tiles.inc: vpdpbusd / vpdpwssd with the activation dword broadcast
// (the Q8_0 and IQ2_XXS tiles too).
struct VnniVec : Avx512VecBase {
    // Q8_0 / IQ2_XXS panels hold code + 128; the accumulators start at the driver's -128 * sum.
    static constexpr bool kOffsetCodes = true;
    static constexpr bool kPairSteps = false;  // vpdpbusd needs no pairing
    using Codes = vi;
    static Codes codes(const uint8_t* p) { return vld(p); }
    static vi dot_codes(vi acc, Codes w, const uint8_t* x) { return _mm512_dpbusd_epi32(acc, w, bcast32(x)); }
    static vi dot4(vi acc, vi w, const uint8_t* x) { return _mm512_dpbusd_epi32(acc, w, bcast32(x)); }
    static vi dot2(vi acc, vi m, const uint8_t* x) { return _mm512_dpwssd_epi32(acc, m, bcast32(x)); }
};

#include "quant/gemm_tiles.inc"

// ---- group drivers: decode once, then every token tile (gemm_tiles.inc) ------------------------

const GemmKernels kVnni{16,
                        run_group<VnniVec, decode_q8_0<true>, TileQ8_0<VnniVec>::T>,
                        run_group<VnniVec, decode_q2_k, TileQ2K<VnniVec>::T>,
                        run_group<VnniVec, decode_q4_k, TileQ4K<VnniVec>::T>,
                        run_group<VnniVec, decode_iq2_xxs, TileIq2<VnniVec>::T>,
                        panel_bytes,
                        GemmCorr::OffsetSum,
                        GemmCorr::OffsetSum,
                        4};

}  // namespace

const GemmKernels& avx512vnni_gemm() { return kVnni; }

int64_t avx512vnni_dot_loop(int64_t iters) {
    __m512i acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
    __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(3);
    for (int64_t it = 0; it < iters; ++it) {
        for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
        __asm__ volatile("" : "+v"(a), "+v"(b));  // keep the operands opaque: no folding
    }
    __m512i s = acc[0];
    for (int i = 1; i < 12; ++i) s = _mm512_xor_si512(s, acc[i]);
    return _mm512_reduce_add_epi32(s);
}

}  // namespace ds4::quant
