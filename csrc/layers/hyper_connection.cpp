#include "layers/hyper_connection.h"

#include <cmath>

#include "layers/numerics.h"

namespace ds4 {

void hc_split_sinkhorn(const float* mix, const float* scale, const float* base, int n, int iters, float eps,
                       HcSplit& out) {
    for (int i = 0; i < n; ++i) {
        const float z = mix[i] * scale[0] + base[i];
        out.pre[i] = 1.0f / (1.0f + std::exp(-z)) + eps;
    }
    for (int i = 0; i < n; ++i) {
        const float z = mix[n + i] * scale[1] + base[n + i];
        out.post[i] = 2.0f / (1.0f + std::exp(-z));
    }
    float* c = out.comb;
    // "Rows" are the contiguous groups c[n*a + 0..n-1]; "columns" stride by n.
    for (int a = 0; a < n; ++a) {
        float mx = kNeg;
        for (int b = 0; b < n; ++b) {
            const float v = mix[2 * n + n * a + b] * scale[2] + base[2 * n + n * a + b];
            c[n * a + b] = v;
            if (v > mx) mx = v;
        }
        float sum = 0.0f;
        for (int b = 0; b < n; ++b) {
            const float v = std::exp(c[n * a + b] - mx);
            c[n * a + b] = v;
            sum += v;
        }
        const float inv = 1.0f / sum;
        for (int b = 0; b < n; ++b) c[n * a + b] = c[n * a + b] * inv + eps;
    }
    auto col_norm = [&]() {
        for (int b = 0; b < n; ++b) {
            float sum = 0.0f;
            for (int a = 0; a < n; ++a) sum += c[n * a + b];
            const float inv = 1.0f / (sum + eps);
            for (int a = 0; a < n; ++a) c[n * a + b] *= inv;
        }
    };
    col_norm();
    for (int it = 1; it < iters; ++it) {
        for (int a = 0; a < n; ++a) {
            float sum = 0.0f;
            for (int b = 0; b < n; ++b) sum += c[n * a + b];
            const float inv = 1.0f / (sum + eps);
            for (int b = 0; b < n; ++b) c[n * a + b] *= inv;
        }
        col_norm();
    }
}

void hc_weighted_sum(float* out, const float* R, const float* w, int64_t n_embd, int n_hc) {
    for (int64_t d = 0; d < n_embd; ++d) {
        float acc = 0.0f;
        for (int h = 0; h < n_hc; ++h) acc += R[h * n_embd + d] * w[h];
        out[d] = acc;
    }
}

void hc_post(float* out, const float* block, const float* R, const HcSplit& s, int64_t n_embd, int n_hc) {
    for (int dst = 0; dst < n_hc; ++dst) {
        for (int64_t d = 0; d < n_embd; ++d) {
            float acc = block[d] * s.post[dst];
            for (int src = 0; src < n_hc; ++src) acc += s.comb[n_hc * src + dst] * R[src * n_embd + d];
            out[dst * n_embd + d] = acc;
        }
    }
}

void hc_pre_batch(const Shape& s, const TensorRef& fn, const TensorRef& scale, const TensorRef& base,
                  const float* H, int64_t nb, float* x, HcSplit* splits, HcScratch scratch, ActBuffer& act,
                  ThreadPool* pool) {
    const int64_t hd = s.hc_dim();
    const int mixn = s.hc_mix();
    for (int64_t b = 0; b < nb; ++b) rms_norm_no_weight(scratch.flat + b * hd, H + b * hd, hd, s.rms_eps);
    linear(fn, scratch.flat, nb, scratch.mix, act, pool);
    for (int64_t b = 0; b < nb; ++b) {
        hc_split_sinkhorn(scratch.mix + b * mixn, scale.f32(), base.f32(), s.n_hc, s.sinkhorn_iters, s.hc_eps,
                          splits[b]);
        hc_weighted_sum(x + b * s.n_embd, H + b * hd, splits[b].pre, s.n_embd, s.n_hc);
    }
}

}  // namespace ds4
