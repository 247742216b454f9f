// The in-place row steps shared by the RoPE/FP8, compressor and indexer ops (one dispatch each).
#pragma once
#include "backend/metal/metal_stream.h"
#include "model/rope_params.h"

namespace ds4 {
namespace backend {
namespace metal {

// RoPE (or its inverse) on the last n_rot dims of each of n_head heads of `rows` rows of x; row r
// at position pos0 + r (rope.metal).
void rope_rows(MetalStream& s, const Tensor& x, int64_t rows, int64_t n_head, int64_t head_dim, int64_t n_rot,
               int64_t pos0, const RopeParams& rope, bool inverse);
// FP8 E4M3 round trip of dims [0, head_dim - n_rot) of `rows` rows of x (fp_quant.metal).
void fp8_rows(MetalStream& s, const Tensor& x, int64_t rows, int64_t head_dim, int64_t n_rot);
// Hadamard-128 then FP4 on `rows` consecutive rows of 128 floats (fp_quant.metal indexer_qat).
void indexer_qat_rows(MetalStream& s, const Tensor& x, int64_t rows);

}  // namespace metal
}  // namespace backend
}  // namespace ds4
