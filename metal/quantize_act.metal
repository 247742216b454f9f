// Activation quantisation on the GPU, byte-identical to the CPU's quantize_act (docs/metal.md):
// Q8_0-act blocks of 32 (one simdgroup per block, one value per lane) and Q8_K blocks of 256
// (one simdgroup per block, eight consecutive values per lane). The mat-vec and mat-mat kernels
// then see exactly the activation bytes the CPU kernels see.
#include <metal_stdlib>
using namespace metal;

#include "ds4_metal_args.h"
#include "quant_blocks.h"

// The CPU's rounding: saturate, NaN to 0, otherwise round half to even (rint).
static int8_t ds4_round_clamp(float v) {
    if (v >= 127.0f) {
        return 127;
    }
    if (v <= -128.0f) {
        return -128;
    }
    if (v != v) {
        return 0;
    }
    return int8_t(rint(v));
}

// Grid: (n/32 blocks, rows) threadgroups of 32 threads.
kernel void quantize_q8_0_act(constant ds4_quant_act_args& args [[buffer(0)]],
                              device const float* x [[buffer(1)]],
                              device uchar* out [[buffer(2)]],
                              uint2 tg [[threadgroup_position_in_grid]],
                              uint lane [[thread_index_in_simdgroup]]) {
    const float v = x[(ulong)tg.y * args.n + tg.x * 32 + lane];
    const float amax = simd_max(fabs(v));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    device ds4_block_q8_0_act* b = (device ds4_block_q8_0_act*)(out + (ulong)tg.y * args.act_bytes) + tg.x;
    b->qs[lane] = ds4_round_clamp(v * id);
    if (lane == 0) {
        b->d = d;
    }
}

// Grid: (n/256 blocks, rows) threadgroups of 32 threads.
kernel void quantize_q8_k(constant ds4_quant_act_args& args [[buffer(0)]],
                          device const float* x [[buffer(1)]],
                          device uchar* out [[buffer(2)]],
                          uint2 tg [[threadgroup_position_in_grid]],
                          uint lane [[thread_index_in_simdgroup]]) {
    device const float* xb = x + (ulong)tg.y * args.n + tg.x * 256;
    device ds4_block_q8_k* b = (device ds4_block_q8_k*)(out + (ulong)tg.y * args.act_bytes) + tg.x;
    // The value of largest magnitude, the first one on ties (strict > in index order).
    float amax = 0.0f;
    uint first = 256;
    for (uint j = lane * 8; j < lane * 8 + 8; ++j) {
        const float ax = fabs(xb[j]);
        if (ax > amax) {
            amax = ax;
            first = j;
        }
    }
    const float block_amax = simd_max(amax);
    const uint at = simd_min(amax == block_amax ? first : 256u);
    int8_t q[8];
    float d = 0.0f;
    if (block_amax == 0.0f) {
        for (int k = 0; k < 8; ++k) {
            q[k] = 0;
        }
    } else {
        const float iscale = -127.0f / xb[at];
        for (int k = 0; k < 8; ++k) {
            q[k] = ds4_round_clamp(iscale * xb[lane * 8 + k]);
        }
        d = 1.0f / iscale;
    }
    int s = 0;
    for (int k = 0; k < 8; ++k) {
        b->qs[lane * 8 + k] = q[k];
        s += q[k];
    }
    // bsums[j] covers values 16j..16j+15: lanes 2j and 2j+1.
    s += simd_shuffle_xor(s, 1);
    if ((lane & 1) == 0) {
        b->bsums[lane / 2] = short(s);
    }
    if (lane == 0) {
        b->d = d;
    }
}
