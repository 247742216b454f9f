// AVX2 group kernels of the prefill GEMM (gemm.h, docs/gemm.md) for all four types.
//
// The AVX-512 VNNI design at half width: 8 rows per panel (the 8 int32 lanes of a 256-bit
// register), one 32-byte panel vector per 4 consecutive k, tiles of 8 rows x 4 tokens (16 ymm
// registers). Without vpdpbusd each step is vpmaddubsw (unsigned weight byte x signed activation
// code, pairs summed in int16) + vpmaddwd by ones + add. The int16 pair sums cannot saturate:
// Q2_K bytes are sc*q <= 45 and Q4_K nibbles <= 15, so |pair| <= 2*45*128. The Q8_0 and IQ2_XXS
// panels hold the signed codes (+-grid for IQ2_XXS); each step multiplies |w| (<= 128, the unsigned
// side) by the activation code with w's sign moved onto it by vpsignb, so a pair lies in
// [-32768, 32512] and never saturates (gemm_tiles.inc). For IQ2_XXS these are the AVX2 row kernel's
// very products (it applies the signs to the Q8_K codes with vpsignb too, wrapping the same way
// for a code of -128, see dot_x86_common.inc); for Q8_0, whose row kernel widens to int16, the
// tile corrects the products of a -128 code from the driver's mask (GemmCorr::MinCodeMask).
//
// Float order per (row, token): the row kernels' (scalar block order), as in the VNNI file.
#include <immintrin.h>

#include <type_traits>

#include "quant/formats.h"
#include "quant/gemm.h"
#include "quant/iq2xxs_tables.h"

namespace ds4::quant {

namespace {

constexpr int kRows = 8;
constexpr int kTokTile = 4;
constexpr int64_t kVec = 32;
constexpr int64_t kCodes256 = 64 * kVec;
constexpr int64_t kQ2KBlk = kCodes256 + 8 * kVec + 2 * kVec;       // codes, min pairs, d, dmin
constexpr int64_t kQ4KBlk = kCodes256 + 16 * kVec + 2 * kVec;      // codes, scales, min pairs, d, dmin
constexpr int64_t kQ8_0Blk = 8 * kVec + kVec;                       // codes, d
constexpr int64_t kIq2Blk = kCodes256 + 8 * kVec + kVec;            // +-grid, (2 ls + 1), d

size_t panel_bytes(GgmlType t, int64_t n) {
    switch (t) {
        case GgmlType::Q8_0: return (size_t)(n / 32 * kQ8_0Blk);
        case GgmlType::Q2_K: return (size_t)(n / QK * kQ2KBlk);
        case GgmlType::Q4_K: return (size_t)(n / QK * kQ4KBlk);
        case GgmlType::IQ2_XXS: return (size_t)(n / QK * kIq2Blk);
        default: return 0;
    }
}

inline void vst(uint8_t* p, __m256i v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }
inline __m256i vld(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256i byte_of(__m256i v, int i) { return _mm256_and_si256(_mm256_srli_epi32(v, 8 * i), _mm256_set1_epi32(255)); }
inline __m256i bcast32(const uint8_t* p) { return _mm256_set1_epi32((int)load_u32(p)); }

// ---- panel decoding (once per row group) -------------------------------------------------------
// As in the AVX-512 files (gemm_avx512_panels.inc), each row's block bytes are loaded contiguously
// (8 rows side by side) and the dwords transposed in registers, so vector j holds dword j of every
// row; the 8-lane gathers this replaced (one vpgatherdd per dword) are in docs/gemm.md "Measured".

// In place: x[j] lane r <- x[r] lane j (8 x 8 dwords): dword then qword unpacks leave rows 0-3 /
// 4-7 of columns j and j + 4 in the two 128-bit lanes, one lane permute joins them.
inline void transpose_8x8(__m256i* x) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_epi32(x[2 * i], x[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(x[2 * i], x[2 * i + 1]);
    }
    for (int h = 0; h < 2; ++h) {
        u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    for (int c = 0; c < 4; ++c) {
        x[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
        x[4 + c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
    }
}

// v[j] lane r <- dword j of the NDW dwords at p + r * row_bytes (rows >= nrows zero). Exactly those
// bytes are read: a last chunk of fewer than 8 dwords goes through vpmaskmovd, which does not touch
// the masked-off dwords (no read past the block, however the rows end).
template <int NDW>
inline void load_dwords(const GemmGroup& g, const uint8_t* p, __m256i* v) {
#pragma GCC unroll 8
    for (int c = 0; c * 8 < NDW; ++c) {
        const int k = NDW - 8 * c;
        const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256i x[8];
        for (int r = 0; r < 8; ++r) {
            const uint8_t* q = p + 32 * c + r * g.row_bytes;
            x[r] = r >= g.nrows ? _mm256_setzero_si256()
                   : k >= 8     ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))
                                : _mm256_maskload_epi32(reinterpret_cast<const int*>(q), live);
        }
        transpose_8x8(x);
        for (int j = 0; j < 8 && j < k; ++j) v[8 * c + j] = x[j];
    }
}

// The low / high f16 of each int32 lane as 8 floats (vpackusdw works per 128-bit lane, so the
// qword permute gathers the 8 halves into the low lane first).
inline __m256 f16_lo(__m256i v) {
    const __m256i h = _mm256_packus_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_setzero_si256());
    return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(h, 0x08)));
}
inline __m256 f16_hi(__m256i v) { return f16_lo(_mm256_srli_epi32(v, 16)); }
inline void vst_f(uint8_t* p, __m256 v) { _mm256_store_ps(reinterpret_cast<float*>(p), v); }

// The f16 at p + r * row_bytes of each live row (0 for the others) as 8 floats.
inline __m256 f16_rows(const GemmGroup& g, const uint8_t* p) {
    alignas(16) uint16_t h[kRows] = {};
    for (int r = 0; r < g.nrows; ++r) h[r] = load_u16(p + r * g.row_bytes);
    return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h)));
}

