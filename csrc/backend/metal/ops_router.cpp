// Metal ops: MoE router (router.metal).
// Not ported yet: each op throws Unsupported and router_ops_supports() says false.
#include "backend/metal/metal_stream.h"

namespace ds4 {
namespace backend {
namespace metal {

bool router_ops_supports(Op, GgmlType) { return false; }

void MetalStream::router(const RouterArgs&) { metal_op_not_ported(*this, Op::Router); }

}  // namespace metal
}  // namespace backend
}  // namespace ds4
