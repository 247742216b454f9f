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
// DS4_GEMM=off): then the caller keeps the row kernels.
HalfBlockFn active_half_block(GgmlType t);

// y[r] = dot(W row r, x) for r < rows: rows split over threads in runs of at least ~64 KiB of
// weights, each run in tiles of several rows sharing the activation loads.
void matvec_half(HalfBlockFn fn, const uint8_t* w, int64_t rows, int64_t n, const float* x, float* y,
                 ThreadPool& pool);

// y[b * rows + r] = dot(W row r, x + b * n) for b < nb: work items of (row block, token block);
// a row block's weights stay in L2 while its tokens pass in tiles, so each weight is read from
// memory once per call (small batches included) and converted to float once per tile of tokens.
void matmul_half(HalfBlockFn fn, const uint8_t* w, int64_t rows, int64_t n, const float* x, int64_t nb, float* y,
                 ThreadPool& pool);

}  // namespace ds4::quant
