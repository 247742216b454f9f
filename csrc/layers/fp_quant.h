// Simulated low-precision round trips DeepSeek V4 was trained with (docs/model.md §3.5, §4.5):
// FP8 E4M3 on the non-RoPE dims of KV rows, and a Hadamard-128 + FP4 E2M1 on indexer rows.
#pragma once
#include <cmath>
#include <cstdint>

namespace ds4 {

// Block amax floors: FP8 KV blocks (upstream's 1e-4) and FP4 indexer blocks (the float of
// upstream's 2^-126 * 6, so the scale stays a normal float).
constexpr float kFp8AmaxFloor = 1.0e-4f;
constexpr float kFp4AmaxFloor = 7.052966104933725e-38f;

// Power-of-two scale of one block: 2^ceil(log2(max(amax, floor) / qmax)). `static` so that the
// per-ISA files (fp_quant_simd.inc) keep their own copy instead of sharing one at link time.
static inline float pow2_block_scale(float amax, float floor, float qmax) {
    if (amax < floor) amax = floor;
    return std::ldexp(1.0f, (int)std::ceil(std::log2(amax / qmax)));
}

// E4M3FN round-to-nearest (ties to the even code) of v, |v| clamped to 448.
float e4m3_round(float v);
// E2M1 round-to-nearest (ties to the even code) of v, |v| clamped to 6.
float e2m1_round(float v);

// FP8 round trip of dims [0, head_dim - n_rot) in blocks of 64 with power-of-two scales.
void fp8_kv_roundtrip(float* row, int64_t head_dim, int64_t n_rot);
// Unnormalised Walsh-Hadamard butterfly on 128 values, then the 1/sqrt(128) scale.
void hadamard128(float* x);
// FP4 round trip in blocks of 32 with power-of-two scales.
void fp4_roundtrip(float* x, int64_t n);
// Indexer quantisation-aware step: Hadamard-128 then FP4 (rows must be 128 wide).
void indexer_qat_row(float* x, int64_t n);

#if defined(DS4_ARCH_X86)
// The vector round trips of fp_quant_simd.inc (same bits as the scalar ones; picked by the active
// SIMD path inside fp8_kv_roundtrip / fp4_roundtrip).
void fp8_kv_roundtrip_avx2(float* row, int64_t head_dim, int64_t n_rot);
void fp8_kv_roundtrip_avx512(float* row, int64_t head_dim, int64_t n_rot);
void fp4_roundtrip_avx2(float* x, int64_t n);
void fp4_roundtrip_avx512(float* x, int64_t n);
#endif

}  // namespace ds4
