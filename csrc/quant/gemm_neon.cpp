// arm64 NEON (ARMv8.2 dotprod) group kernels of the prefill GEMM (gemm.h, docs/gemm.md).
//
// Q2_K, Q4_K, IQ2_XXS: a group of 8 weight rows is decoded once into an int8 panel, per 256-block
// one 16-byte vector per 4 consecutive k and 4 rows (lane r = row r's 4 codes; two vectors cover
// the 8 rows), followed by the per-row block data (int32 sub-block scales, int16 mins, float
// scales). `sdot` is signed x signed, so the codes are stored as they are (Q2_K: sub-block scale
// times the 2-bit code, <= 45; Q4_K: the nibble; IQ2_XXS: the signed grid value, |v| <= 43): no
// +128 offsets and no activation-side corrections, unlike vpdpbusd. The micro-kernel loads 16
// activation codes of a token once and applies them with the by-element form
//   sdot acc[v][t], panel_vector(4 k x 4 rows), activation.4b[j]
// so every int32 lane is one (row, token) sum, and the float work per block is done on vectors of
// 4 rows. The integer block sums are exact (the same integers the row kernel forms otherwise).
//
// Q8_0: its codes are int8 already, so there is no code panel: a tile of 4 rows x 2 tokens reads
// the rows in place and forms each block exactly as the NEON row kernel does (4 int32 dot lanes,
// converted, fused-multiply-added into an even-block or odd-block accumulator); the group's panel
// holds only the block scales, converted from f16 once per group instead of once per token.
//
// Float order per (row, token) is the NEON row kernel's (dot_neon.cpp), so the GEMM gives its
// bits: Q2_K: sum += dmin*(float)summs, then sum += d*(float)isum per block (dmin = -yd * wdmin);
// Q4_K: the scalar order (q4k_block_value); IQ2_XXS: per block sumf1/sumf2 over even/odd
// sub-blocks, sumf += d * (sumf1 + sumf2), then 0.25f * sumf; Q8_0: lanes as above, reduced as
// vaddvq_f32(accA + accB). Everything is built with -ffp-contract=off (CMakeLists.txt).
//
// Without __ARM_FEATURE_DOTPROD (a compiler not given +dotprod) the table is empty and every type
// keeps the row kernels. The NEON path itself is only chosen on CPUs with dotprod (simd.cpp).
#include <arm_neon.h>

#include "quant/formats.h"
#include "quant/gemm.h"
#include "quant/iq2xxs_tables.h"

