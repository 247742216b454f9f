// Plain AVX-512 (AVX-512BW without VNNI) group kernels of the prefill GEMM (gemm.h,
// docs/gemm.md) for Q2_K and Q4_K.
//
// The VNNI design without vpdpbusd / vpdpwssd: the same 16-row panels (gemm_avx512_panels.inc, the
// same decoder and the same bytes), the same tiles (gemm_tiles.inc), and each 4-byte dot step is
// vpmaddubsw (unsigned panel byte x signed activation code, pairs summed in int16) + vpmaddwd by
// ones + add, as gemm_avx2.cpp does at 256 bits. The int16 pair sums cannot saturate: Q2_K panel
// bytes are sc * q <= 45 and Q4_K nibbles <= 15, so |pair| <= 2 * 45 * 128 < 32767; every int32
// block sum is therefore the VNNI kernel's, and the float finish (scalar block order) is shared,
// so the results are the scalar path's bits, like the avx512 row kernels'.
//
// Q8_0 and IQ2_XXS keep the row kernels here. Q8_0's VNNI panel holds code + 128, whose pair sums
// against int8 codes overflow int16 (2 * 255 * 128); IQ2_XXS's decoder needs AVX-512 VBMI.
#include "quant/avx512_intrinsics.h"

#include "quant/formats.h"
#include "quant/gemm.h"

namespace ds4::quant {

namespace {

constexpr int kTokTile = 8;  // tokens per register tile, as in the VNNI file

#include "quant/gemm_avx512_panels.inc"

size_t panel_bytes(GgmlType t, int64_t n) {
    switch (t) {
        case GgmlType::Q2_K: return (size_t)(n / QK * kQ2KBlk);
        case GgmlType::Q4_K: return (size_t)(n / QK * kQ4KBlk);
        default: return 0;
    }
}

inline __m512i bcast32(const uint8_t* p) { return _mm512_set1_epi32((int)load_u32(p)); }

// The 512-bit vectors of gemm_tiles.inc with AVX-512BW only (no saturation, see top).
struct Avx512Vec {
    using vi = __m512i;
    using vf = __m512;
    static constexpr int kTile = kTokTile;
    static constexpr int64_t kVec = 64, kCodes256 = ::ds4::quant::kCodes256, kQ2KBlk = ::ds4::quant::kQ2KBlk,
                             kQ4KBlk = ::ds4::quant::kQ4KBlk;
    static vi zero_i() { return _mm512_setzero_si512(); }
    static vf zero_f() { return _mm512_setzero_ps(); }
    static vi load_i(const uint8_t* p) { return _mm512_load_si512(reinterpret_cast<const void*>(p)); }
    static vf load_f(const uint8_t* p) { return _mm512_load_ps(p); }
    static vi dot4(vi acc, vi w, const uint8_t* x) {
        return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, bcast32(x)), _mm512_set1_epi16(1)));
    }
    static vi dot2(vi acc, vi m, const uint8_t* x) { return _mm512_add_epi32(acc, _mm512_madd_epi16(m, bcast32(x))); }
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

const GemmKernels kAvx512{16, nullptr, run_group<Avx512Vec, decode_q2_k, TileQ2K<Avx512Vec>::T>,
                          run_group<Avx512Vec, decode_q4_k, TileQ4K<Avx512Vec>::T>, nullptr, panel_bytes};

}  // namespace

const GemmKernels& avx512_gemm() { return kAvx512; }

}  // namespace ds4::quant
