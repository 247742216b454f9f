// Decode mat-vec y = W x for every weight type: MV_ROWS weight rows per simdgroup, the lanes of
// the simdgroup striding over the row's blocks (one block per lane per step, read in place from
// the quantised weights), each lane reusing its activation block for all MV_ROWS rows, then one
// simd_sum per row. Activations come pre-quantised (quantize_act.metal) for the quant types and
// as floats for F16/F32. Grid: (ceil(rows / (MV_ROWS * simdgroups)), n_tok) threadgroups.
#include <metal_stdlib>
using namespace metal;

#include "ds4_metal_args.h"
#include "quant_blocks.h"

#define MV_ROWS 4

template <typename Q, uint BLOCK>
static void ds4_matvec_rows(ds4_matvec_args a, device const uchar* w, device const uchar* x,
                            device float* y, uint row0, uint tok, uint lane) {
    device const typename Q::A* xb = (device const typename Q::A*)(x + (ulong)tok * a.act_bytes);
    const uint nb = a.n / BLOCK;
    float acc[MV_ROWS] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (uint b = lane; b < nb; b += 32) {
        for (uint r = 0; r < MV_ROWS; ++r) {
            if (row0 + r < a.rows) {
                device const typename Q::W* wr = (device const typename Q::W*)(w + (ulong)(row0 + r) * a.row_bytes);
                acc[r] += Q::dot(wr + b, xb + b);
            }
        }
    }
    // Every lane takes part in every simd_sum (rows past the end included) so the simdgroup
    // stays converged; only existing rows are written.
    for (uint r = 0; r < MV_ROWS; ++r) {
        const float s = simd_sum(acc[r]);
        if (lane == 0 && row0 + r < a.rows) {
            y[(ulong)tok * a.y_stride + row0 + r] = Q::finish(s);
        }
    }
}