namespace ds4::quant {

#if defined(__ARM_FEATURE_DOTPROD)

namespace {

constexpr int kRows = 8;                   // rows per group: two vectors of 4 int32 lanes
constexpr int kRowVecs = 2;
constexpr int64_t kVec = 16;
constexpr int64_t kCodes256 = 64 * kRowVecs * kVec;                  // 64 groups of 4 k x 8 rows
constexpr int64_t kQ2KBlk = kCodes256 + 16 * kVec + 2 * kRows * 4;   // codes, 16 int16 mins, d, dmin
constexpr int64_t kQ4KBlk = kCodes256 + 8 * kRows * 4 + 8 * kVec + 2 * kRows * 4;  // codes, scales, mins, d, dmin
constexpr int64_t kIq2Blk = kCodes256 + 8 * kRows * 4 + kRows * 4;   // codes, float scales, d
constexpr int kQ8Rows = 4, kQ8Tile = 2;    // Q8_0 register tile: 4 rows x 2 tokens, 2 accumulators each
constexpr int kTile = 4;                   // tokens per register tile of the K / IQ types

size_t panel_bytes(GgmlType t, int64_t n) {
    switch (t) {
        case GgmlType::Q8_0: return (size_t)(n / 32 * kRows * 4);
        case GgmlType::Q2_K: return (size_t)(n / QK * kQ2KBlk);
        case GgmlType::Q4_K: return (size_t)(n / QK * kQ4KBlk);
        case GgmlType::IQ2_XXS: return (size_t)(n / QK * kIq2Blk);
        default: return 0;
    }
}

// Loops over the tile's rows / row vectors / tokens are unrolled so the accumulators live in
// registers: GCC -O2 (the qemu test's level) otherwise keeps them in stack arrays.
#define DS4_TILE_LOOP _Pragma("GCC unroll 8")

inline int16_t load_i16(const uint8_t* p) { return (int16_t)load_u16(p); }
inline float* fptr(uint8_t* p) { return reinterpret_cast<float*>(p); }
inline const float* fptr(const uint8_t* p) { return reinterpret_cast<const float*>(p); }

// ---- panel decoding -----------------------------------------------------------------------------

// Codes of the group's rows for one 256-block, row-major (code[r][k]); rows past nrows are zero.
struct RowCodes {
    alignas(16) int8_t code[kRows][QK];
};

// code[.][k] of 8 rows -> panel vectors ((s * 2 + v) * 16 bytes: rows 4v..4v+3, k = 4s..4s+3), by a
// 4 x 4 transpose of 32-bit words per 16 k.
void transpose_to_panel(const RowCodes& rc, uint8_t* out) {
    for (int v = 0; v < kRowVecs; ++v) {
        for (int c = 0; c < QK / 16; ++c) {
            const int32x4_t q0 = vreinterpretq_s32_s8(vld1q_s8(rc.code[4 * v + 0] + 16 * c));
            const int32x4_t q1 = vreinterpretq_s32_s8(vld1q_s8(rc.code[4 * v + 1] + 16 * c));
            const int32x4_t q2 = vreinterpretq_s32_s8(vld1q_s8(rc.code[4 * v + 2] + 16 * c));
            const int32x4_t q3 = vreinterpretq_s32_s8(vld1q_s8(rc.code[4 * v + 3] + 16 * c));
            const int32x4_t t0 = vtrn1q_s32(q0, q1), t1 = vtrn2q_s32(q0, q1);
            const int32x4_t t2 = vtrn1q_s32(q2, q3), t3 = vtrn2q_s32(q2, q3);
            const int64x2_t a0 = vreinterpretq_s64_s32(t0), a1 = vreinterpretq_s64_s32(t1);
            const int64x2_t a2 = vreinterpretq_s64_s32(t2), a3 = vreinterpretq_s64_s32(t3);
            uint8_t* o = out + (4 * c * kRowVecs + v) * kVec;
            vst1q_s64(reinterpret_cast<int64_t*>(o + 0 * kRowVecs * kVec), vtrn1q_s64(a0, a2));
            vst1q_s64(reinterpret_cast<int64_t*>(o + 1 * kRowVecs * kVec), vtrn1q_s64(a1, a3));
            vst1q_s64(reinterpret_cast<int64_t*>(o + 2 * kRowVecs * kVec), vtrn2q_s64(a0, a2));
            vst1q_s64(reinterpret_cast<int64_t*>(o + 3 * kRowVecs * kVec), vtrn2q_s64(a1, a3));
        }
    }
}

// The f16 scale at byte offset off of each row's block (0 for rows past nrows), as floats.
void f16_scales(const GemmGroup& g, const uint8_t* block0, int64_t off, uint8_t* out) {
    float* o = fptr(out);
    for (int r = 0; r < kRows; ++r) o[r] = r < g.nrows ? f16_to_f32(load_u16(block0 + r * g.row_bytes + off)) : 0.0f;
}

void decode_q2_k(const GemmGroup& g) {
    RowCodes rc;
    const uint8x16_t m3 = vdupq_n_u8(3);
    for (int64_t b = 0; b < g.n / QK; ++b) {
        const uint8_t* blk = g.w + b * (int64_t)sizeof(BlockQ2K);
        uint8_t* pb = g.panel + b * kQ2KBlk;
        int16_t* mins = reinterpret_cast<int16_t*>(pb + kCodes256);  // [sub-block j][row]
        for (int r = 0; r < kRows; ++r) {
            if (r >= g.nrows) {
                std::memset(rc.code[r], 0, QK);
                for (int j = 0; j < 16; ++j) mins[j * kRows + r] = 0;
                continue;
            }
            const BlockQ2K* x = reinterpret_cast<const BlockQ2K*>(blk + r * g.row_bytes);
            // k = 128h + 32j + l: bits 2j of qs[32h + l], times sub-block scale 8h + 2j + l/16.
            for (int h = 0; h < 2; ++h) {
                const uint8x16_t lo = vld1q_u8(x->qs + 32 * h), hi = vld1q_u8(x->qs + 32 * h + 16);
                for (int j = 0; j < 4; ++j) {
                    const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * j));
                    const uint8_t s0 = x->scales[8 * h + 2 * j] & 15, s1 = x->scales[8 * h + 2 * j + 1] & 15;
                    vst1q_u8(reinterpret_cast<uint8_t*>(rc.code[r]) + 128 * h + 32 * j,
                             vmulq_u8(vandq_u8(vshlq_u8(lo, sh), m3), vdupq_n_u8(s0)));
                    vst1q_u8(reinterpret_cast<uint8_t*>(rc.code[r]) + 128 * h + 32 * j + 16,
                             vmulq_u8(vandq_u8(vshlq_u8(hi, sh), m3), vdupq_n_u8(s1)));
                }
            }
            for (int j = 0; j < 16; ++j) mins[j * kRows + r] = (int16_t)(x->scales[j] >> 4);
        }
        transpose_to_panel(rc, pb);
        f16_scales(g, blk, 80, pb + kCodes256 + 16 * kVec);
        f16_scales(g, blk, 82, pb + kCodes256 + 16 * kVec + kRows * 4);
    }
}

