// exp_weights compiled for AVX-512 (8 doubles per vector); the arithmetic is the generic build's.
#include "sampling/exp_weights.h"
#include "sampling/exp_weights.inc"

namespace ds4 {

void exp_weights_avx512(const float* x, float* w, int64_t n) { exp_weights_loop(x, w, n); }

}  // namespace ds4
