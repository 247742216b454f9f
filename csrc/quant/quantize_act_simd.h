// Vector activation quantisers (quantize_act_simd.inc), bit-identical to the scalar ones of
// quantize_act.cpp; quantize_act() picks them by the active SIMD path. nblocks whole blocks of 32
// (Q8_0-act) or 256 (Q8_K) floats each.
#pragma once
#include <cstdint>

namespace ds4 {

#if defined(DS4_ARCH_X86)
void quantize_q8_0_act_blocks_avx2(const float* x, void* out, int64_t nblocks);
void quantize_q8_0_act_blocks_avx512(const float* x, void* out, int64_t nblocks);
void quantize_q8_K_blocks_avx2(const float* x, void* out, int64_t nblocks);
void quantize_q8_K_blocks_avx512(const float* x, void* out, int64_t nblocks);
#endif

}  // namespace ds4