void decode_q4_k(const GemmGroup& g) {
    RowCodes rc;
    const uint8x16_t m4 = vdupq_n_u8(15);
    for (int64_t b = 0; b < g.n / QK; ++b) {
        const uint8_t* blk = g.w + b * (int64_t)sizeof(BlockQ4K);
        uint8_t* pb = g.panel + b * kQ4KBlk;
        int32_t* scales = reinterpret_cast<int32_t*>(pb + kCodes256);               // [sub-block][row]
        int16_t* mins = reinterpret_cast<int16_t*>(pb + kCodes256 + 8 * kRows * 4);  // [sub-block][row]
        for (int r = 0; r < kRows; ++r) {
            if (r >= g.nrows) {
                std::memset(rc.code[r], 0, QK);
                for (int j = 0; j < 8; ++j) scales[j * kRows + r] = 0, mins[j * kRows + r] = 0;
                continue;
            }
            const BlockQ4K* x = reinterpret_cast<const BlockQ4K*>(blk + r * g.row_bytes);
            // k = 64c + l: low nibble of qs[32c + l]; k = 64c + 32 + l: its high nibble (l < 32).
            for (int c = 0; c < 4; ++c) {
                for (int half = 0; half < 2; ++half) {
                    const uint8x16_t q = vld1q_u8(x->qs + 32 * c + 16 * half);
                    uint8_t* o = reinterpret_cast<uint8_t*>(rc.code[r]) + 64 * c + 16 * half;
                    vst1q_u8(o, vandq_u8(q, m4));
                    vst1q_u8(o + 32, vshrq_n_u8(q, 4));
                }
            }
            for (int j = 0; j < 8; ++j) {
                uint8_t sc, m;
                q4k_scale_min(x->scales, j, &sc, &m);
                scales[j * kRows + r] = sc;
                mins[j * kRows + r] = m;
            }
        }
        transpose_to_panel(rc, pb);
        f16_scales(g, blk, 0, pb + kCodes256 + 8 * kRows * 4 + 8 * kVec);
        f16_scales(g, blk, 2, pb + kCodes256 + 8 * kRows * 4 + 8 * kVec + kRows * 4);
    }
}

void decode_iq2_xxs(const GemmGroup& g) {
    RowCodes rc;
    const uint8x8_t bit = vcreate_u8(0x8040201008040201ull);  // byte i: 1 << i
    for (int64_t b = 0; b < g.n / QK; ++b) {
        const uint8_t* blk = g.w + b * (int64_t)sizeof(BlockIQ2XXS);
        uint8_t* pb = g.panel + b * kIq2Blk;
        float* scales = fptr(pb + kCodes256);  // [sub-block][row]: 0.5f + ls, as the row kernel
        for (int r = 0; r < kRows; ++r) {
            if (r >= g.nrows) {
                std::memset(rc.code[r], 0, QK);
                for (int ib = 0; ib < 8; ++ib) scales[ib * kRows + r] = 0.0f;
                continue;
            }
            const uint8_t* qs = blk + r * g.row_bytes + 2;
            for (int ib = 0; ib < 8; ++ib) {
                const uint32_t a = load_u32(qs + 8 * ib), s = load_u32(qs + 8 * ib + 4);
                for (int l = 0; l < 4; ++l) {
                    // 8 grid magnitudes, negated where the sign pattern has the bit (x ^ m) - m.
                    const uint8x8_t grid = vcreate_u8(kIq2xxsGrid[(a >> (8 * l)) & 255]);
                    const uint8x8_t neg = vtst_u8(vdup_n_u8(kIq2Ksigns[(s >> (7 * l)) & 127]), bit);
                    vst1_u8(reinterpret_cast<uint8_t*>(rc.code[r]) + 32 * ib + 8 * l, vsub_u8(veor_u8(grid, neg), neg));
                }
                scales[ib * kRows + r] = 0.5f + (float)(s >> 28);
            }
        }
        transpose_to_panel(rc, pb);
        f16_scales(g, blk, 0, pb + kCodes256 + 8 * kRows * 4);
    }
}

