// Simulated low-precision round trips DeepSeek V4 was trained with (docs/model.md §3.5, §4.5):
// FP8 E4M3 on the non-RoPE dims of KV rows, and a Hadamard-128 + FP4 E2M1 on indexer rows.
#pragma once
#include <cstdint>

namespace ds4 {

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

}  // namespace ds4
