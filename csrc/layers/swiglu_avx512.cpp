// AVX512 SwiGLU: swiglu_simd.inc with 16-float vectors.
#define DS4_VEC_LANES 16
#define DS4_SWIGLU_SUFFIX avx512
#include "layers/swiglu_simd.inc"
