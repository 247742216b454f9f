// AVX2 + FMA + F16C row-dot kernels (compiled with those flags only; chosen at run time).
#include <immintrin.h>

#include "common/decode_switches.h"  // the F16/BF16 one-token prefetch distance (dot_half_tile.inc)
#include "quant/dot_kernels.h"
#include "quant/formats.h"
#include "quant/iq2xxs_tables.h"

namespace ds4::quant {

namespace {
#include "quant/dot_x86_common.inc"

const DotKernels kAvx2{x86_dot_f32,
                       half_dot<HalfVecAvx2, false>,
                       half_dot<HalfVecAvx2, true>,
                       DS4_X86_SINGLE(x86_q8_0_n),
                       DS4_X86_SINGLE(x86_q2_k_n),
                       DS4_X86_SINGLE(x86_q4_k_n),
                       x86_single<x86_iq2_xxs_n<Iq2BlockAvx2, 1>>,
                       DS4_X86_MULTI(x86_q8_0_n),
                       DS4_X86_MULTI(x86_q2_k_n),
                       DS4_X86_MULTI(x86_q4_k_n),
                       x86_multi<x86_iq2_xxs_n<Iq2BlockAvx2, 1>, x86_iq2_xxs_n<Iq2BlockAvx2, 2>,
                                 x86_iq2_xxs_n<Iq2BlockAvx2, 3>, x86_iq2_xxs_n<Iq2BlockAvx2, 4>>,
                       {},
                       half_block<HalfVecAvx2, false>,
                       half_block<HalfVecAvx2, true>};
}  // namespace

const DotKernels& avx2_kernels() { return kAvx2; }

}  // namespace ds4::quant
