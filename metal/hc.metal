// Hyper-connections: the split of the mix projection into pre weights, post gates and the
// Sinkhorn-normalised combine matrix (one simdgroup per token: lane a*n+b holds comb[a][b]; row
// and column sums gather the n values by simd_shuffle and add them in the CPU's index order,
// so every value is the CPU's), the weighted stream sum, and the post step. Split rows hold
// pre[n], post[n], comb[n*n] with comb[n*src + dst].
#include <metal_stdlib>
using namespace metal;

#include "ds4_metal_args.h"

#define DS4_NEG -1.0e30f

// Grid: (tokens) threadgroups of 32 threads.
kernel void hc_split_sinkhorn(constant ds4_hc_args& a [[buffer(0)]],
                              device const float* mix [[buffer(1)]],
                              device const float* scale [[buffer(2)]],
                              device const float* base [[buffer(3)]],
                              device float* split [[buffer(4)]],
                              uint tok [[threadgroup_position_in_grid]],
                              uint lane [[thread_index_in_simdgroup]]) {
    const uint n = a.n_hc;
    device const float* m = mix + (ulong)tok * a.mix_stride;
    device float* out = split + (ulong)tok * (2 * n + n * n);
    if (lane < n) {
        const float zp = m[lane] * scale[0] + base[lane];
        out[lane] = 1.0f / (1.0f + exp(-zp)) + a.eps;
        const float zq = m[n + lane] * scale[1] + base[n + lane];
        out[n + lane] = 2.0f / (1.0f + exp(-zq));
    }
    const bool mine = lane < n * n;
    const uint ra = mine ? lane / n : 0, cb = mine ? lane % n : 0;
    float c = mine ? m[2 * n + lane] * scale[2] + base[2 * n + lane] : 0.0f;
    // Row softmax (+eps).
    float mx = DS4_NEG;
    for (uint b = 0; b < n; ++b) {
        const float v = simd_shuffle(c, ushort(ra * n + b));
        if (v > mx) {
            mx = v;
        }
    }
    c = exp(c - mx);
    float sum = 0.0f;
    for (uint b = 0; b < n; ++b) {
        sum += simd_shuffle(c, ushort(ra * n + b));
    }
    c = c * (1.0f / sum) + a.eps;
    // Column normalisation, then iters-1 rounds of row and column normalisation.
    for (uint it = 0; it < a.iters; ++it) {
        if (it > 0) {
            float rs = 0.0f;
            for (uint b = 0; b < n; ++b) {
                rs += simd_shuffle(c, ushort(ra * n + b));
            }
            c *= 1.0f / (rs + a.eps);
        }
        float cs = 0.0f;
        for (uint r = 0; r < n; ++r) {
            cs += simd_shuffle(c, ushort(r * n + cb));
        }
        c *= 1.0f / (cs + a.eps);
    }
    if (mine) {
        out[2 * n + lane] = c;
    }
}

// x[tok][d] = sum over streams h (from 0) of H[tok][h][d] * pre[h]. Grid (threads): (n_embd, tokens).
kernel void hc_weighted_sum(constant ds4_hc_args& a [[buffer(0)]],
                            device const float* H [[buffer(1)]],
                            device const float* split [[buffer(2)]],
                            device float* x [[buffer(3)]],
                            uint2 gid [[thread_position_in_grid]]) {
    const uint n = a.n_hc, d = gid.x, tok = gid.y;
    device const float* pre = split + (ulong)tok * (2 * n + n * n);
    device const float* h = H + (ulong)tok * n * a.n_embd;
    float acc = 0.0f;
    for (uint s = 0; s < n; ++s) {
        acc += h[s * a.n_embd + d] * pre[s];
    }
    x[(ulong)tok * a.n_embd + d] = acc;
}

// out[tok][dst][d] = block[tok][d] * post[dst] + sum over src (from 0) of comb[src][dst] * R[tok][src][d].
// Grid (threads): (n_embd, n_hc, tokens).
kernel void hc_post(constant ds4_hc_args& a [[buffer(0)]],
                    device const float* block [[buffer(1)]],
                    device const float* residual [[buffer(2)]],
                    device const float* split [[buffer(3)]],
                    device float* out [[buffer(4)]],
                    uint3 gid [[thread_position_in_grid]]) {
    const uint n = a.n_hc, d = gid.x, dst = gid.y, tok = gid.z;
    device const float* s = split + (ulong)tok * (2 * n + n * n);
    device const float* r = residual + (ulong)tok * n * a.n_embd;
    float acc = block[(ulong)tok * a.n_embd + d] * s[n + dst];
    for (uint src = 0; src < n; ++src) {
        acc += s[2 * n + n * src + dst] * r[src * a.n_embd + d];
    }
    out[(ulong)tok * n * a.n_embd + dst * a.n_embd + d] = acc;
}

static float ds4_sigmoid_stable(float x) {
    if (x >= 0.0f) {
        return 1.0f / (1.0f + exp(-x));
    }
    const float e = exp(x);
    return e / (1.0f + e);
}

// Output head: the stream weights sigmoid(pre * scale + base) + eps (the stable sigmoid, unlike
// the split's), written to the pre slots of a split row so hc_weighted_sum collapses the streams.
// Grid (threads): (n_hc, tokens).
kernel void hc_collapse_weights(constant ds4_hc_args& a [[buffer(0)]],
                                device const float* pre [[buffer(1)]],
                                device const float* scale [[buffer(2)]],
                                device const float* base [[buffer(3)]],
                                device float* split [[buffer(4)]],
                                uint2 gid [[thread_position_in_grid]]) {
    const uint n = a.n_hc, h = gid.x, tok = gid.y;
    const float z = pre[(ulong)tok * a.mix_stride + h] * scale[0] + base[h];
    split[(ulong)tok * (2 * n + n * n) + h] = ds4_sigmoid_stable(z) + a.eps;
}
