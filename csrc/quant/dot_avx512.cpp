// AVX-512 (F/BW/VL/DQ) row-dot kernels: the table of dot_avx512_common.inc built without VNNI.
#include "quant/avx512_intrinsics.h"

#include "common/decode_switches.h"  // the F16/BF16 one-token prefetch distance (dot_half_tile.inc)
#include "quant/dot_kernels.h"
#include "quant/formats.h"
#include "quant/iq2xxs_tables.h"

namespace ds4::quant {

namespace {
#include "quant/dot_avx512_common.inc"
}  // namespace

const DotKernels& avx512_kernels() {
    static const DotKernels k = make_avx512_table();
    return k;
}

}  // namespace ds4::quant
