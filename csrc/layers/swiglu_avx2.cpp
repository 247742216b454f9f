// AVX2 SwiGLU: swiglu_simd.inc with 8-float vectors.
#define DS4_VEC_LANES 8
#define DS4_SWIGLU_SUFFIX avx2
#include "layers/swiglu_simd.inc"
