// RoPE on the last n_rot dims of each head, with DeepSeek V4's YaRN frequency blend on compressed
// layers (docs/model.md §3.4). Pairs are adjacent elements (interleaved), theta built by repeated
// multiplication like upstream.
#pragma once
#include <cstdint>

#include "model/rope_params.h"

namespace ds4 {

// Rotates x[h*head_dim + head_dim-n_rot ...] for h < n_head at position pos (inverse: sin sign -1).
void rope_tail(float* x, int64_t n_head, int64_t head_dim, int64_t n_rot, int64_t pos,
               const RopeParams& p, bool inverse);

}  // namespace ds4
