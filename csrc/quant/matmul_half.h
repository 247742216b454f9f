// F16/BF16 weights in register tiles (docs/gemm.md, "Half-precision weights"): the drivers that
// split a matrix x batch over threads and call the active path's HalfBlockFn (dot_kernels.h).
// Every output is bit-identical to the path's row kernel, for any thread count and batch size.
#pragma once
#include <cstdint>

#include "quant/dot_kernels.h"
#include "quant/types.h"

namespace ds4 {
class ThreadPool;
}

namespace ds4::quant {

// The active path's block kernel for t, or nullptr (not F16/BF16, no tiles on this path, or
// DS4_GEMM=off / DS4_GEMM=rows-half): then the caller keeps the row kernels.
HalfBlockFn active_half_block(GgmlType t);

// x itself when it starts on a 64-byte boundary and n % 16 == 0 (*stride = n); otherwise a copy
// in a buffer of the calling thread (valid until its next call) whose nb activations start on
// 64-byte boundaries, *stride floats apart. The row kernels and tiles load whole 64-byte vectors:
// from misaligned addresses every load spans two cache lines.
const float* aligned_activations(const float* x, int64_t n, int64_t nb, int64_t* stride);

// y[b * rows + r] = dot(W row r, x + b * n) for b < nb: work items of (row block, token block);
// a row block's weights stay in L2 while its tokens pass in tiles, so each weight is read from
// memory once per call (small batches included) and converted to float once per tile of tokens.
void matmul_half(HalfBlockFn fn, const uint8_t* w, int64_t rows, int64_t n, const float* x, int64_t nb, float* y,
                 ThreadPool& pool);

}  // namespace ds4::quant
