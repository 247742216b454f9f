// AVX2 FP8 / FP4 round trips: fp_quant_simd.inc with 8-float vectors.
#define DS4_VEC_LANES 8
#define DS4_FP_QUANT_SUFFIX avx2
#include "layers/fp_quant_simd.inc"
