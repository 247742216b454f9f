// Small elementwise and data-movement ops of the graph: add, fill, the f16 round trip of rows
// stored into a cache, the compressor frontier's store and shift, and argmax.
#include <metal_stdlib>
using namespace metal;

#include "ds4_metal_args.h"

// out = a + b (out may alias a or b). Grid (threads): (n).
kernel void add_f32(constant ds4_elementwise_args& a [[buffer(0)]], device const float* x [[buffer(1)]],
                    device const float* y [[buffer(2)]], device float* out [[buffer(3)]],
                    uint i [[thread_position_in_grid]]) {
    out[i] = x[i] + y[i];
}

// Grid (threads): (n).
kernel void fill_f32(constant ds4_elementwise_args& a [[buffer(0)]], device float* out [[buffer(1)]],
                     uint i [[thread_position_in_grid]]) {
    out[i] = a.value;
}

// dst = float(half(src)), round to nearest even (the cache's f16 round trip). Grid (threads): (n).
kernel void store_row_f16(constant ds4_elementwise_args& a [[buffer(0)]], device const float* src [[buffer(1)]],
                          device float* dst [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    dst[i] = float(half(src[i]));
}

// score_cur += APE row; kv_cur and score_cur are written into frontier row a.row. The APE row
// comes dequantised (F32) from the host's table view. Grid (threads): (width).
kernel void compressor_store(constant ds4_comp_store_args& a [[buffer(0)]], device const float* ape [[buffer(1)]],
                             device const float* kv_cur [[buffer(2)]], device float* score_cur [[buffer(3)]],
                             device float* state_kv [[buffer(4)]], device float* state_score [[buffer(5)]],
                             uint j [[thread_position_in_grid]]) {
    const float s = score_cur[j] + ape[j];
    score_cur[j] = s;
    state_kv[(ulong)a.row * a.width + j] = kv_cur[j];
    state_score[(ulong)a.row * a.width + j] = s;
}

// Ratio 4: rows shift_rows .. 2*shift_rows-1 of both frontier tensors become rows 0 .. shift_rows-1.
// Grid (threads): (width, shift_rows).
kernel void compressor_shift(constant ds4_comp_store_args& a [[buffer(0)]], device float* state_kv [[buffer(1)]],
                             device float* state_score [[buffer(2)]], uint2 gid [[thread_position_in_grid]]) {
    const ulong dst = (ulong)gid.y * a.width + gid.x, src = (ulong)(gid.y + a.shift_rows) * a.width + gid.x;
    state_kv[dst] = state_kv[src];
    state_score[dst] = state_score[src];
}

// Index of the largest element (the first one on ties; NaN never wins unless all are NaN: then 0).
// One threadgroup: per-thread best over a stride, simd reductions, one slot per simdgroup.
// Grid: 1 threadgroup; threadgroup memory 2 * 32 * 4 bytes.
kernel void argmax_f32(constant ds4_elementwise_args& a [[buffer(0)]], device const float* x [[buffer(1)]],
                       device int* result [[buffer(2)]], threadgroup float* tg [[threadgroup(0)]],
                       uint tid [[thread_index_in_threadgroup]], uint ntg [[threads_per_threadgroup]],
                       uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],
                       uint nsg [[simdgroups_per_threadgroup]]) {
    float best = -INFINITY;
    uint at = 0xffffffffu;
    for (uint i = tid; i < a.n; i += ntg) {
        const float v = x[i];
        if (v > best || (v == best && i < at)) {
            best = v;
            at = i;
        }
    }
    float m = simd_max(best);
    uint idx = simd_min(best == m ? at : 0xffffffffu);
    threadgroup uint* tg_idx = (threadgroup uint*)(tg + 32);
    if (lane == 0) {
        tg[sg] = m;
        tg_idx[sg] = idx;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const float bm = lane < nsg ? tg[lane] : -INFINITY;
    const uint bi = lane < nsg ? tg_idx[lane] : 0xffffffffu;
    const float gm = simd_max(bm);
    const uint gi = simd_min(bm == gm ? bi : 0xffffffffu);
    if (tid == 0) {
        result[0] = gi == 0xffffffffu ? 0 : int(gi);
    }
}

// out[g][c] = sum over i (from 0, in order) of x[g][i][c]: each group of `rows` rows summed
// column-wise (the routed experts' slot sum). Grid (threads): (n, groups).
kernel void sum_rows(constant ds4_sum_rows_args& a [[buffer(0)]], device const float* x [[buffer(1)]],
                     device float* out [[buffer(2)]], uint2 gid [[thread_position_in_grid]]) {
    device const float* base = x + (ulong)gid.y * a.rows * a.n + gid.x;
    float acc = 0.0f;
    for (uint i = 0; i < a.rows; ++i) {
        acc += base[(ulong)i * a.n];
    }
    out[(ulong)gid.y * a.n + gid.x] = acc;
}
