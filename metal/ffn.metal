// Elementwise FFN pieces: the clamped SwiGLU of the shared and routed experts.
#include <metal_stdlib>
using namespace metal;

#include "ds4_metal_args.h"

static float ds4_sigmoid(float x) {
    if (x >= 0.0f) {
        return 1.0f / (1.0f + exp(-x));
    }
    const float e = exp(x);
    return e / (1.0f + e);
}

// out = silu(min(g, c)) * clamp(u, -c, c) * scale. Grid (threads): (n).
kernel void swiglu(constant ds4_swiglu_args& a [[buffer(0)]],
                   device const float* g [[buffer(1)]],
                   device const float* u [[buffer(2)]],
                   device float* out [[buffer(3)]],
                   uint i [[thread_position_in_grid]]) {
    float gv = g[i], uv = u[i];
    if (a.clamp > 1.0e-6f) {
        gv = min(gv, a.clamp);
        uv = clamp(uv, -a.clamp, a.clamp);
    }
    out[i] = gv * ds4_sigmoid(gv) * uv * a.scale;
}

// Routed experts: row r of g/u (one slot, n values) scaled by the slot's route weight scales[r],
// read from the device (the router wrote it). Grid (threads): (n, rows).
kernel void swiglu_rows(constant ds4_swiglu_args& a [[buffer(0)]],
                        device const float* g [[buffer(1)]],
                        device const float* u [[buffer(2)]],
                        device const float* scales [[buffer(3)]],
                        device float* out [[buffer(4)]],
                        uint2 gid [[thread_position_in_grid]]) {
    const ulong i = (ulong)gid.y * a.n + gid.x;
    float gv = g[i], uv = u[i];
    if (a.clamp > 1.0e-6f) {
        gv = min(gv, a.clamp);
        uv = clamp(uv, -a.clamp, a.clamp);
    }
    out[i] = gv * ds4_sigmoid(gv) * uv * scales[gid.y];
}
