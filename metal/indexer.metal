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
// the -1e30 sentinel (NaN never qualifies); row 0 is also marked when fewer than k qualify. Each
// thread ranks its own row by counting the rows that beat it (O(n) per thread, no communication):
// exact, and cheap for decode-sized n. Grid (threads): (n).
kernel void top_k_mask(constant ds4_topk_args& a [[buffer(0)]],
                       device const float* scores [[buffer(1)]],
                       device uchar* mask [[buffer(2)]],
                       uint i [[thread_position_in_grid]]) {
    const float si = scores[i];
    const bool qi = si > -1.0e30f;
    uint better = 0, qualifying = 0;
    for (uint j = 0; j < a.n; ++j) {
        const float sj = scores[j];
        if (!(sj > -1.0e30f)) {
            continue;
        }
        ++qualifying;
        if (sj > si || (sj == si && j < i)) {
            ++better;
        }
    }
    bool keep = qi && better < a.k;
    if (i == 0 && qualifying < a.k) {
        keep = true;
    }
    mask[i] = keep ? 1 : 0;
}
