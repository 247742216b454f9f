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

constexpr int64_t kIq2Blk = kCodes256 + 8 * kVec + kVec;  // codes, scales, d

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
inline __m512i bcast32(const uint8_t* p) { return _mm512_set1_epi32((int)load_u32(p)); }

// The 512-bit vectors of gemm_tiles.inc: vpdpbusd / vpdpwssd with the activation dword broadcast.
struct VnniVec {
    using vi = __m512i;
    using vf = __m512;
    static constexpr int kTile = kTokTile;
    static constexpr int64_t kVec = 64, kCodes256 = ::ds4::quant::kCodes256, kQ2KBlk = ::ds4::quant::kQ2KBlk,
                             kQ4KBlk = ::ds4::quant::kQ4KBlk;
    static vi zero_i() { return _mm512_setzero_si512(); }
    static vf zero_f() { return _mm512_setzero_ps(); }
    static vi load_i(const uint8_t* p) { return vld(p); }
    static vf load_f(const uint8_t* p) { return _mm512_load_ps(p); }
    static vi dot4(vi acc, vi w, const uint8_t* x) { return _mm512_dpbusd_epi32(acc, w, bcast32(x)); }
    static vi dot2(vi acc, vi m, const uint8_t* x) { return _mm512_dpwssd_epi32(acc, m, bcast32(x)); }
    static vi mul32(vi a, vi b) { return _mm512_mullo_epi32(a, b); }
    static vi add32(vi a, vi b) { return _mm512_add_epi32(a, b); }
    static vf set1(float v) { return _mm512_set1_ps(v); }
    static vf mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
    static vf sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
    static vf add(vf a, vf b) { return _mm512_add_ps(a, b); }
    static vf cvt(vi v) { return _mm512_cvtepi32_ps(v); }
    static void store(const GemmGroup& g, int64_t t, vf acc) {
        _mm512_mask_storeu_ps(g.y[t] + g.row0, (__mmask16)((1u << g.nrows) - 1), acc);
    }
};

#include "quant/gemm_tiles.inc"

// The int32 block sum of Q8_0 block b for NT tokens (start value: the activation correction).
template <int NT>
inline void q8_0_isum(const GemmGroup& g, const uint8_t* const* x, const int32_t* const* corr, int64_t b,
                      __m512i* isum) {
    const uint8_t* pb = g.panel + b * kQ8_0Blk;
    for (int t = 0; t < NT; ++t) isum[t] = _mm512_set1_epi32(corr[t][b]);
    const uint8_t* xa[NT];
    for (int t = 0; t < NT; ++t) xa[t] = x[t] + b * (int64_t)sizeof(BlockQ8_0Act) + 4;
    for (int s = 0; s < 8; ++s) {
        const __m512i w = vld(pb + s * kVec);
        for (int t = 0; t < NT; ++t) isum[t] = _mm512_dpbusd_epi32(isum[t], w, bcast32(xa[t] + 4 * s));
    }
}

template <int NT>
inline __m512 q8_0_term(const GemmGroup& g, const uint8_t* xt, int64_t b, __m512i isum) {
    const __m512 d = _mm512_load_ps(g.panel + b * kQ8_0Blk + 8 * kVec);
    const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(load_f32(xt + b * (int64_t)sizeof(BlockQ8_0Act))));
    return _mm512_mul_ps(scale, _mm512_cvtepi32_ps(isum));
}