void decode_q8_0(const GemmGroup& g) {
    float* d = fptr(g.panel);  // [block][row]
    for (int64_t b = 0; b < g.n / 32; ++b)
        for (int r = 0; r < kRows; ++r)
            d[b * kRows + r] = r < g.nrows ? f16_to_f32(load_u16(g.w + r * g.row_bytes + b * 34)) : 0.0f;
}

// ---- micro-kernels ------------------------------------------------------------------------------

// acc[v][t] += panel vectors of 16 k (4 groups of 4 k, both row vectors) x token t's 16 codes.
template <int NT>
inline void dot16(int32x4_t (*acc)[NT], const uint8_t* p, const int8x16_t* a) {
    constexpr int64_t S = kRowVecs * kVec;  // bytes per group of 4 k
    DS4_TILE_LOOP
    for (int v = 0; v < kRowVecs; ++v) {
        const int8x16_t w0 = vld1q_s8(reinterpret_cast<const int8_t*>(p + 0 * S + v * kVec));
        const int8x16_t w1 = vld1q_s8(reinterpret_cast<const int8_t*>(p + 1 * S + v * kVec));
        const int8x16_t w2 = vld1q_s8(reinterpret_cast<const int8_t*>(p + 2 * S + v * kVec));
        const int8x16_t w3 = vld1q_s8(reinterpret_cast<const int8_t*>(p + 3 * S + v * kVec));
        DS4_TILE_LOOP
        for (int t = 0; t < NT; ++t) {
            acc[v][t] = vdotq_laneq_s32(acc[v][t], w0, a[t], 0);
            acc[v][t] = vdotq_laneq_s32(acc[v][t], w1, a[t], 1);
            acc[v][t] = vdotq_laneq_s32(acc[v][t], w2, a[t], 2);
            acc[v][t] = vdotq_laneq_s32(acc[v][t], w3, a[t], 3);
        }
    }
}

// Sums of `subs` sub-blocks of 16 * chunks codes each, starting at chunk c0 of the block:
// part[v][t] = that sub-block's int32 sums for rows 4v.. of token t.
template <int NT>
inline void sub_block_sums(const uint8_t* pb, const uint8_t* const* xb, int c0, int chunks, int32x4_t (*part)[NT]) {
    DS4_TILE_LOOP
    for (int v = 0; v < kRowVecs; ++v)
        DS4_TILE_LOOP
        for (int t = 0; t < NT; ++t) part[v][t] = vdupq_n_s32(0);
    for (int c = c0; c < c0 + chunks; ++c) {
        int8x16_t a[NT];
        DS4_TILE_LOOP
        for (int t = 0; t < NT; ++t) a[t] = vld1q_s8(reinterpret_cast<const int8_t*>(xb[t] + 4 + 16 * c));
        dot16<NT>(part, pb + c * 4 * kRowVecs * kVec, a);
    }
}

// The min term sum_j mins[j][row] * bsum_j(token) for `count` entries; bsum_j is the sum of the
// `pair` consecutive int16 bsums of entry j (Q2_K: 1 per 16 codes; Q4_K: 2 per 32).
template <int NT>
inline void min_terms(const int16_t* mins, const uint8_t* const* xb, int count, int pair, int32x4_t (*out)[NT]) {
    DS4_TILE_LOOP
    for (int t = 0; t < NT; ++t) out[0][t] = out[1][t] = vdupq_n_s32(0);
    for (int j = 0; j < count; ++j) {
        const int16x8_t m = vld1q_s16(mins + j * kRows);
        DS4_TILE_LOOP
        for (int t = 0; t < NT; ++t) {
            int16_t bs = load_i16(xb[t] + 260 + 2 * pair * j);
            if (pair == 2) bs = (int16_t)(bs + load_i16(xb[t] + 262 + 4 * j));  // |bsum| <= 2048: no overflow
            out[0][t] = vmlal_n_s16(out[0][t], vget_low_s16(m), bs);
            out[1][t] = vmlal_high_n_s16(out[1][t], m, bs);
        }
    }
}

