// The KV compressor's pooling step: per dimension, a softmax over the frontier's scores weights
// the frontier's rows (ratio 4: the previous window's first halves and the current window's
// second halves, interleaved per row as on the CPU). One thread per dimension, rows summed in
// the CPU's order. The pooled row then goes through rms_norm_f32 (weighted), rope_tail and
// fp8_kv_roundtrip or indexer_qat, as on the CPU.
#include <metal_stdlib>
using namespace metal;

#include "ds4_metal_args.h"

// true: ratio-4 layout (8 frontier rows of 2*head_dim); false: ratio rows of head_dim.
constant bool FC_POOL_OVERLAP [[function_constant(0)]];

// Grid (threads): (head_dim).
kernel void compressor_pool_state(constant ds4_pool_args& a [[buffer(0)]],
                                  device const float* kv [[buffer(1)]],
                                  device const float* score [[buffer(2)]],
                                  device float* out [[buffer(3)]],
                                  uint j [[thread_position_in_grid]]) {
    const uint hd = a.head_dim, width = a.width;
    float mx = -1.0e30f;
    if (FC_POOL_OVERLAP) {
        for (uint r = 0; r < 4; ++r) {
            const float sp = score[r * width + j];
            const float sc = score[(4 + r) * width + hd + j];
            if (sp > mx) {
                mx = sp;
            }
            if (sc > mx) {
                mx = sc;
            }
        }
    } else {
        for (uint r = 0; r < a.ratio; ++r) {
            const float sv = score[r * width + j];
            if (sv > mx) {
                mx = sv;
            }
        }
    }
    if (mx <= -5.0e29f) {
        out[j] = 0.0f;
        return;
    }
    float denom = 0.0f, sum = 0.0f;
    if (FC_POOL_OVERLAP) {
        for (uint r = 0; r < 4; ++r) {
            const float wp = exp(score[r * width + j] - mx);
            const float wc = exp(score[(4 + r) * width + hd + j] - mx);
            denom += wp + wc;
            sum += wp * kv[r * width + j];
            sum += wc * kv[(4 + r) * width + hd + j];
        }
    } else {
        for (uint r = 0; r < a.ratio; ++r) {
            const float w = exp(score[r * width + j] - mx);
            denom += w;
            sum += w * kv[r * width + j];
        }
    }
    out[j] = denom > 0.0f ? sum / denom : 0.0f;
}
