// RoPE on the last n_rot dims of each head, with DeepSeek V4's YaRN frequency blend on compressed
// layers (docs/model.md §3.4). Pairs are adjacent elements (interleaved), theta built by repeated
// multiplication like upstream.
#pragma once
#include <cstdint>

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

// Rotates x[h*head_dim + head_dim-n_rot ...] for h < n_head at position pos (inverse: sin sign -1).
void rope_tail(float* x, int64_t n_head, int64_t head_dim, int64_t n_rot, int64_t pos,
               const RopeParams& p, bool inverse);

}  // namespace ds4