template <int NT>
inline void store_tile(const GemmGroup& g, int64_t t0, const float32x4_t (*acc)[NT]) {
    DS4_TILE_LOOP
    for (int t = 0; t < NT; ++t) {
        float v[kRows];
        vst1q_f32(v, acc[0][t]);
        vst1q_f32(v + 4, acc[1][t]);
        float* y = g.y[t0 + t] + g.row0;
        for (int r = 0; r < g.nrows; ++r) y[r] = v[r];
    }
}

template <int NT>
inline void token_blocks(const GemmGroup& g, int64_t t0, int64_t b, const uint8_t** xb) {
    DS4_TILE_LOOP
    for (int t = 0; t < NT; ++t) xb[t] = g.xq + (t0 + t) * g.act_bytes + b * (int64_t)sizeof(BlockQ8K);
}

template <int NT>
void tile_q2_k(const GemmGroup& g, int64_t t0) {
    float32x4_t sumf[kRowVecs][NT];
    DS4_TILE_LOOP
    for (int v = 0; v < kRowVecs; ++v)
        DS4_TILE_LOOP
        for (int t = 0; t < NT; ++t) sumf[v][t] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < g.n / QK; ++b) {
        const uint8_t* pb = g.panel + b * kQ2KBlk;
        const uint8_t* xb[NT];
        token_blocks<NT>(g, t0, b, xb);
        int32x4_t isum[kRowVecs][NT];
        sub_block_sums<NT>(pb, xb, 0, QK / 16, isum);  // sub-block scales are in the panel bytes
        int32x4_t summs[kRowVecs][NT];
        min_terms<NT>(reinterpret_cast<const int16_t*>(pb + kCodes256), xb, 16, 1, summs);
        const float* d = fptr(pb + kCodes256 + 16 * kVec);
        const float* dm = d + kRows;
        DS4_TILE_LOOP
        for (int v = 0; v < kRowVecs; ++v) {
            const float32x4_t dv = vld1q_f32(d + 4 * v), dmv = vld1q_f32(dm + 4 * v);
            DS4_TILE_LOOP
            for (int t = 0; t < NT; ++t) {
                const float yd = load_f32(xb[t]);
                const float32x4_t dall = vmulq_n_f32(dv, yd), dmin = vmulq_n_f32(dmv, -yd);
                sumf[v][t] = vaddq_f32(sumf[v][t], vmulq_f32(dmin, vcvtq_f32_s32(summs[v][t])));
                sumf[v][t] = vaddq_f32(sumf[v][t], vmulq_f32(dall, vcvtq_f32_s32(isum[v][t])));
            }
        }
    }
    store_tile<NT>(g, t0, sumf);
}

template <int NT>
void tile_q4_k(const GemmGroup& g, int64_t t0) {
    float32x4_t sumf[kRowVecs][NT];
    DS4_TILE_LOOP
    for (int v = 0; v < kRowVecs; ++v)
        DS4_TILE_LOOP
        for (int t = 0; t < NT; ++t) sumf[v][t] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < g.n / QK; ++b) {
        const uint8_t* pb = g.panel + b * kQ4KBlk;
        const int32_t* scales = reinterpret_cast<const int32_t*>(pb + kCodes256);
        const uint8_t* xb[NT];
        token_blocks<NT>(g, t0, b, xb);
        int32x4_t isum[kRowVecs][NT];
        DS4_TILE_LOOP
        for (int v = 0; v < kRowVecs; ++v)
            DS4_TILE_LOOP
            for (int t = 0; t < NT; ++t) isum[v][t] = vdupq_n_s32(0);
        for (int sub = 0; sub < 8; ++sub) {
            int32x4_t part[kRowVecs][NT];
            sub_block_sums<NT>(pb, xb, 2 * sub, 2, part);
            DS4_TILE_LOOP
            for (int v = 0; v < kRowVecs; ++v) {
                const int32x4_t sc = vld1q_s32(scales + sub * kRows + 4 * v);
                DS4_TILE_LOOP
                for (int t = 0; t < NT; ++t) isum[v][t] = vmlaq_s32(isum[v][t], part[v][t], sc);
            }
        }
        int32x4_t summs[kRowVecs][NT];
        min_terms<NT>(reinterpret_cast<const int16_t*>(pb + kCodes256 + 8 * kRows * 4), xb, 8, 2, summs);
        const float* d = fptr(pb + kCodes256 + 8 * kRows * 4 + 8 * kVec);
        const float* dm = d + kRows;
        DS4_TILE_LOOP
        for (int v = 0; v < kRowVecs; ++v) {
            const float32x4_t dv = vld1q_f32(d + 4 * v), dmv = vld1q_f32(dm + 4 * v);
            DS4_TILE_LOOP
            for (int t = 0; t < NT; ++t) {
                const float yd = load_f32(xb[t]);
                const float32x4_t dall = vmulq_n_f32(dv, yd), dmin = vmulq_n_f32(dmv, yd);
                const float32x4_t val = vsubq_f32(vmulq_f32(dall, vcvtq_f32_s32(isum[v][t])),
                                                  vmulq_f32(dmin, vcvtq_f32_s32(summs[v][t])));
                sumf[v][t] = vaddq_f32(sumf[v][t], val);
            }
        }
    }
    store_tile<NT>(g, t0, sumf);
}

