// Metal ops: decode attention with sinks (attention.metal).
// Not ported yet: each op throws Unsupported and attention_ops_supports() says false.
#include "backend/metal/metal_stream.h"

namespace ds4 {
namespace backend {
namespace metal {

bool attention_ops_supports(Op, GgmlType) { return false; }

void MetalStream::attention(const AttentionArgs&) { metal_op_not_ported(*this, Op::Attention); }

}  // namespace metal
}  // namespace backend
}  // namespace ds4
