// One table of row-dot kernels per SIMD path. simd.cpp picks the table at run time; each
// per-ISA file (dot_avx2.cpp, dot_avx512.cpp, dot_avx512vnni.cpp, dot_neon.cpp) fills the entries it accelerates and
// leaves the rest to the scalar reference kernels (dot_scalar.cpp).
//
// Each kernel computes one row: w points at row_bytes(type, n) bytes, xq at the activation that
// quantize_act(type, ...) wrote, n is a multiple of the type's block size.
// The integer block sums are exact on every path; only the float combination order may differ.
#pragma once
#include <cstdint>

#include "quant/kernels.h"

namespace ds4::quant {

using DotFn = float (*)(const void* w, const void* xq, int64_t n);
// One row against na (1..4) activations x_stride bytes apart: out[k] = dot(w, xq + k*x_stride),
// bit-identical to the DotFn of the same table (it only shares the weight decoding).
using DotNFn = void (*)(const void* w, const void* xq, int64_t x_stride, int na, int64_t n, float* out);

// Decode form of a row kernel whose activation is rearranged once per matvec (prep_bytes(n)
// bytes, written by PrepFn from quantize_act's output) instead of once per row. Bit-identical to
// the DotFn of the same table.
using PrepBytesFn = int64_t (*)(int64_t n);
using PrepFn = void (*)(const void* xq, int64_t n, void* prep);
using DotPrepFn = float (*)(const void* w, const void* prep, int64_t n);
// Small-batch form (matmul): one row against na (1..kPreparedMaxN) prepared activations
// stride bytes apart, the row's bytes loaded once: out[k] == dot(w, prep + k*stride, n), bitwise.
using DotPrepNFn = void (*)(const void* w, const void* prep, int64_t stride, int na, int64_t n, float* out);
constexpr int kPreparedMaxN = 8;

// Optional: `rows` consecutive rows (row_bytes apart) against one activation, out[r] = the DotFn
// of row r, bit-identical. For short rows (routed experts: 1-8 blocks) a call per run of rows
// shares the per-call setup and the horizontal sums between rows.
using DotRowsFn = void (*)(const void* w, int64_t row_bytes, int64_t rows, const void* xq, int64_t n, float* out);

struct PreparedDot {
    PrepBytesFn bytes = nullptr;  // nullptr: the table has no prepared form for this type
    PrepFn prepare = nullptr;
    DotPrepFn dot = nullptr;
    DotPrepNFn dot_n = nullptr;  // nullptr: no small-batch form
    // The dot prefetches the row's bytes ahead of itself as it goes, at decode_switches().q8_prefetch
    // when q8_prefetch_inline is on (the caller then issues none; docs/kernels.md, "The Q8_0 weight
    // streaming at 2 threads").
    bool prefetches = false;
};

// F16/BF16 weights: a block of nrows rows (row_bytes apart) x ntok float activations (x_stride
// floats apart) in register tiles; y[t * y_stride + r]. Each output is bit-identical to the DotFn
// of the same table (dot_half_tile.inc).
using HalfBlockFn = void (*)(const uint8_t* w, int64_t row_bytes, int64_t nrows, const float* x, int64_t x_stride,
                             int64_t ntok, int64_t n, float* y, int64_t y_stride);

struct DotKernels {
    DotFn f32;
    DotFn f16;
    DotFn bf16;
    DotFn q8_0;
    DotFn q2_k;
    DotFn q4_k;
    DotFn iq2_xxs;
    // Optional multi-activation forms (nullptr: matmul loops the DotFn).
    DotNFn q8_0_n;
    DotNFn q2_k_n;
    DotNFn q4_k_n;
    DotNFn iq2_xxs_n;
    // Optional prepared-activation form for small batches (matmul) and, where q8_0_vec_prep is
    // absent, for matvec (decode).
    PreparedDot q8_0_prep = {};
    // Optional register-tiled F16/BF16 blocks (nullptr: the row kernels run).
    HalfBlockFn f16_block = nullptr;
    HalfBlockFn bf16_block = nullptr;
    // Optional several-rows forms for matvec (nullptr: one DotFn call per row).
    DotRowsFn q2_k_rows = nullptr;
    DotRowsFn iq2_xxs_rows = nullptr;
    // Optional matvec-only prepared form (dot_n unused): one activation in its own layout.
    PreparedDot q8_0_vec_prep = {};
};

const DotKernels& scalar_kernels();
#if defined(DS4_ARCH_X86)
const DotKernels& avx2_kernels();    // dot_avx2.cpp
const DotKernels& avx512_kernels();  // dot_avx512.cpp
const DotKernels& avx512vnni_kernels();  // dot_avx512vnni.cpp (bit-identical to avx512)
#endif
#if defined(DS4_ARCH_ARM64)
const DotKernels& neon_kernels();    // dot_neon.cpp
#endif

const DotKernels& active_kernels();   // simd.cpp: the table of the current path
DotFn dot_fn(const DotKernels& k, GgmlType t);  // throws Unsupported for non-weight types
DotNFn dot_n_fn(const DotKernels& k, GgmlType t);  // nullptr when the table has none for t
PreparedDot prepared_dot(const DotKernels& k, GgmlType t);  // members nullptr when none for t
PreparedDot prepared_vec_dot(const DotKernels& k, GgmlType t);  // matvec's form (prepared_dot's if none)
DotRowsFn dot_rows_fn(const DotKernels& k, GgmlType t);  // nullptr when the table has none for t

}  // namespace ds4::quant
