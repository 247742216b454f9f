// Metal ops: RoPE tail and the FP8 KV round trip (rope.metal, fp_quant.metal).
// Not ported yet: each op throws Unsupported and rope_fp8_ops_supports() says false.
#include "backend/metal/metal_stream.h"

namespace ds4 {
namespace backend {
namespace metal {

bool rope_fp8_ops_supports(Op, GgmlType) { return false; }

void MetalStream::rope_tail(const RopeTailArgs&) { metal_op_not_ported(*this, Op::RopeTail); }
void MetalStream::fp8_kv_roundtrip(const Fp8KvRoundtripArgs&) { metal_op_not_ported(*this, Op::Fp8KvRoundtrip); }

}  // namespace metal
}  // namespace backend
}  // namespace ds4