// Q8_0: the 32 codes of each row's block (bytes 2..33 of the 34-byte block) as 8 dwords, stored as
// they are, and the f16 d as float.
void decode_q8_0(const GemmGroup& g) {
    for (int64_t b = 0; b < g.n / 32; ++b) {
        const uint8_t* blk = g.w + b * (int64_t)sizeof(BlockQ8_0);
        uint8_t* pb = g.panel + b * kQ8_0Blk;
        __m256i v[8];
        load_dwords<8>(g, blk + 2, v);
        for (int s = 0; s < 8; ++s) vst(pb + s * kVec, v[s]);
        vst_f(pb + 8 * kVec, f16_rows(g, blk));
    }
}

void decode_q2_k(const GemmGroup& g) {
    const __m256i m3 = _mm256_set1_epi32(0x03030303), m15 = _mm256_set1_epi32(15);
    for (int64_t b = 0; b < g.n / QK; ++b) {
        const uint8_t* blk = g.w + b * (int64_t)sizeof(BlockQ2K);
        uint8_t* pb = g.panel + b * kQ2KBlk;
        __m256i v[21];  // dwords 0-3: scales[16], 4-19: qs[64], 20: d | dmin
        load_dwords<21>(g, blk, v);
        const __m256i* sc4 = v;
        // k = 128h + 32j + l: bits 2j of qs[32h + l]; sub-block scale index 8h + 2j + l/16.
        for (int h = 0; h < 2; ++h) {
            for (int m = 0; m < 8; ++m) {
                const __m256i q4 = v[4 + 8 * h + m];
                for (int j = 0; j < 4; ++j) {
                    const int i = 8 * h + 2 * j + (m >> 2);
                    const __m256i sc = _mm256_and_si256(byte_of(sc4[i >> 2], i & 3), m15);
                    const __m256i q = _mm256_and_si256(_mm256_srli_epi32(q4, 2 * j), m3);
                    vst(pb + (32 * h + 8 * j + m) * kVec, _mm256_mullo_epi32(q, sc));  // bytes <= 45, no carries
                }
            }
        }
        for (int p = 0; p < 8; ++p) {
            const __m256i lo = _mm256_srli_epi32(byte_of(sc4[p >> 1], 2 * (p & 1)), 4);
            const __m256i hi = _mm256_srli_epi32(byte_of(sc4[p >> 1], 2 * (p & 1) + 1), 4);
            vst(pb + kCodes256 + p * kVec, _mm256_or_si256(lo, _mm256_slli_epi32(hi, 16)));
        }
        vst_f(pb + kCodes256 + 8 * kVec, f16_lo(v[20]));
        vst_f(pb + kCodes256 + 9 * kVec, f16_hi(v[20]));
    }
}

