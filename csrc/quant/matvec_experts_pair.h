// Two routed-expert matvecs over one activation in one pool dispatch (decode's gate and up
// projections: docs/kernels.md, "decode dispatches").
#pragma once
#include <cstdint>

#include "quant/types.h"

namespace ds4 {

class ThreadPool;

// w_a and w_b each hold n_expert matrices of [rows x n] of type t. For slot i,
// y_a[i*rows + r] = dot(expert ids[i] row r of w_a, xq) and likewise y_b from w_b: the bits of
// two matvec_experts calls (kernels.h) with xq_stride 0. Throws InvalidArgument on a bad id.
void matvec_experts_pair(GgmlType t, const void* w_a, const void* w_b, int64_t n_expert, int64_t rows, int64_t n,
                         const int32_t* ids, int64_t n_ids, const void* xq, float* y_a, float* y_b,
                         ThreadPool* pool = nullptr);

}  // namespace ds4
