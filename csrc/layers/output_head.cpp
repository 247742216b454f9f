#include "layers/output_head.h"

#include "layers/numerics.h"

namespace ds4 {

void hc_collapse_norm(const Shape& s, const OutputHeadWeights& head, const float* H, float* y, float* flat, float* tmp,
                      ActBuffer& act, ThreadPool* pool) {
    rms_norm_no_weight(flat, H, s.hc_dim(), s.rms_eps);
    float pre[16], w[16];
    linear(head.hc_fn, flat, 1, pre, act, pool);
    const float scale = head.hc_scale.f32()[0];
    const float* base = head.hc_base.f32();
    for (int i = 0; i < s.n_hc; ++i) w[i] = sigmoid_stable(pre[i] * scale + base[i]) + s.hc_eps;
    for (int64_t d = 0; d < s.n_embd; ++d) {
        float acc = 0.0f;
        for (int h = 0; h < s.n_hc; ++h) acc += H[h * s.n_embd + d] * w[h];
        tmp[d] = acc;
    }
    rms_norm_weight(y, tmp, head.norm.f32(), s.n_embd, s.rms_eps);
}

}  // namespace ds4
