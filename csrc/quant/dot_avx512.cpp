// AVX-512 (F/BW/VL/DQ) row-dot kernels: the table of dot_avx512_common.inc built without VNNI.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
// GCC 12's AVX-512 headers trip -W(maybe-)uninitialized on their own _mm512_undefined_* idiom
// (GCC PR 105593, fixed in 13); nothing in this file reads an uninitialised value.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

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
