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

// Lane r gathers the dword at a byte offset of row r's block; lanes past nrows read nothing (0).
struct RowGather {
    __m256i idx, live;
    explicit RowGather(const GemmGroup& g)
        : idx(_mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)g.row_bytes))),
          live(_mm256_cmpgt_epi32(_mm256_set1_epi32(g.nrows), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))) {}
    inline __m256i at(const uint8_t* block0, int64_t off) const {
        return _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), reinterpret_cast<const int*>(block0 + off), idx,
                                           live, 1);
    }
};

inline void vst(uint8_t* p, __m256i v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }
inline __m256i vld(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256i byte_of(__m256i v, int i) { return _mm256_and_si256(_mm256_srli_epi32(v, 8 * i), _mm256_set1_epi32(255)); }
inline __m256i bcast32(const uint8_t* p) { return _mm256_set1_epi32((int)load_u32(p)); }

// The f16 scale pair at byte offset off of each live row's block, as two float vectors.
inline void f16_pair(const GemmGroup& g, const uint8_t* block0, int64_t off, uint8_t* d_out, uint8_t* m_out) {
    alignas(32) float d[kRows] = {}, m[kRows] = {};
    for (int r = 0; r < g.nrows; ++r) {
        const uint8_t* p = block0 + r * g.row_bytes + off;
        d[r] = _cvtsh_ss(load_u16(p));
        if (m_out) m[r] = _cvtsh_ss(load_u16(p + 2));
    }
    _mm256_store_ps(reinterpret_cast<float*>(d_out), _mm256_load_ps(d));
    if (m_out) _mm256_store_ps(reinterpret_cast<float*>(m_out), _mm256_load_ps(m));
}

// Q8_0: the 32 codes of each row's block as 8 dwords (bytes 2 + 4s of the 34-byte block, never
// past it), stored as they are, and the f16 d as float.
void decode_q8_0(const GemmGroup& g) {
    const RowGather rows(g);
    for (int64_t b = 0; b < g.n / 32; ++b) {
        const uint8_t* blk = g.w + b * (int64_t)sizeof(BlockQ8_0);
        uint8_t* pb = g.panel + b * kQ8_0Blk;
        for (int s = 0; s < 8; ++s) vst(pb + s * kVec, rows.at(blk, 2 + 4 * s));
        f16_pair(g, blk, 0, pb + 8 * kVec, nullptr);
    }
}

void decode_q2_k(const GemmGroup& g) {
    const RowGather rows(g);
    const __m256i m3 = _mm256_set1_epi32(0x03030303), m15 = _mm256_set1_epi32(15);
    for (int64_t b = 0; b < g.n / QK; ++b) {
        const uint8_t* blk = g.w + b * (int64_t)sizeof(BlockQ2K);
        uint8_t* pb = g.panel + b * kQ2KBlk;
        __m256i sc4[4];
        for (int q = 0; q < 4; ++q) sc4[q] = rows.at(blk, 4 * q);
        // k = 128h + 32j + l: bits 2j of qs[32h + l]; sub-block scale index 8h + 2j + l/16.
        for (int h = 0; h < 2; ++h) {
            for (int m = 0; m < 8; ++m) {
                const __m256i v = rows.at(blk, 16 + 32 * h + 4 * m);
                for (int j = 0; j < 4; ++j) {
                    const int i = 8 * h + 2 * j + (m >> 2);
                    const __m256i sc = _mm256_and_si256(byte_of(sc4[i >> 2], i & 3), m15);
                    const __m256i q = _mm256_and_si256(_mm256_srli_epi32(v, 2 * j), m3);
                    vst(pb + (32 * h + 8 * j + m) * kVec, _mm256_mullo_epi32(q, sc));  // bytes <= 45, no carries
                }
            }
        }
        for (int p = 0; p < 8; ++p) {
            const __m256i lo = _mm256_srli_epi32(byte_of(sc4[p >> 1], 2 * (p & 1)), 4);
            const __m256i hi = _mm256_srli_epi32(byte_of(sc4[p >> 1], 2 * (p & 1) + 1), 4);
            vst(pb + kCodes256 + p * kVec, _mm256_or_si256(lo, _mm256_slli_epi32(hi, 16)));
        }
        f16_pair(g, blk, 80, pb + kCodes256 + 8 * kVec, pb + kCodes256 + 9 * kVec);
    }
}

void decode_q4_k(const GemmGroup& g) {
    const RowGather rows(g);
    const __m256i m4 = _mm256_set1_epi32(0x0F0F0F0F), m63 = _mm256_set1_epi32(63), m15 = _mm256_set1_epi32(15);
    for (int64_t b = 0; b < g.n / QK; ++b) {
        const uint8_t* blk = g.w + b * (int64_t)sizeof(BlockQ4K);
        uint8_t* pb = g.panel + b * kQ4KBlk;
        for (int c = 0; c < 4; ++c) {
            for (int m = 0; m < 8; ++m) {
                const __m256i v = rows.at(blk, 16 + 32 * c + 4 * m);
                vst(pb + (16 * c + m) * kVec, _mm256_and_si256(v, m4));
                vst(pb + (16 * c + 8 + m) * kVec, _mm256_and_si256(_mm256_srli_epi32(v, 4), m4));
            }
        }
        const __m256i s0 = rows.at(blk, 4), s1 = rows.at(blk, 8), s2 = rows.at(blk, 12);
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
        f16_pair(g, blk, 0, pb + kCodes256 + 16 * kVec, pb + kCodes256 + 17 * kVec);
    }
}

void decode_iq2_xxs(const GemmGroup& g) {
    const RowGather rows(g);
    const int* grid = reinterpret_cast<const int*>(kIq2xxsGrid);  // dword 2i: low half of row i
    for (int64_t b = 0; b < g.n / QK; ++b) {
        const uint8_t* blk = g.w + b * (int64_t)sizeof(BlockIQ2XXS);
        uint8_t* pb = g.panel + b * kIq2Blk;
        for (int ib = 0; ib < 8; ++ib) {
            const __m256i a = rows.at(blk, 2 + 8 * ib), sw = rows.at(blk, 6 + 8 * ib);
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
        f16_pair(g, blk, 0, pb + kCodes256 + 8 * kVec, nullptr);
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
    using Codes = SignedCodes;
    static Codes codes(const uint8_t* p) {
        const __m256i w = vld(p);
        return {_mm256_abs_epi8(w), w};
    }
    static vi dot_codes(vi acc, const Codes& w, const uint8_t* x) {
        return ::ds4::quant::dot4(acc, w.abs, _mm256_sign_epi8(bcast32(x), w.w));
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
    static vi dot4(vi acc, vi w, const uint8_t* x) { return ::ds4::quant::dot4(acc, w, bcast32(x)); }
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
                        GemmCorr::None};

}  // namespace

const GemmKernels& avx2_gemm() { return kAvx2; }

}  // namespace ds4::quant