kernel void matvec_q8_0(constant ds4_matvec_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                        device const uchar* x [[buffer(2)]], device float* y [[buffer(3)]],
                        uint2 tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                        uint nsg [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    ds4_matvec_rows<ds4_q8_0, 32>(a, w, x, y, (tg.x * nsg + sg) * MV_ROWS, tg.y, lane);
}

kernel void matvec_q2_k(constant ds4_matvec_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                        device const uchar* x [[buffer(2)]], device float* y [[buffer(3)]],
                        uint2 tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                        uint nsg [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    ds4_matvec_rows<ds4_q2_k, 256>(a, w, x, y, (tg.x * nsg + sg) * MV_ROWS, tg.y, lane);
}

kernel void matvec_q4_k(constant ds4_matvec_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                        device const uchar* x [[buffer(2)]], device float* y [[buffer(3)]],
                        uint2 tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                        uint nsg [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    ds4_matvec_rows<ds4_q4_k, 256>(a, w, x, y, (tg.x * nsg + sg) * MV_ROWS, tg.y, lane);
}

kernel void matvec_iq2_xxs(constant ds4_matvec_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                           device const uchar* x [[buffer(2)]], device float* y [[buffer(3)]],
                           uint2 tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                           uint nsg [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    ds4_matvec_rows<ds4_iq2_xxs, 256>(a, w, x, y, (tg.x * nsg + sg) * MV_ROWS, tg.y, lane);
}

kernel void matvec_f16(constant ds4_matvec_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                       device const uchar* x [[buffer(2)]], device float* y [[buffer(3)]],
                       uint2 tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                       uint nsg [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    ds4_matvec_rows<ds4_f16, 1>(a, w, x, y, (tg.x * nsg + sg) * MV_ROWS, tg.y, lane);
}

kernel void matvec_f32(constant ds4_matvec_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                       device const uchar* x [[buffer(2)]], device float* y [[buffer(3)]],
                       uint2 tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                       uint nsg [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    ds4_matvec_rows<ds4_f32, 1>(a, w, x, y, (tg.x * nsg + sg) * MV_ROWS, tg.y, lane);
}

// Routed experts (the args are taken by value: a thread copy). Threadgroup row tg.y is slot s, which multiplies expert ids[s] (checked against
// n_expert: a bad id writes NaN rows instead of reading outside the weights).
// Grid: (ceil(rows / (MV_ROWS * simdgroups)), n_slots) threadgroups.
template <typename Q, uint BLOCK>
static void ds4_matvec_expert_slot(constant ds4_matvec_experts_args& a, device const uchar* w, device const uchar* x,
                                   device const int* ids, device float* y, uint row0, uint slot, uint lane) {
    const int id = ids[slot];
    if (id < 0 || uint(id) >= a.n_expert) {
        if (lane == 0) {
            for (uint r = 0; r < MV_ROWS && row0 + r < a.rows; ++r) {
                y[(ulong)slot * a.rows + row0 + r] = NAN;
            }
        }
        return;
    }
    ds4_matvec_args m;
    m.n = a.n;
    m.rows = a.rows;
    m.row_bytes = a.row_bytes;
    m.n_tok = 1;
    m.act_bytes = 0;
    m.y_stride = 0;
    ds4_matvec_rows<Q, BLOCK>(m, w + (ulong)id * a.expert_bytes, x + (ulong)(slot / a.slots_per_x) * a.x_slot_bytes,
                              y + (ulong)slot * a.rows, row0, 0, lane);
}

kernel void matvec_experts_q8_0(constant ds4_matvec_experts_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                          device const uchar* x [[buffer(2)]], device const int* ids [[buffer(3)]],
                          device float* y [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                          uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]],
                          uint lane [[thread_index_in_simdgroup]]) {
    ds4_matvec_expert_slot<ds4_q8_0, 32>(a, w, x, ids, y, (tg.x * nsg + sg) * MV_ROWS, tg.y, lane);
}

kernel void matvec_experts_q2_k(constant ds4_matvec_experts_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                          device const uchar* x [[buffer(2)]], device const int* ids [[buffer(3)]],
                          device float* y [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                          uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]],
                          uint lane [[thread_index_in_simdgroup]]) {
    ds4_matvec_expert_slot<ds4_q2_k, 256>(a, w, x, ids, y, (tg.x * nsg + sg) * MV_ROWS, tg.y, lane);
}

kernel void matvec_experts_q4_k(constant ds4_matvec_experts_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                          device const uchar* x [[buffer(2)]], device const int* ids [[buffer(3)]],
                          device float* y [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                          uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]],
                          uint lane [[thread_index_in_simdgroup]]) {
    ds4_matvec_expert_slot<ds4_q4_k, 256>(a, w, x, ids, y, (tg.x * nsg + sg) * MV_ROWS, tg.y, lane);
}

kernel void matvec_experts_iq2_xxs(constant ds4_matvec_experts_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                          device const uchar* x [[buffer(2)]], device const int* ids [[buffer(3)]],
                          device float* y [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                          uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]],
                          uint lane [[thread_index_in_simdgroup]]) {
    ds4_matvec_expert_slot<ds4_iq2_xxs, 256>(a, w, x, ids, y, (tg.x * nsg + sg) * MV_ROWS, tg.y, lane);
}

kernel void matvec_experts_f16(constant ds4_matvec_experts_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                          device const uchar* x [[buffer(2)]], device const int* ids [[buffer(3)]],
                          device float* y [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                          uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]],
                          uint lane [[thread_index_in_simdgroup]]) {
    ds4_matvec_expert_slot<ds4_f16, 1>(a, w, x, ids, y, (tg.x * nsg + sg) * MV_ROWS, tg.y, lane);
}

kernel void matvec_experts_f32(constant ds4_matvec_experts_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                          device const uchar* x [[buffer(2)]], device const int* ids [[buffer(3)]],
                          device float* y [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                          uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]],
                          uint lane [[thread_index_in_simdgroup]]) {
    ds4_matvec_expert_slot<ds4_f32, 1>(a, w, x, ids, y, (tg.x * nsg + sg) * MV_ROWS, tg.y, lane);
}
