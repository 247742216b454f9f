// Metal ops: indexer scores and top-k mask (indexer.metal).
// Not ported yet: each op throws Unsupported and indexer_ops_supports() says false.
#include "backend/metal/metal_stream.h"

namespace ds4 {
namespace backend {
namespace metal {

bool indexer_ops_supports(Op, GgmlType) { return false; }

void MetalStream::indexer_scores(const IndexerScoresArgs&) { metal_op_not_ported(*this, Op::IndexerScores); }
void MetalStream::top_k_mask(const TopKMaskArgs&) { metal_op_not_ported(*this, Op::TopKMask); }

}  // namespace metal
}  // namespace backend
}  // namespace ds4
