// FP8 and FP4 round trips, bit-identical to the CPU (docs/metal.md): one simdgroup per block
// (FP8: 64 values, two per lane; FP4: 32 values, one per lane), the block's absolute maximum by
// simd_max, and the exact scale/rounding helpers of fp_quant.h. The indexer step runs the
// Walsh-Hadamard-128 butterfly in the CPU's order with four values per lane: strides 1 and 2
// inside a lane, 4..64 across lanes by simd_shuffle_xor.
#include <metal_stdlib>
using namespace metal;

#include "ds4_metal_args.h"
#include "fp_quant.h"

// Rows of args.head_dim floats, in place: dims [0, head_dim - n_rot) in blocks of 64.
// Grid: ((head_dim - n_rot) / 64, rows) threadgroups of 32 threads.
kernel void fp8_kv_roundtrip(constant ds4_fp_args& args [[buffer(0)]],
                             device float* x [[buffer(1)]],
                             uint2 tg [[threadgroup_position_in_grid]],
                             uint lane [[thread_index_in_simdgroup]]) {
    device float* b = x + (ulong)tg.y * args.row_stride + tg.x * 64;
    const float v0 = b[lane], v1 = b[lane + 32];
    float amax = simd_max(max(fabs(v0), fabs(v1)));
    amax = max(amax, 1.0e-4f);
    const float scale = ds4_pow2_scale(amax, 448.0f);
    b[lane] = ds4_e4m3_round(clamp(v0 / scale, -448.0f, 448.0f)) * scale;
    b[lane + 32] = ds4_e4m3_round(clamp(v1 / scale, -448.0f, 448.0f)) * scale;
}

// FP4 round trip of one 32-value block by one simdgroup.
static float ds4_fp4_block(float v) {
    const float amax = max(simd_max(fabs(v)), 7.052966104933725e-38f);
    const float scale = ds4_pow2_scale(amax, 6.0f);
    return ds4_e2m1_round(clamp(v / scale, -6.0f, 6.0f)) * scale;
}

// Rows of args.n floats (a multiple of 32), in place. Grid: (n / 32, rows) threadgroups of 32.
kernel void fp4_roundtrip(constant ds4_fp_args& args [[buffer(0)]],
                          device float* x [[buffer(1)]],
                          uint2 tg [[threadgroup_position_in_grid]],
                          uint lane [[thread_index_in_simdgroup]]) {
    device float* b = x + (ulong)tg.y * args.row_stride + tg.x * 32;
    b[lane] = ds4_fp4_block(b[lane]);
}

// The indexer's quantisation-aware step on rows of 128: Hadamard-128, x 1/sqrt(128), then FP4.
// Grid: (1, rows) threadgroups of 32 threads; lane l holds values 4l .. 4l+3.
kernel void indexer_qat(constant ds4_fp_args& args [[buffer(0)]],
                        device float* x [[buffer(1)]],
                        uint2 tg [[threadgroup_position_in_grid]],
                        uint lane [[thread_index_in_simdgroup]]) {
    device float* row = x + (ulong)tg.y * args.row_stride;
    float v[4];
    for (uint i = 0; i < 4; ++i) {
        v[i] = row[4 * lane + i];
    }
    // Strides 1 and 2: pairs inside the lane (low gets a + b, high gets a - b).
    for (uint stride = 1; stride < 4; stride <<= 1) {
        for (uint i = 0; i < 4; ++i) {
            if ((i & stride) == 0) {
                const float a = v[i], b = v[i + stride];
                v[i] = a + b;
                v[i + stride] = a - b;
            }
        }
    }
    // Strides 4..64: the partner is lane ^ (stride / 4); the lower lane of a pair keeps a + b.
    for (uint ls = 1; ls < 32; ls <<= 1) {
        const bool low = (lane & ls) == 0;
        for (uint i = 0; i < 4; ++i) {
            const float p = simd_shuffle_xor(v[i], ushort(ls));
            v[i] = low ? v[i] + p : p - v[i];
        }
    }
    // FP4 blocks of 32 = 8 lanes x 4 values: the block maximum over those 8 lanes.
    float m = 0.0f;
    for (uint i = 0; i < 4; ++i) {
        v[i] *= 0.08838834764831845f;
        m = max(m, fabs(v[i]));
    }
    for (uint ls = 1; ls < 8; ls <<= 1) {
        m = max(m, simd_shuffle_xor(m, ushort(ls)));
    }
    const float scale = ds4_pow2_scale(max(m, 7.052966104933725e-38f), 6.0f);
    for (uint i = 0; i < 4; ++i) {
        row[4 * lane + i] = ds4_e2m1_round(clamp(v[i] / scale, -6.0f, 6.0f)) * scale;
    }
}
