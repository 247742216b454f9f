// AVX-512 + VNNI row-dot kernels: the table of dot_avx512_common.inc built with -mavx512vnni, so
// the integer steps use vpdpbusd (Q8_0) and vpdpwssd (Q2_K, IQ2_XXS, multi-activation Q4_K), and
// Q8_0 gathers its group scales. Every int32 block sum and every float operation is the one of the
// plain AVX-512 table: results are bit-identical to it. (IQ2_XXS with the AVX2 block's inserted
// grid rows instead of gathers measured slower here: matvec 7.0 vs 8.1 GB/s.)
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

DotKernels make_avx512vnni_table() {
    DotKernels k = make_avx512_table();
    // Q4_K: one activation keeps the AVX2 build (matvec 4096x4096: 19.5 GB/s vs 16.2 for this
    // build); several use this build's vpdpwssd form (matmul b=512: 161 vs 149 GFLOP/s). Both
    // form the scalar int32 block sums and float expression, so they agree bit for bit.
    k.q4_k_n = DS4_X86_MULTI(x86_q4_k_n);
    return k;
}
}  // namespace

const DotKernels& avx512vnni_kernels() {
    static const DotKernels k = make_avx512vnni_table();
    return k;
}

}  // namespace ds4::quant