void decode_q4_k(const GemmGroup& g) {
    const __m256i m4 = _mm256_set1_epi32(0x0F0F0F0F), m63 = _mm256_set1_epi32(63), m15 = _mm256_set1_epi32(15);
    for (int64_t b = 0; b < g.n / QK; ++b) {
        const uint8_t* blk = g.w + b * (int64_t)sizeof(BlockQ4K);
        uint8_t* pb = g.panel + b * kQ4KBlk;
        __m256i v[36];  // dword 0: d | dmin, 1-3: the 12 scale bytes, 4-35: qs
        load_dwords<36>(g, blk, v);
        for (int c = 0; c < 4; ++c) {
            for (int m = 0; m < 8; ++m) {
                const __m256i q = v[4 + 8 * c + m];
                vst(pb + (16 * c + m) * kVec, _mm256_and_si256(q, m4));
                vst(pb + (16 * c + 8 + m) * kVec, _mm256_and_si256(_mm256_srli_epi32(q, 4), m4));
            }
        }
        const __m256i s0 = v[1], s1 = v[2], s2 = v[3];
        auto sbyte = [&](int i) { return byte_of(i < 4 ? s0 : i < 8 ? s1 : s2, i & 3); };
        for (int k = 0; k < 8; ++k) {
            __m256i sc, mn;
            if (k < 4) {
                sc = _mm256_and_si256(sbyte(k), m63);
                mn = _mm256_and_si256(sbyte(k + 4), m63);
            } else {
                sc = _mm256_or_si256(_mm256_and_si256(sbyte(k + 4), m15),
                                     _mm256_slli_epi32(_mm256_srli_epi32(sbyte(k - 4), 6), 4));
                mn = _mm256_or_si256(_mm256_srli_epi32(sbyte(k + 4), 4),
                                     _mm256_slli_epi32(_mm256_srli_epi32(sbyte(k), 6), 4));
            }
            vst(pb + kCodes256 + k * kVec, sc);
            vst(pb + kCodes256 + (8 + k) * kVec, _mm256_or_si256(mn, _mm256_slli_epi32(mn, 16)));
        }
        vst_f(pb + kCodes256 + 16 * kVec, f16_lo(v[0]));
        vst_f(pb + kCodes256 + 17 * kVec, f16_hi(v[0]));
    }
}

