#include "model/rope_params.h"

#include <cmath>

namespace ds4 {

namespace {

float yarn_corr_dim(int n_dims, int64_t n_ctx_orig, float beta, float base) {
    return (float)n_dims * std::log((float)n_ctx_orig / (beta * 2.0f * (float)M_PI)) / (2.0f * std::log(base));
}

}  // namespace

RopeParams rope_params_for_layer(const Shape& s, int il) {
    RopeParams p;
    const bool compressed = s.ratio(il) != 0;
    p.freq_base = compressed && s.compress_rope_freq_base > 0.0f ? s.compress_rope_freq_base : s.rope_freq_base;
    p.freq_scale = compressed && s.rope_scale_factor > 0.0f ? 1.0f / s.rope_scale_factor : 1.0f;
    p.ext_factor = compressed && s.rope_scale_factor > 1.0f ? 1.0f : 0.0f;
    p.attn_factor = 1.0f;
    p.mscale_ext = 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
    if (p.ext_factor != 0.0f && p.freq_scale > 0.0f) {
        // DeepSeek V4 uses YaRN interpolation without its magnitude scaling: pre-divide so the
        // helper's mscale multiplies back to exactly 1.
        p.attn_factor /= p.mscale_ext;
    }
    p.theta_scale = std::pow(p.freq_base, -2.0f / (float)s.n_rot);
    if (p.ext_factor != 0.0f) {
        const float lo = std::floor(yarn_corr_dim(s.n_rot, s.rope_orig_ctx, s.yarn_beta_fast, p.freq_base));
        const float hi = std::ceil(yarn_corr_dim(s.n_rot, s.rope_orig_ctx, s.yarn_beta_slow, p.freq_base));
        p.corr_low = std::fmax(0.0f, lo);
        p.corr_high = std::fmin((float)(s.n_rot - 1), hi);
    }
    return p;
}

}  // namespace ds4
