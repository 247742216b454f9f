// RMS norms: one threadgroup per row (or per head), the sum of squares reduced by simd_sum within
// each simdgroup and across simdgroups through one float per simdgroup in threadgroup memory.
#include <metal_stdlib>
using namespace metal;

#include "ds4_metal_args.h"

// false: plain norm (x * scale); true: weighted (x * scale * w), the CPU's order.
constant bool FC_NORM_WEIGHTED [[function_constant(0)]];

// Sum of x[i]^2 over the row by the whole threadgroup. `partial` holds one float per simdgroup
// (32 floats); every thread gets the total. The trailing barrier lets a caller reuse `partial`.
static float group_sum_squares(device const float* x, uint n, uint tid, uint ntg, uint lane, uint sg, uint nsg,
                               threadgroup float* partial) {
    float s = 0.0f;
    for (uint i = tid; i < n; i += ntg) {
        s += x[i] * x[i];
    }
    s = simd_sum(s);
    if (lane == 0) {
        partial[sg] = s;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float t = lane < nsg ? partial[lane] : 0.0f;
    t = simd_sum(t);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return t;
}

// Rows of args.n floats, args.in_stride / args.out_stride floats apart; out may alias x.
kernel void rms_norm_f32(constant ds4_norm_args& args [[buffer(0)]],
                         device const float* x [[buffer(1)]],
                         device const float* w [[buffer(2)]],
                         device float* y [[buffer(3)]],
                         threadgroup float* partial [[threadgroup(0)]],
                         uint row [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]],
                         uint ntg [[threads_per_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]],
                         uint sg [[simdgroup_index_in_threadgroup]],
                         uint nsg [[simdgroups_per_threadgroup]]) {
    device const float* xr = x + (ulong)row * args.in_stride;
    device float* yr = y + (ulong)row * args.out_stride;
    const float ss = group_sum_squares(xr, args.n, tid, ntg, lane, sg, nsg, partial);
    const float scale = 1.0f / sqrt(ss / float(args.n) + args.eps);
    for (uint i = tid; i < args.n; i += ntg) {
        const float v = xr[i] * scale;
        yr[i] = FC_NORM_WEIGHTED ? v * w[i] : v;
    }
}
