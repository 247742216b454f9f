// AVX2 activation quantisers: quantize_act_simd.inc with 8-float vectors.
#define DS4_VEC_LANES 8
#define DS4_QUANT_ACT_SUFFIX avx2
#include "quant/quantize_act_simd.inc"
