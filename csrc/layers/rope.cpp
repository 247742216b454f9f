#include "layers/rope.h"

#include <cmath>
#include <vector>

namespace ds4 {

namespace {

// Rotation of one head's tail by the pair factors c[j], sn[j] (j = i/2).
void rotate_tail(float* tail, int64_t n_rot, const float* c, const float* sn) {
    for (int64_t i = 0; i < n_rot; i += 2) {
        const float x0 = tail[i];
        const float x1 = tail[i + 1];
        tail[i] = x0 * c[i / 2] - x1 * sn[i / 2];
        tail[i + 1] = x0 * sn[i / 2] + x1 * c[i / 2];
    }
}

}  // namespace

// The angles depend on the position and the pair only, so cos/sin are evaluated once per token and
// shared by its heads (the same values the per-head loop computed: the same libm calls on the same
// arguments).
void rope_tail(float* x, int64_t n_head, int64_t head_dim, int64_t n_rot, int64_t pos,
               const RopeParams& p, bool inverse) {
    const int64_t n_nope = head_dim - n_rot;
    const float sin_sign = inverse ? -1.0f : 1.0f;
    constexpr int64_t kMaxPairs = 256;
    float c_buf[kMaxPairs], sn_buf[kMaxPairs];
    std::vector<float> heap;
    float* c = c_buf;
    float* sn = sn_buf;
    if (n_rot / 2 > kMaxPairs) {
        heap.resize((size_t)n_rot);
        c = heap.data();
        sn = c + n_rot / 2;
    }
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
        c[i / 2] = std::cos(theta) * mscale;
        sn[i / 2] = sin_sign * std::sin(theta) * mscale;
        theta_extrap *= p.theta_scale;
    }
    for (int64_t h = 0; h < n_head; ++h) rotate_tail(x + h * head_dim + n_nope, n_rot, c, sn);
}

}  // namespace ds4
