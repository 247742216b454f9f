// Hyper-connections (docs/model.md §3.1, §3.9): n_hc residual streams mixed into one sublayer input by
// learned pre weights, and written back through post gates and a Sinkhorn-normalised combine matrix.
#pragma once
#include <cstdint>

#include "layers/linear.h"
#include "model/shape.h"

namespace ds4 {

struct HcSplit {
    float pre[16];
    float post[16];
    float comb[256];   // comb[n_hc*src + dst]
};

// pre = sigmoid + eps, post = 2*sigmoid, comb = Sinkhorn(row softmax + eps, then column/row
// normalisations), all from the mix projection.
void hc_split_sinkhorn(const float* mix, const float* scale, const float* base, int n_hc, int iters, float eps,
                       HcSplit& out);

// out[d] = sum_h R[h][d] * w[h], h ascending from 0.
void hc_weighted_sum(float* out, const float* R, const float* w, int64_t n_embd, int n_hc);

// out[dst][d] = block[d]*post[dst] + sum_src comb[n_hc*src + dst] * R[src][d].
void hc_post(float* out, const float* block, const float* R, const HcSplit& s, int64_t n_embd, int n_hc);

struct HcScratch {
    float* flat;   // nb * hc_dim
    float* mix;    // nb * hc_mix
};

// HC pre for nb tokens: H is nb x hc_dim, x is nb x n_embd, splits[nb].
void hc_pre_batch(const Shape& s, const TensorRef& fn, const TensorRef& scale, const TensorRef& base,
                  const float* H, int64_t nb, float* x, HcSplit* splits, HcScratch scratch, ActBuffer& act,
                  ThreadPool* pool);

}  // namespace ds4
