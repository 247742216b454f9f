#include "layers/hyper_connection.h"

#include <cmath>

#include "layers/numerics.h"

namespace ds4 {

void hc_split_sinkhorn(const float* mix, const float* scale, const float* base, int n, int iters, float eps,
                       float* split) {
    float* pre = split;
    float* post = split + n;
    float* c = split + 2 * n;
    for (int i = 0; i < n; ++i) {
        const float z = mix[i] * scale[0] + base[i];
        pre[i] = 1.0f / (1.0f + std::exp(-z)) + eps;
    }
    for (int i = 0; i < n; ++i) {
        const float z = mix[n + i] * scale[1] + base[n + i];
        post[i] = 2.0f / (1.0f + std::exp(-z));
    }
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

// Both loops run row-wise over n_embd (element-wise, so they vectorise) with each element's sum in
// the original order: acc = 0 + R0*w0 (+ R1*w1 ...), resp. block*post + comb*R per source.
void hc_weighted_sum(float* out, const float* R, const float* w, int64_t n_embd, int n_hc) {
    for (int64_t d = 0; d < n_embd; ++d) out[d] = 0.0f + R[d] * w[0];
    for (int h = 1; h < n_hc; ++h) {
        const float* r = R + h * n_embd;
        const float wh = w[h];
        for (int64_t d = 0; d < n_embd; ++d) out[d] += r[d] * wh;
    }
}

void hc_post(float* out, const float* block, const float* R, const float* split, int64_t n_embd, int n_hc) {
    const float* post = hc_split_post(split, n_hc);
    const float* comb = hc_split_comb(split, n_hc);
    // Columns in chunks that stay in L1 while every destination stream reads all sources.
    constexpr int64_t kChunk = 256;
    for (int64_t d0 = 0; d0 < n_embd; d0 += kChunk) {
        const int64_t m = n_embd - d0 < kChunk ? n_embd - d0 : kChunk;
        for (int dst = 0; dst < n_hc; ++dst) {
            float* o = out + dst * n_embd + d0;
            const float p = post[dst];
            for (int64_t d = 0; d < m; ++d) o[d] = block[d0 + d] * p;
            for (int src = 0; src < n_hc; ++src) {
                const float* r = R + src * n_embd + d0;
                const float cw = comb[n_hc * src + dst];
                for (int64_t d = 0; d < m; ++d) o[d] += cw * r[d];
            }
        }
    }
}

}  // namespace ds4
