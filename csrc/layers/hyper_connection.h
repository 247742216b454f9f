// Hyper-connections (docs/model.md §3.1, §3.9): n_hc residual streams mixed into one sublayer input by
// learned pre weights, and written back through post gates and a Sinkhorn-normalised combine matrix.
#pragma once
#include <cstdint>

namespace ds4 {

// A split row holds 2*n_hc + n_hc*n_hc floats: pre[n_hc], post[n_hc], comb[n_hc*src + dst].
inline const float* hc_split_pre(const float* split) { return split; }
inline const float* hc_split_post(const float* split, int n_hc) { return split + n_hc; }
inline const float* hc_split_comb(const float* split, int n_hc) { return split + 2 * n_hc; }

// pre = sigmoid + eps, post = 2*sigmoid, comb = Sinkhorn(row softmax + eps, then column/row
// normalisations), all from the mix projection.
void hc_split_sinkhorn(const float* mix, const float* scale, const float* base, int n_hc, int iters, float eps,
                       float* split);

// out[d] = sum_h R[h][d] * w[h], h ascending from 0.
void hc_weighted_sum(float* out, const float* R, const float* w, int64_t n_embd, int n_hc);

// out[dst][d] = block[d]*post[dst] + sum_src comb[n_hc*src + dst] * R[src][d].
void hc_post(float* out, const float* block, const float* R, const float* split, int64_t n_embd, int n_hc);

}  // namespace ds4
