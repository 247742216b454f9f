// AVX2 + FMA + F16C row-dot kernels (compiled with those flags only; chosen at run time).
#include <immintrin.h>

#include "quant/dot_kernels.h"
#include "quant/formats.h"
#include "quant/iq2xxs_tables.h"

namespace ds4::quant {

namespace {
#include "quant/dot_x86_common.inc"

const DotKernels kAvx2{x86_dot_f32, x86_dot_half<false>, x86_dot_half<true>, x86_dot_q8_0,
                       x86_dot_q2_k, x86_dot_q4_k, x86_dot_iq2_xxs};
}  // namespace

const DotKernels& avx2_kernels() { return kAvx2; }

}  // namespace ds4::quant
