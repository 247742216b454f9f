// Metal ops: the ratio-4 indexer (docs/metal.md, "Indexer"):
//   IndexerScores  rope_tail (queries) -> indexer_qat (Hadamard-128 + FP4 per head)
//                  -> indexer_weights_scale (w *= 1/sqrt(head_dim * n_head): the op leaves the
//                  weights scaled, as the CPU does) -> indexer_scores with w_scale 1 (w * 1 is w,
//                  so each score is the CPU's d * w[h] sum)
//   TopKMask       top_k_mask
#include <cmath>
#include <string>

#include "backend/metal/ops_rope_fp8.h"
#include "common/errors.h"

namespace ds4 {
namespace backend {
namespace metal {

namespace {

constexpr uint32_t kScoreSimdgroups = 2;   // compressed rows per threadgroup (one per simdgroup)
constexpr uint32_t kElementThreads = 64;
constexpr uint32_t kTopKThreads = 256;  // the whole selection is one threadgroup

}  // namespace

void indexer_qat_rows(MetalStream& s, const Tensor& x, int64_t rows) {
    const ds4_fp_args args{128, 128};
    s.dispatch("indexer_qat", {}, {bytes_arg(args), s.arg(x)}, {}, {1, (uint32_t)rows, 1}, {32, 1, 1});
}

bool indexer_ops_supports(Op, GgmlType t) { return t == GgmlType::F32; }

void MetalStream::indexer_scores(const IndexerScoresArgs& a) {
    if (a.head_dim != 128) {
        fail(ErrorKind::Unsupported, "indexer rows must be 128 wide (Hadamard-128), got " + std::to_string(a.head_dim));
    }
    rope_rows(*this, a.q, 1, a.n_head, a.head_dim, a.n_rot, a.pos, a.rope, false);
    indexer_qat_rows(*this, a.q, a.n_head);
    const float scale = 1.0f / std::sqrt((float)(a.head_dim * a.n_head));
    const ds4_elementwise_args ws{(uint)a.n_head, scale};
    dispatch_threads("indexer_weights_scale", {}, {bytes_arg(ws), arg(a.w)}, {}, {(uint32_t)a.n_head, 1, 1},
                     {threads_within("indexer_weights_scale", {},
                                     (uint32_t)(a.n_head < kElementThreads ? a.n_head : kElementThreads)), 1, 1});
    const ds4_indexer_args args{(uint)a.n_rows, (uint)a.n_head, (uint)a.head_dim, 1.0f};
    const uint32_t sgs = threads_within("indexer_scores", {}, 32 * kScoreSimdgroups) / 32;
    dispatch("indexer_scores", {}, {bytes_arg(args), arg(a.q), arg(a.w), arg(a.rows), arg(a.scores)}, {},
             {div_up(a.n_rows, sgs), 1, 1}, {32 * sgs, 1, 1});
}

void MetalStream::top_k_mask(const TopKMaskArgs& a) {
    const int64_t k = a.k < 0 ? 0 : a.k > 0xFFFFFFFFll ? 0xFFFFFFFFll : a.k;
    const ds4_topk_args args{(uint)a.n, (uint)k};
    if (a.n <= 0) return;
    const uint32_t threads = threads_within("top_k_mask", {}, kTopKThreads);
    dispatch("top_k_mask", {}, {bytes_arg(args), arg(a.scores), arg(a.mask)}, {4 * div_up(threads, 32)}, {1, 1, 1},
             {threads, 1, 1});
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