template <int NT>
void tile_iq2_xxs(const GemmGroup& g, int64_t t0) {
    float32x4_t sumf[kRowVecs][NT];
    DS4_TILE_LOOP
    for (int v = 0; v < kRowVecs; ++v)
        DS4_TILE_LOOP
        for (int t = 0; t < NT; ++t) sumf[v][t] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < g.n / QK; ++b) {
        const uint8_t* pb = g.panel + b * kIq2Blk;
        const float* scales = fptr(pb + kCodes256);
        const uint8_t* xb[NT];
        token_blocks<NT>(g, t0, b, xb);
        float32x4_t s1[kRowVecs][NT], s2[kRowVecs][NT];  // even / odd sub-blocks, as the row kernel
        DS4_TILE_LOOP
        for (int v = 0; v < kRowVecs; ++v)
            DS4_TILE_LOOP
            for (int t = 0; t < NT; ++t) s1[v][t] = s2[v][t] = vdupq_n_f32(0.0f);
        for (int ib = 0; ib < 8; ++ib) {
            int32x4_t part[kRowVecs][NT];
            sub_block_sums<NT>(pb, xb, 2 * ib, 2, part);
            DS4_TILE_LOOP
            for (int v = 0; v < kRowVecs; ++v) {
                const float32x4_t sc = vld1q_f32(scales + ib * kRows + 4 * v);
                DS4_TILE_LOOP
                for (int t = 0; t < NT; ++t) {
                    float32x4_t& s = (ib & 1) ? s2[v][t] : s1[v][t];
                    s = vaddq_f32(s, vmulq_f32(vcvtq_f32_s32(part[v][t]), sc));
                }
            }
        }
        const float* d = fptr(pb + kCodes256 + 8 * kRows * 4);
        DS4_TILE_LOOP
        for (int v = 0; v < kRowVecs; ++v) {
            const float32x4_t dv = vld1q_f32(d + 4 * v);
            DS4_TILE_LOOP
            for (int t = 0; t < NT; ++t) {
                const float32x4_t dd = vmulq_n_f32(dv, load_f32(xb[t]));
                sumf[v][t] = vaddq_f32(sumf[v][t], vmulq_f32(dd, vaddq_f32(s1[v][t], s2[v][t])));
            }
        }
    }
    DS4_TILE_LOOP
    for (int v = 0; v < kRowVecs; ++v)
        DS4_TILE_LOOP
        for (int t = 0; t < NT; ++t) sumf[v][t] = vmulq_n_f32(sumf[v][t], 0.25f);
    store_tile<NT>(g, t0, sumf);
}

