// Metal ops: compressor store / pool / shift (compressor.metal, misc.metal).
// Not ported yet: each op throws Unsupported and compressor_ops_supports() says false.
#include "backend/metal/metal_stream.h"

namespace ds4 {
namespace backend {
namespace metal {

bool compressor_ops_supports(Op, GgmlType) { return false; }

void MetalStream::compressor_store(const CompressorStoreArgs&) { metal_op_not_ported(*this, Op::CompressorStore); }
void MetalStream::compressor_pool(const CompressorPoolArgs&) { metal_op_not_ported(*this, Op::CompressorPool); }
void MetalStream::compressor_shift(const CompressorShiftArgs&) { metal_op_not_ported(*this, Op::CompressorShift); }

}  // namespace metal
}  // namespace backend
}  // namespace ds4
