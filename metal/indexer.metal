// The ratio-4 indexer: scores of every compressed indexer row against the per-head (already
// RoPE'd, Hadamard-rotated, FP4-rounded) queries, and the top-k selection as a 0/1 mask.
#include <metal_stdlib>
using namespace metal;

#include "ds4_metal_args.h"

#define IDX_MAX_PER_LANE 8  // head_dim <= 256

// score[c] = sum over heads h (ascending, from 0) of max(dot(row_c, q_h), 0) * w_h * w_scale.
// One simdgroup per row: lanes split the dimensions, one simd_sum per head.
// Grid: (ceil(n_rows / simdgroups)) threadgroups of 32 * simdgroups threads.
kernel void indexer_scores(constant ds4_indexer_args& a [[buffer(0)]],
                           device const float* q [[buffer(1)]],
                           device const float* w [[buffer(2)]],
                           device const float* rows [[buffer(3)]],
                           device float* scores [[buffer(4)]],
                           uint tg [[threadgroup_position_in_grid]],
                           uint sg [[simdgroup_index_in_threadgroup]],
                           uint nsg [[simdgroups_per_threadgroup]],
                           uint lane [[thread_index_in_simdgroup]]) {
    const uint c = tg * nsg + sg;
    const uint per_lane = a.head_dim / 32;
    const uint cr = min(c, a.n_rows - 1);  // past the end: recompute the last row, write nothing
    float kv[IDX_MAX_PER_LANE];
    for (uint j = 0; j < per_lane; ++j) {
        kv[j] = rows[(ulong)cr * a.head_dim + lane + 32 * j];
    }
    float acc = 0.0f;
    for (uint h = 0; h < a.n_head; ++h) {
        float d = 0.0f;
        for (uint j = 0; j < per_lane; ++j) {
            d += kv[j] * q[h * a.head_dim + lane + 32 * j];
        }
        d = simd_sum(d);
        if (d < 0.0f) {
            d = 0.0f;
        }
        acc += d * (w[h] * a.w_scale);
    }
    if (lane == 0 && c < a.n_rows) {
        scores[c] = acc;
    }
}

// The indexer's head weights scaled in place by a.value = 1/sqrt(head_dim * n_head), as the CPU
// leaves them after scoring (the backend op returns them scaled). Scoring then runs with
// w_scale = 1, and w * 1 is w exactly, so the scores are unchanged. Grid (threads): (n_head).
kernel void indexer_weights_scale(constant ds4_elementwise_args& a [[buffer(0)]], device float* w [[buffer(1)]],
                                  uint h [[thread_position_in_grid]]) {
    w[h] = w[h] * a.value;
}

// mask[i] = 1 for the k best scores (greater score first, lower index on ties) among those above
// the -1e30 sentinel (NaN never qualifies); row 0 is also marked when fewer than k qualify.
//
// One threadgroup, O(n) work per pass instead of every row ranking itself against all n (O(n^2),
// far too slow for the tens of thousands of compressed rows of a long context):
//   1. the k-th best score as an order-preserving 32-bit key, found bit by bit from the top
//      (32 passes, each counting the qualifying keys >= a candidate: a threadgroup sum);
//   2. rows with a greater key are kept; among the rows equal to it, the lowest indices fill the
//      remaining places (a threadgroup prefix count over contiguous index chunks).
// The keys compare exactly as the floats do (-0 folded onto +0, which == calls equal), so the
// mask is the CPU's. Grid: one threadgroup of any whole number of simdgroups; threadgroup(0):
// one uint per simdgroup.
inline uint topk_key(float s) {
    const uint b = as_type<uint>(s == 0.0f ? 0.0f : s);
    return (b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u);
}

inline bool topk_qualifies(float s) { return s > -1.0e30f; }

// v summed over the threadgroup, returned to every thread.
inline uint topk_group_sum(uint v, threadgroup uint* part, uint sg, uint nsg, uint lane) {
    v = simd_sum(v);
    if (lane == 0) {
        part[sg] = v;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint total = 0;
    for (uint i = 0; i < nsg; ++i) {
        total += part[i];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // part is reused by the next call
    return total;
}

// v summed over the threads before this one (thread index order).
inline uint topk_group_prefix(uint v, threadgroup uint* part, uint sg, uint nsg, uint lane) {
    const uint before_in_simd = simd_prefix_exclusive_sum(v);
    const uint simd_total = simd_sum(v);
    if (lane == 0) {
        part[sg] = simd_total;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint before = before_in_simd;
    for (uint i = 0; i < sg; ++i) {
        before += part[i];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return before;
}

kernel void top_k_mask(constant ds4_topk_args& a [[buffer(0)]],
                       device const float* scores [[buffer(1)]],
                       device uchar* mask [[buffer(2)]],
                       threadgroup uint* part [[threadgroup(0)]],
                       uint tid [[thread_index_in_threadgroup]],
                       uint nt [[threads_per_threadgroup]],
                       uint sg [[simdgroup_index_in_threadgroup]],
                       uint nsg [[simdgroups_per_threadgroup]],
                       uint lane [[thread_index_in_simdgroup]]) {
    uint mine = 0;
    for (uint i = tid; i < a.n; i += nt) {
        mine += topk_qualifies(scores[i]) ? 1u : 0u;
    }
    const uint qualifying = topk_group_sum(mine, part, sg, nsg, lane);
    if (qualifying <= a.k) {  // every qualifying row is kept (and row 0 when fewer than k qualify)
        for (uint i = tid; i < a.n; i += nt) {
            mask[i] = (topk_qualifies(scores[i]) || (i == 0 && qualifying < a.k)) ? 1 : 0;
        }
        return;
    }
    // The largest key t with at least k qualifying keys >= t: the k-th best.
    uint kth = 0;
    for (int bit = 31; bit >= 0; --bit) {
        const uint cand = kth | (1u << bit);
        uint count = 0;
        for (uint i = tid; i < a.n; i += nt) {
            const float s = scores[i];
            count += (topk_qualifies(s) && topk_key(s) >= cand) ? 1u : 0u;
        }
        if (topk_group_sum(count, part, sg, nsg, lane) >= a.k) {
            kth = cand;
        }
    }
    uint greater = 0;
    for (uint i = tid; i < a.n; i += nt) {
        const float s = scores[i];
        greater += (topk_qualifies(s) && topk_key(s) > kth) ? 1u : 0u;
    }
    const uint ties_kept = a.k - topk_group_sum(greater, part, sg, nsg, lane);
    // Ties are taken in index order: each thread walks one contiguous chunk.
    const uint chunk = (a.n + nt - 1) / nt;
    const uint lo = min(tid * chunk, a.n), hi = min(lo + chunk, a.n);
    uint ties = 0;
    for (uint i = lo; i < hi; ++i) {
        const float s = scores[i];
        ties += (topk_qualifies(s) && topk_key(s) == kth) ? 1u : 0u;
    }
    uint rank = topk_group_prefix(ties, part, sg, nsg, lane);
    for (uint i = lo; i < hi; ++i) {
        const float s = scores[i];
        bool keep = false;
        if (topk_qualifies(s)) {
            const uint key = topk_key(s);
            if (key > kth) {
                keep = true;
            } else if (key == kth) {
                keep = rank < ties_kept;
                ++rank;
            }
        }
        mask[i] = keep ? 1 : 0;
    }
}
