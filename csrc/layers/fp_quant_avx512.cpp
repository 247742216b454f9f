// AVX512 FP8 / FP4 round trips: fp_quant_simd.inc with 16-float vectors.
#define DS4_VEC_LANES 16
#define DS4_FP_QUANT_SUFFIX avx512
#include "layers/fp_quant_simd.inc"
