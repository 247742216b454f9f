// RoPE parameters of one layer (docs/architecture.md, "numerics"): plain RoPE on
// ratio-0 layers; the compressed base with DeepSeek V4's YaRN frequency blend on compressed layers.
#pragma once

#include "model/shape.h"

namespace ds4 {

struct RopeParams {
    float freq_base = 10000.0f;
    float freq_scale = 1.0f;
    float ext_factor = 0.0f;
    float attn_factor = 1.0f;
    float corr_low = 0.0f;   // YaRN correction dims (pair indices), used when ext_factor != 0
    float corr_high = 0.0f;
    float theta_scale = 1.0f;
    float mscale_ext = 1.0f; // 1 + 0.1*ln(1/freq_scale)
};

// Parameters of layer il (ratio 0: plain RoPE; compressed: base compress_rope_freq_base + YaRN).
RopeParams rope_params_for_layer(const Shape& s, int il);

}  // namespace ds4