// Q8_0: rows row0.. (4, the last ones repeated past nrows and not stored) x NT tokens, in the row
// kernel's own lane layout; the weights are read in place.
template <int NT>
void tile_q8_0(const GemmGroup& g, int r0, int64_t t0) {
    const int64_t nb = g.n / 32;
    const uint8_t* w[kQ8Rows];
    DS4_TILE_LOOP
    for (int r = 0; r < kQ8Rows; ++r) w[r] = g.w + (r0 + r < g.nrows ? r0 + r : g.nrows - 1) * g.row_bytes + 2;
    const uint8_t* x[NT];
    DS4_TILE_LOOP
    for (int t = 0; t < NT; ++t) x[t] = g.xq + (t0 + t) * g.act_bytes;
    const float* dw = fptr(g.panel) + r0;
    float32x4_t acc[kQ8Rows][NT][2];
    DS4_TILE_LOOP
    for (int r = 0; r < kQ8Rows; ++r)
        DS4_TILE_LOOP
        for (int t = 0; t < NT; ++t) acc[r][t][0] = acc[r][t][1] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; ++b) {
        const int p = (int)(b & 1);  // even blocks into accumulator 0, odd into 1 (row kernel)
        int8x16_t wl[kQ8Rows], wh[kQ8Rows];
        DS4_TILE_LOOP
        for (int r = 0; r < kQ8Rows; ++r) {
            wl[r] = vld1q_s8(reinterpret_cast<const int8_t*>(w[r] + b * 34));
            wh[r] = vld1q_s8(reinterpret_cast<const int8_t*>(w[r] + b * 34 + 16));
        }
        DS4_TILE_LOOP
        for (int t = 0; t < NT; ++t) {
            const uint8_t* xt = x[t] + b * 36;
            const int8x16_t al = vld1q_s8(reinterpret_cast<const int8_t*>(xt + 4));
            const int8x16_t ah = vld1q_s8(reinterpret_cast<const int8_t*>(xt + 20));
            const float xd = load_f32(xt);
            DS4_TILE_LOOP
            for (int r = 0; r < kQ8Rows; ++r) {
                const int32x4_t dl = vdotq_s32(vdotq_s32(vdupq_n_s32(0), wl[r], al), wh[r], ah);
                acc[r][t][p] = vfmaq_n_f32(acc[r][t][p], vcvtq_f32_s32(dl), dw[b * kRows + r] * xd);
            }
        }
    }
    DS4_TILE_LOOP
    for (int r = 0; r < kQ8Rows; ++r) {
        if (r0 + r >= g.nrows) break;
        DS4_TILE_LOOP
        for (int t = 0; t < NT; ++t) g.y[t0 + t][g.row0 + r0 + r] = vaddvq_f32(vaddq_f32(acc[r][t][0], acc[r][t][1]));
    }
}

void run_q8_0(const GemmGroup& g) {
    decode_q8_0(g);
    for (int r0 = 0; r0 < g.nrows; r0 += kQ8Rows) {  // a 4-row tile's weights stay in L1 over the tokens
        int64_t t0 = 0;
        for (; t0 + kQ8Tile <= g.ntok; t0 += kQ8Tile) tile_q8_0<kQ8Tile>(g, r0, t0);
        if (t0 < g.ntok) tile_q8_0<1>(g, r0, t0);
    }
}

template <void (*Decode)(const GemmGroup&), template <int> class Tile>
void run_group(const GemmGroup& g) {
    Decode(g);
    int64_t t0 = 0;
    for (; t0 + kTile <= g.ntok; t0 += kTile) Tile<kTile>::run(g, t0);
    switch (g.ntok - t0) {
        case 1: Tile<1>::run(g, t0); break;
        case 2: Tile<2>::run(g, t0); break;
        case 3: Tile<3>::run(g, t0); break;
        default: break;
    }
}

template <int NT> struct TileQ2K { static void run(const GemmGroup& g, int64_t t0) { tile_q2_k<NT>(g, t0); } };
template <int NT> struct TileQ4K { static void run(const GemmGroup& g, int64_t t0) { tile_q4_k<NT>(g, t0); } };
template <int NT> struct TileIq2 { static void run(const GemmGroup& g, int64_t t0) { tile_iq2_xxs<NT>(g, t0); } };

const GemmKernels kNeon{kRows, run_q8_0, run_group<decode_q2_k, TileQ2K>, run_group<decode_q4_k, TileQ4K>,
                        run_group<decode_iq2_xxs, TileIq2>, panel_bytes, GemmCorr::None, GemmCorr::None,
                        4};

}  // namespace

const GemmKernels& neon_gemm() { return kNeon; }

#else  // no dotprod in this build: every type keeps the row kernels

const GemmKernels& neon_gemm() {
    static const GemmKernels k{8,       nullptr,        nullptr,        nullptr, nullptr,
                               [](GgmlType, int64_t) -> size_t { return 0; },
                               GemmCorr::None, GemmCorr::None, 4};
    return k;
}

#endif

}  // namespace ds4::quant
