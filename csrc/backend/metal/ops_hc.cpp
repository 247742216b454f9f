// Metal ops: HC pre / post / collapse (hc.metal, norm.metal, matvec/matmul through linear()).
// Not ported yet: each op throws Unsupported and hc_ops_supports() says false.
#include "backend/metal/metal_stream.h"

namespace ds4 {
namespace backend {
namespace metal {

bool hc_ops_supports(Op, GgmlType) { return false; }

void MetalStream::hc_pre(const HcPreArgs&) { metal_op_not_ported(*this, Op::HcPre); }
void MetalStream::hc_post(const HcPostArgs&) { metal_op_not_ported(*this, Op::HcPost); }
void MetalStream::hc_collapse_norm(const HcCollapseNormArgs&) { metal_op_not_ported(*this, Op::HcCollapseNorm); }

}  // namespace metal
}  // namespace backend
}  // namespace ds4