void decode_iq2_xxs(const GemmGroup& g) {
    const int* grid = reinterpret_cast<const int*>(kIq2xxsGrid);  // dword 2i: low half of row i
    for (int64_t b = 0; b < g.n / QK; ++b) {
        const uint8_t* blk = g.w + b * (int64_t)sizeof(BlockIQ2XXS);
        uint8_t* pb = g.panel + b * kIq2Blk;
        __m256i v[16];  // the 64 bytes of qs: (grid-index word, sign/scale word) per sub-block
        load_dwords<16>(g, blk + 2, v);
        for (int ib = 0; ib < 8; ++ib) {
            const __m256i a = v[2 * ib], sw = v[2 * ib + 1];
            for (int l = 0; l < 4; ++l) {
                // 8-bit sign pattern: the 7 stored bits and their parity (kIq2Ksigns).
                const __m256i s7 = _mm256_and_si256(_mm256_srli_epi32(sw, 7 * l), _mm256_set1_epi32(127));
                __m256i par = _mm256_xor_si256(s7, _mm256_srli_epi32(s7, 4));
                par = _mm256_xor_si256(par, _mm256_srli_epi32(par, 2));
                par = _mm256_and_si256(_mm256_xor_si256(par, _mm256_srli_epi32(par, 1)), _mm256_set1_epi32(1));
                const __m256i s8 = _mm256_or_si256(s7, _mm256_slli_epi32(par, 7));
                const __m256i gi = _mm256_slli_epi32(byte_of(a, l), 1);
                for (int half = 0; half < 2; ++half) {
                    const int s = 8 * ib + 2 * l + half;
                    const __m256i gv = _mm256_i32gather_epi32(grid, _mm256_add_epi32(gi, _mm256_set1_epi32(half)), 4);
                    // Bits 4*half .. 4*half+3 -> bytes 0xFF (negative) or 0x01: the grid bytes' signs.
                    const __m256i x = _mm256_and_si256(_mm256_srli_epi32(s8, 4 * half), _mm256_set1_epi32(15));
                    const __m256i spread = _mm256_or_si256(_mm256_or_si256(x, _mm256_slli_epi32(x, 7)),
                                                           _mm256_or_si256(_mm256_slli_epi32(x, 14), _mm256_slli_epi32(x, 21)));
                    const __m256i neg = _mm256_sub_epi8(_mm256_setzero_si256(),
                                                        _mm256_and_si256(spread, _mm256_set1_epi32(0x01010101)));
                    vst(pb + s * kVec, _mm256_sign_epi8(gv, _mm256_or_si256(neg, _mm256_set1_epi8(1))));
                }
            }
            vst(pb + kCodes256 + ib * kVec,
                _mm256_add_epi32(_mm256_slli_epi32(_mm256_srli_epi32(sw, 28), 1), _mm256_set1_epi32(1)));
        }
        vst_f(pb + kCodes256 + 8 * kVec, f16_rows(g, blk));
    }
}

// ---- micro-kernels: 8 rows x NT tokens ----------------------------------------------------------

// acc + sum of the 4 byte products per lane (pairs in int16 first; no saturation, see top).
inline __m256i dot4(__m256i acc, __m256i w_u8, __m256i a_s8) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w_u8, a_s8), _mm256_set1_epi16(1)));
}

// A panel vector of signed codes made ready for every token of the tile: |w|, and w as vpsignb's
// sign operand (w = 0 zeroes the activation code, whose product with |w| = 0 is 0 anyway).
struct SignedCodes {
    __m256i abs, w;
};

