// Decode attention with sinks: one threadgroup per head, its simdgroups splitting the rows (raw
// window oldest first, then the compressed rows the indexer kept). Each simdgroup runs an online
// softmax over its rows: a score is a simd_sum of the lanes' partial dots (each lane owns
// head_dim/32 dimensions), the running maximum rescales the running sum and the lane's slice of
// the weighted row sum. Simdgroup 0 starts from the sink (max = sink, sum = 1), so the sink
// enters the denominator only. The simdgroups' (max, sum, vector) triples are merged through
// threadgroup memory. Grid: (n_head) threadgroups of 32 * nsg threads; threadgroup memory
// nsg * (head_dim + 2) floats.
#include <metal_stdlib>
using namespace metal;

#include "ds4_metal_args.h"

#define ATTN_MAX_PER_LANE 16  // head_dim <= 512

// true: compressed row r is used only where mask[r] != 0; false: every compressed row.
constant bool FC_ATTN_MASKED [[function_constant(0)]];

kernel void attention_decode(constant ds4_attn_args& a [[buffer(0)]],
                             device const float* q [[buffer(1)]],
                             device const float* raw [[buffer(2)]],
                             device const float* comp [[buffer(3)]],
                             device const uchar* mask [[buffer(4)]],
                             device const float* sinks [[buffer(5)]],
                             device float* out [[buffer(6)]],
                             threadgroup float* part [[threadgroup(0)]],
                             uint h [[threadgroup_position_in_grid]],
                             uint tid [[thread_index_in_threadgroup]],
                             uint ntg [[threads_per_threadgroup]],
                             uint lane [[thread_index_in_simdgroup]],
                             uint sg [[simdgroup_index_in_threadgroup]],
                             uint nsg [[simdgroups_per_threadgroup]]) {
    const uint D = a.head_dim, per_lane = D / 32;
    device const float* qh = q + (ulong)h * D;
    float qv[ATTN_MAX_PER_LANE];
    float acc[ATTN_MAX_PER_LANE];
    for (uint j = 0; j < per_lane; ++j) {
        qv[j] = qh[lane + 32 * j];
        acc[j] = 0.0f;
    }
    float m = sg == 0 ? sinks[h] : -INFINITY;
    float l = sg == 0 ? 1.0f : 0.0f;
    const uint n_rows = a.n_raw + a.n_comp;
    for (uint r = sg; r < n_rows; r += nsg) {
        device const float* row;
        if (r < a.n_raw) {
            row = raw + (ulong)((a.raw_first + r) % a.raw_cap) * D;
        } else {
            if (FC_ATTN_MASKED && mask[r - a.n_raw] == 0) {
                continue;  // uniform across the simdgroup: no lane diverges from the collective
            }
            row = comp + (ulong)(r - a.n_raw) * D;
        }
        float d = 0.0f;
        for (uint j = 0; j < per_lane; ++j) {
            d += qv[j] * row[lane + 32 * j];
        }
        const float s = simd_sum(d) * a.scale;
        if (s > m) {
            const float corr = exp(m - s);
            l *= corr;
            for (uint j = 0; j < per_lane; ++j) {
                acc[j] *= corr;
            }
            m = s;
        }
        const float p = exp(s - m);
        l += p;
        for (uint j = 0; j < per_lane; ++j) {
            acc[j] += p * row[lane + 32 * j];
        }
    }
    // Merge the simdgroups: part[sg] = (max, sum, vector).
    threadgroup float* mine = part + sg * (D + 2);
    if (lane == 0) {
        mine[0] = m;
        mine[1] = l;
    }
    for (uint j = 0; j < per_lane; ++j) {
        mine[2 + lane + 32 * j] = acc[j];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float mx = -INFINITY;
    for (uint s = 0; s < nsg; ++s) {
        mx = max(mx, part[s * (D + 2)]);
    }
    float denom = 0.0f;
    for (uint s = 0; s < nsg; ++s) {
        denom += part[s * (D + 2) + 1] * exp(part[s * (D + 2)] - mx);
    }
    const float inv = 1.0f / denom;
    for (uint i = tid; i < D; i += ntg) {
        float o = 0.0f;
        for (uint s = 0; s < nsg; ++s) {
            o += part[s * (D + 2) + 2 + i] * exp(part[s * (D + 2)] - mx);
        }
        out[(ulong)h * D + i] = o * inv;
    }
}
