// Metal ops: the KV compressor (docs/metal.md, "Compressor"):
//   CompressorStore  dequantize_rows (APE row pos % ratio, read in place from the model buffer)
//                    -> compressor_store (score += APE; kv and score into the frontier row)
//   CompressorPool   compressor_pool_state -> rms_norm_f32 (weighted) -> rope_tail
//                    -> fp8_kv_roundtrip (attention lane) or indexer_qat (indexer lane)
//   CompressorShift  compressor_shift (ratio 4: rows 4..7 onto rows 0..3)
#include <string>

#include "backend/metal/ops_rope_fp8.h"
#include "common/errors.h"
#include "model/shape.h"

namespace ds4 {
namespace backend {
namespace metal {

namespace {

constexpr uint32_t kElementThreads = 64;

void check_ratio(int ratio, const char* op) {
    if (ratio != 4 && ratio != 128) {
        fail(ErrorKind::Unsupported, std::string("metal: ") + op + ": the compressor kernels take ratio 4 or 128, got " +
                                         std::to_string(ratio));
    }
}

}  // namespace

bool compressor_ops_supports(Op op, GgmlType t) {
    if (op == Op::CompressorStore) return quant_kernel(t) != nullptr;   // the APE table, dequantised on the device
    return t == GgmlType::F32;
}

void MetalStream::compressor_store(const CompressorStoreArgs& a) {
    check_ratio(a.ratio, "compressor_store");
    const TensorRef& ape = *a.ape;
    const QuantKernel* k = quant_kernel(ape.type);
    if (!k) fail(ErrorKind::Unsupported, "metal: compressor_store: no kernel for the APE table's type");
    const int64_t width = Shape::coff(a.ratio) * a.head_dim;
    if (ape.ne[0] != width || width % k->block_elems) {
        fail(ErrorKind::InvalidArgument, "metal: compressor_store: the APE rows are not coff * head_dim wide");
    }
    const Tensor row = scratch("compressor.ape_row", DType::F32, width, 1);
    const ds4_matvec_args deq{(uint)width, 1, (uint)ape.row_stride(), 0, 0, 0};
    dispatch_threads("dequantize_rows", {FunctionConstant::i32(0, (int32_t)ape.type)},
                     {bytes_arg(deq), arg(ape, (uint64_t)((a.pos % a.ratio) * ape.row_stride())), arg(row)}, {},
                     {div_up(width, 8), 1, 1}, {8, 4, 1});
    const ds4_comp_store_args args{(uint)width, (uint)Shape::frontier_row(a.ratio, a.pos), 0};
    dispatch_threads("compressor_store", {},
                     {bytes_arg(args), arg(row), arg(a.kv_cur), arg(a.score_cur), arg(a.state_kv), arg(a.state_score)},
                     {}, {(uint32_t)width, 1, 1}, {threads_within("compressor_store", {}, kElementThreads), 1, 1});
}

void MetalStream::compressor_pool(const CompressorPoolArgs& a) {
    check_ratio(a.ratio, "compressor_pool");
    const int64_t hd = a.head_dim;
    const Tensor pooled = scratch("compressor.pooled", DType::F32, hd, 1);
    const ds4_pool_args args{(uint)hd, (uint)a.ratio, (uint)(Shape::coff(a.ratio) * hd)};
    dispatch_threads("compressor_pool_state", {FunctionConstant::boolean(0, a.ratio == 4)},
                     {bytes_arg(args), arg(a.state_kv), arg(a.state_score), arg(pooled)}, {}, {(uint32_t)hd, 1, 1},
                     {threads_within("compressor_pool_state", {FunctionConstant::boolean(0, a.ratio == 4)},
                                     (uint32_t)(hd < kElementThreads ? hd : kElementThreads)), 1, 1});
    rms_norm({pooled, a.out, a.norm, a.eps});
    rope_rows(*this, a.out, 1, 1, hd, a.n_rot, a.pos, a.rope, false);
    if (a.fp8) {
        fp8_rows(*this, a.out, 1, hd, a.n_rot);
    } else {
        if (hd != 128) fail(ErrorKind::Unsupported, "indexer rows must be 128 wide (Hadamard-128), got " + std::to_string(hd));
        indexer_qat_rows(*this, a.out, 1);
    }
}

void MetalStream::compressor_shift(const CompressorShiftArgs& a) {
    const int64_t width = Shape::coff(4) * a.head_dim;
    const ds4_comp_store_args args{(uint)width, 0, 4};
    dispatch_threads("compressor_shift", {}, {bytes_arg(args), arg(a.state_kv), arg(a.state_score)}, {},
                     {(uint32_t)width, 4, 1}, {threads_within("compressor_shift", {}, kElementThreads), 1, 1});
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
