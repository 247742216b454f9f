// AVX512 activation quantisers: quantize_act_simd.inc with 16-float vectors.
#define DS4_VEC_LANES 16
#define DS4_QUANT_ACT_SUFFIX avx512
#include "quant/quantize_act_simd.inc"