// The 256-bit vectors of gemm_tiles.inc: vpmaddubsw + vpmaddwd(ones) in place of vpdpbusd (the
// int16 pair sums cannot saturate, see above), vpmaddwd + add in place of vpdpwssd.
struct Avx2Vec {
    using vi = __m256i;
    using vf = __m256;
    static constexpr int kTile = kTokTile;
    static constexpr int64_t kVec = 32, kCodes256 = ::ds4::quant::kCodes256, kQ2KBlk = ::ds4::quant::kQ2KBlk,
                             kQ4KBlk = ::ds4::quant::kQ4KBlk, kQ8_0Blk = ::ds4::quant::kQ8_0Blk,
                             kIq2Blk = ::ds4::quant::kIq2Blk;
    static constexpr bool kOffsetCodes = false;
    static constexpr bool kPairSteps = true;  // one vpmaddwd + add per two steps where bytes <= 63
    using Codes = SignedCodes;
    static Codes codes(const uint8_t* p) {
        const __m256i w = vld(p);
        return {_mm256_abs_epi8(w), w};
    }
    static vi dot_codes(vi acc, const Codes& w, const uint8_t* x) {
        return ::ds4::quant::dot4(acc, w.abs, _mm256_sign_epi8(bcast32(x), w.w));
    }
    // |w| <= 63 only (IQ2_XXS): the two steps' int16 pair sums added before the widening.
    static vi dot_codes2(vi acc, const Codes& w0, const Codes& w1, const uint8_t* x) {
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(w0.abs, _mm256_sign_epi8(bcast32(x), w0.w)),
                                           _mm256_maddubs_epi16(w1.abs, _mm256_sign_epi8(bcast32(x + 4), w1.w)));
        return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
    }
    // 256 |w_i| for every code i of mask (activation code -128) where w_i < 0: the products the
    // wrapped vpsignb got as -128 |w_i| instead of +128 |w_i| (rare: subnormal activation scales).
    static vi min_code_fix(const uint8_t* pb, uint32_t mask) {
        __m256i neg_sum = _mm256_setzero_si256();
        for (; mask; mask &= mask - 1) {
            const int i = __builtin_ctz(mask);
            const __m256i w = vld(pb + (i / 4) * kVec);
            const __m256i wi = _mm256_srai_epi32(_mm256_sll_epi32(w, _mm_cvtsi32_si128(24 - 8 * (i % 4))), 24);
            neg_sum = _mm256_add_epi32(neg_sum, _mm256_min_epi32(wi, _mm256_setzero_si256()));
        }
        return _mm256_mullo_epi32(neg_sum, _mm256_set1_epi32(-256));
    }
    static vi set1_i(int32_t v) { return _mm256_set1_epi32(v); }
    static vi zero_i() { return _mm256_setzero_si256(); }
    static vf zero_f() { return _mm256_setzero_ps(); }
    static vi load_i(const uint8_t* p) { return vld(p); }
    static vf load_f(const uint8_t* p) { return _mm256_load_ps(reinterpret_cast<const float*>(p)); }
    // Panel bytes <= 63 (Q2_K, Q4_K): the two steps' int16 pair sums added before the widening.
    static vi dot4x2(vi acc, vi w0, vi w1, const uint8_t* x) {
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(w0, bcast32(x)), _mm256_maddubs_epi16(w1, bcast32(x + 4)));
        return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
    }
    static vi dot2(vi acc, vi m, const uint8_t* x) { return _mm256_add_epi32(acc, _mm256_madd_epi16(m, bcast32(x))); }
    static vi mul32(vi a, vi b) { return _mm256_mullo_epi32(a, b); }
    static vi add32(vi a, vi b) { return _mm256_add_epi32(a, b); }
    static vf set1(float v) { return _mm256_set1_ps(v); }
    static vf mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
    static vf sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
    static vf add(vf a, vf b) { return _mm256_add_ps(a, b); }
    static vf cvt(vi v) { return _mm256_cvtepi32_ps(v); }
    static void store(const GemmGroup& g, int64_t t, vf acc) {
        alignas(32) float v[kRows];
        _mm256_store_ps(v, acc);
        float* y = g.y[t] + g.row0;
        for (int r = 0; r < g.nrows; ++r) y[r] = v[r];
    }
};

#include "quant/gemm_tiles.inc"

const GemmKernels kAvx2{kRows,
                        run_group<Avx2Vec, decode_q8_0, TileQ8_0<Avx2Vec>::T>,
                        run_group<Avx2Vec, decode_q2_k, TileQ2K<Avx2Vec>::T>,
                        run_group<Avx2Vec, decode_q4_k, TileQ4K<Avx2Vec>::T>,
                        run_group<Avx2Vec, decode_iq2_xxs, TileIq2<Avx2Vec>::T>,
                        panel_bytes,
                        GemmCorr::MinCodeMask,
                        GemmCorr::None,
                        8};

}  // namespace

const GemmKernels& avx2_gemm() { return kAvx2; }

}  // namespace ds4::quant
