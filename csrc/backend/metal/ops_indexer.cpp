// The ratio-4 indexer on Metal (docs/metal.md, "Indexer"):
//   IndexerScores  rope_tail (queries) -> indexer_qat (Hadamard-128 + FP4 per head)
//                  -> indexer_weights_scale (w *= 1/sqrt(head_dim * n_head), left scaled as on the
//                  CPU) -> indexer_scores (w_scale 1: w * 1 is w, so the scores are the CPU's form)
//   TopKMask       top_k_mask
#include <cmath>
#include <string>

#include "backend/metal/metal_stream.h"
#include "common/errors.h"

namespace ds4 {
namespace backend {
namespace metal {

void rope_rows(MetalStream& s, const Tensor& x, int64_t rows, int64_t n_head, int64_t head_dim, int64_t n_rot,
               int64_t pos0, const RopeParams& rope, bool inverse);

// Hadamard-128 then FP4 on `rows` consecutive rows of 128 floats starting at x.
void indexer_qat_rows(MetalStream& s, const Tensor& x, int64_t rows) {
    if (rows == 0) return;
    ds4_fp_args g{128, 128};
    s.kernel("indexer_qat").bytes(0, g).buf(1, x).groups({1, (uint32_t)rows, 1}, {32, 1, 1});
}

void indexer_scores(MetalStream& s, const IndexerScoresArgs& a) {
    if (a.head_dim != 128) {
        fail(ErrorKind::Unsupported, "indexer rows must be 128 wide (Hadamard-128), got " + std::to_string(a.head_dim));
    }
    rope_rows(s, a.q, 1, a.n_head, a.head_dim, a.n_rot, a.pos, a.rope, false);
    indexer_qat_rows(s, a.q, a.n_head);
    const float scale = 1.0f / std::sqrt((float)(a.head_dim * a.n_head));
    ds4_elementwise_args ws{(uint32_t)a.n_head, scale};
    s.kernel("indexer_weights_scale")
        .bytes(0, ws)
        .buf(1, a.w)
        .threads({(uint32_t)a.n_head, 1, 1}, {(uint32_t)(a.n_head < 64 ? a.n_head : 64), 1, 1});
    if (a.n_rows == 0) return;
    constexpr uint32_t kSimdgroups = 2;
    ds4_indexer_args g{(uint32_t)a.n_rows, (uint32_t)a.n_head, (uint32_t)a.head_dim, 1.0f};
    s.kernel("indexer_scores")
        .bytes(0, g)
        .buf(1, a.q)
        .buf(2, a.w)
        .buf(3, a.rows)
        .buf(4, a.scores)
        .groups({(uint32_t)((a.n_rows + kSimdgroups - 1) / kSimdgroups), 1, 1}, {32 * kSimdgroups, 1, 1});
}

void top_k_mask(MetalStream& s, const TopKMaskArgs& a) {
    if (a.n == 0) return;
    ds4_topk_args g{(uint32_t)a.n, (uint32_t)(a.k < 0 ? 0 : a.k > 0xFFFFFFFFll ? 0xFFFFFFFFll : a.k)};
    s.kernel("top_k_mask").bytes(0, g).buf(1, a.scores).buf(2, a.mask).threads({(uint32_t)a.n, 1, 1}, {64, 1, 1});
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
