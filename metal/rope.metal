// RoPE on the last n_rot dims of each head (YaRN blend on compressed layers), one thread per
// rotated pair. The angle of pair k is pos * theta_scale^k built by k successive float
// multiplications, exactly as the CPU builds it, so only sin/cos can differ on a GPU.
#include <metal_stdlib>
using namespace metal;

#include "ds4_metal_args.h"

// Rows of n_head * head_dim, in place. Grid (threads): (n_rot / 2, n_head, rows).
kernel void rope_tail(constant ds4_rope_args& a [[buffer(0)]],
                      device float* x [[buffer(1)]],
                      uint3 gid [[thread_position_in_grid]]) {
    const uint k = gid.x, h = gid.y, row = gid.z;
    float theta_extrap = float(a.pos0 + row);
    for (uint j = 0; j < k; ++j) {
        theta_extrap *= a.theta_scale;
    }
    const float theta_interp = a.freq_scale * theta_extrap;
    float theta = theta_interp;
    float mscale = a.attn_factor;
    if (a.ext_factor != 0.0f) {
        const float y = (float(k) - a.corr_low) / max(0.001f, a.corr_high - a.corr_low);
        const float ramp = (1.0f - min(1.0f, max(0.0f, y))) * a.ext_factor;
        theta = theta_interp * (1.0f - ramp) + theta_extrap * ramp;
        mscale *= a.mscale_ext;
    }
    const float c = cos(theta) * mscale;
    const float s = a.sin_sign * sin(theta) * mscale;
    device float* p = x + (ulong)row * a.n_head * a.head_dim + h * a.head_dim + (a.head_dim - a.n_rot) + 2 * k;
    const float x0 = p[0], x1 = p[1];
    p[0] = x0 * c - x1 * s;
    p[1] = x0 * s + x1 * c;
}
