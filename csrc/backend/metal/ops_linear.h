// The mat-vec / mat-mat building blocks of the Metal ops (ops_linear.cpp), shared with the ops
// that contain a projection (HC pre / collapse, routed experts).
#pragma once
#include "backend/metal/metal_stream.h"

namespace ds4 {
namespace backend {
namespace metal {

// Activation rows a weight of kernel `k` consumes: where they are and the bytes between rows.
struct ActRows {
    Arg arg;
    int64_t stride;
};

// Quantises `rows` rows of n floats of x (contiguous) into scratch `slot` (Q8_0-act or Q8_K for
// quant types); F16/F32 weights read the floats of x in place.
ActRows quantize_rows(MetalStream& s, const QuantKernel& k, const Tensor& x, int64_t n, int64_t rows, const char* slot);

// y[tok][row] (y_stride floats between tokens) = W row . activation tok, for `rows` weight rows
// of n (w bound at the first), n_tok activation rows act_stride bytes apart: mat-vec for one
// token, tiled mat-mat for more.
void matvec_or_matmul(MetalStream& s, const QuantKernel& k, const Arg& w, int64_t n, int64_t rows, const Arg& x,
                      int64_t act_stride, int64_t n_tok, const Arg& y, int64_t y_stride);

}  // namespace metal
}  // namespace backend
}  // namespace ds4