template <int NT>
void tile_q8_0(const GemmGroup& g, int64_t t0) {
    const int64_t nb = g.n / 32, groups = nb / 8, groups_per_tok = g.n / 32;
    const uint8_t* x[NT];
    const int32_t* corr[NT];
    for (int t = 0; t < NT; ++t) {
        x[t] = g.xq + (t0 + t) * g.act_bytes;
        corr[t] = g.corr + (t0 + t) * groups_per_tok;
    }
    __m512 sum[NT];
    if (groups == 0)
        for (int t = 0; t < NT; ++t) sum[t] = _mm512_setzero_ps();
    else {
        // Blocks in file order, block b into lane b % 8 (the lanes live on the stack, in L1): the
        // panel and every token's activation are read once, front to back, which the hardware
        // prefetchers follow; a lane-by-lane pass (8 strided sweeps) was ~20 % slower at 512 tokens,
        // whose activations (2.3 MiB at n = 4096) do not stay in L2. Same additions per lane.
        __m512 lane[8][NT];
        // Group 0 starts each lane as 0 + term (the very addition a zeroed lane would do: same
        // bits, -0 included) rather than zeroing the 8 x NT array first, which GCC turned into a
        // rep stos costing ~7 % of this tile in a `small` prefill (n = 1024: 4 groups per call).
        auto group = [&](int64_t gi, auto first) {
            for (int j = 0; j < 8; ++j) {
                __m512i isum[NT];
                q8_0_isum<NT>(g, x, corr, 8 * gi + j, isum);
                for (int t = 0; t < NT; ++t) {
                    const __m512 prev = decltype(first)::value ? _mm512_setzero_ps() : lane[j][t];
                    lane[j][t] = _mm512_add_ps(prev, q8_0_term<NT>(g, x[t], 8 * gi + j, isum[t]));
                }
            }
        };
        group(0, std::true_type{});
        for (int64_t gi = 1; gi < groups; ++gi) group(gi, std::false_type{});
        for (int t = 0; t < NT; ++t) {
            const __m512 a0 = _mm512_add_ps(lane[0][t], lane[4][t]), a1 = _mm512_add_ps(lane[1][t], lane[5][t]);
            const __m512 a2 = _mm512_add_ps(lane[2][t], lane[6][t]), a3 = _mm512_add_ps(lane[3][t], lane[7][t]);
            sum[t] = _mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3));
        }
    }
    for (int64_t b = groups * 8; b < nb; ++b) {
        __m512i isum[NT];
        q8_0_isum<NT>(g, x, corr, b, isum);
        for (int t = 0; t < NT; ++t) sum[t] = _mm512_add_ps(sum[t], q8_0_term<NT>(g, x[t], b, isum[t]));
    }
    store_tile<VnniVec, NT>(g, t0, sum);
}

template <int NT>
void tile_iq2_xxs(const GemmGroup& g, int64_t t0) {
    const int64_t groups_per_tok = g.n / 32;
    __m512 sumf[NT];
    for (int t = 0; t < NT; ++t) sumf[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < g.n / QK; ++b) {
        const uint8_t* pb = g.panel + b * kIq2Blk;
        const uint8_t* xb[NT];
        const int32_t* corr[NT];
        for (int t = 0; t < NT; ++t) {
            xb[t] = g.xq + (t0 + t) * g.act_bytes + b * (int64_t)sizeof(BlockQ8K);
            corr[t] = g.corr + (t0 + t) * groups_per_tok + 8 * b;
        }
        __m512i bsum[NT];
        for (int t = 0; t < NT; ++t) bsum[t] = _mm512_setzero_si512();
        for (int ib = 0; ib < 8; ++ib) {
            __m512i part[NT];
            for (int t = 0; t < NT; ++t) part[t] = _mm512_set1_epi32(corr[t][ib]);
            for (int s = 8 * ib; s < 8 * ib + 8; ++s) {
                const __m512i w = vld(pb + s * kVec);
                for (int t = 0; t < NT; ++t) part[t] = _mm512_dpbusd_epi32(part[t], w, bcast32(xb[t] + 4 + 4 * s));
            }
            const __m512i sc = vld(pb + kCodes256 + ib * kVec);
            for (int t = 0; t < NT; ++t) bsum[t] = _mm512_add_epi32(bsum[t], _mm512_mullo_epi32(part[t], sc));
        }
        const __m512 d = _mm512_load_ps(pb + kCodes256 + 8 * kVec);
        for (int t = 0; t < NT; ++t) {
            const __m512 dd = _mm512_mul_ps(d, _mm512_set1_ps(load_f32(xb[t])));
            sumf[t] = _mm512_add_ps(sumf[t], _mm512_mul_ps(dd, _mm512_cvtepi32_ps(bsum[t])));
        }
    }
    for (int t = 0; t < NT; ++t) sumf[t] = _mm512_mul_ps(_mm512_set1_ps(0.125f), sumf[t]);
    store_tile<VnniVec, NT>(g, t0, sumf);
}

// ---- group drivers: decode once, then every token tile (gemm_tiles.inc) ------------------------

template <int NT> struct TileQ8_0 { static void run(const GemmGroup& g, int64_t t0) { tile_q8_0<NT>(g, t0); } };
template <int NT> struct TileIq2 { static void run(const GemmGroup& g, int64_t t0) { tile_iq2_xxs<NT>(g, t0); } };

const GemmKernels kVnni{16, run_group<VnniVec, decode_q8_0, TileQ8_0>,
                        run_group<VnniVec, decode_q2_k, TileQ2K<VnniVec>::T>,
                        run_group<VnniVec, decode_q4_k, TileQ4K<VnniVec>::T>, run_group<VnniVec, decode_iq2_xxs, TileIq2>,
                        panel_bytes};

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
