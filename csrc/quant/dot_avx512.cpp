// AVX-512 (F/BW/VL/DQ) row-dot kernels. The K/IQ kernels share the AVX2 formulation (compiled
// here with AVX-512 flags); the float-weight and Q8_0 kernels use 512-bit vectors.
#include <immintrin.h>

#include "quant/dot_kernels.h"
#include "quant/formats.h"
#include "quant/iq2xxs_tables.h"

namespace ds4::quant {

namespace {
#include "quant/dot_x86_common.inc"

const DotKernels kAvx512{x86_dot_f32, x86_dot_half<false>, x86_dot_half<true>, x86_dot_q8_0,
                         x86_dot_q2_k, x86_dot_q4_k, x86_dot_iq2_xxs};
}  // namespace

const DotKernels& avx512_kernels() { return kAvx512; }

}  // namespace ds4::quant
