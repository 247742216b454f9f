// Output head (docs/model.md §3.11): collapse the HC streams with sigmoid weights (no Sinkhorn),
// RMSNorm, then the vocabulary projection. Also serves the MTP head with its own weights.
#pragma once
#include <cstdint>

#include "layers/linear.h"
#include "model/shape.h"
#include "model/weights.h"

namespace ds4 {

// y (n_embd) = RMSNorm(sum_h H[h]*w[h]; head.norm), w[h] = sigmoid(fn·flat * scale + base) + hc_eps.
// flat needs hc_dim floats, tmp n_embd floats.
void hc_collapse_norm(const Shape& s, const OutputHeadWeights& head, const float* H, float* y, float* flat, float* tmp,
                      ActBuffer& act, ThreadPool* pool);

}  // namespace ds4
