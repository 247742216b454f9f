#include "layers/rope.h"

#include <cmath>

namespace ds4 {

void rope_tail(float* x, int64_t n_head, int64_t head_dim, int64_t n_rot, int64_t pos,
               const RopeParams& p, bool inverse) {
    const int64_t n_nope = head_dim - n_rot;
    const float sin_sign = inverse ? -1.0f : 1.0f;
    for (int64_t h = 0; h < n_head; ++h) {
        float* tail = x + h * head_dim + n_nope;
        float theta_extrap = (float)pos;
        for (int64_t i = 0; i < n_rot; i += 2) {
            const float theta_interp = p.freq_scale * theta_extrap;
            float theta = theta_interp;
            float mscale = p.attn_factor;
            if (p.ext_factor != 0.0f) {
                const float y = ((float)(i / 2) - p.corr_low) / std::fmax(0.001f, p.corr_high - p.corr_low);
                const float ramp = (1.0f - std::fmin(1.0f, std::fmax(0.0f, y))) * p.ext_factor;
                theta = theta_interp * (1.0f - ramp) + theta_extrap * ramp;
                mscale *= p.mscale_ext;
            }
            const float c = std::cos(theta) * mscale;
            const float sn = sin_sign * std::sin(theta) * mscale;
            const float x0 = tail[i];
            const float x1 = tail[i + 1];
            tail[i] = x0 * c - x1 * sn;
            tail[i + 1] = x0 * sn + x1 * c;
            theta_extrap *= p.theta_scale;
        }
    }
}

}  // namespace ds4
