// The KV compressor on Metal (docs/metal.md, "Compressor"):
//   CompressorStore  dequantize_rows (the APE row pos % ratio, read in place from the model
//                    buffer) -> compressor_store (score += APE; kv/score into the frontier row)
//   CompressorPool   compressor_pool_state -> rms_norm_f32 (weighted) -> rope_tail
//                    -> fp8_kv_roundtrip (attention lane) or indexer_qat (indexer lane)
//   CompressorShift  compressor_shift (ratio 4: rows 4..7 onto 0..3)
#include <string>

#include "backend/metal/metal_stream.h"
#include "common/errors.h"
#include "model/shape.h"

namespace ds4 {
namespace backend {
namespace metal {

void rope_rows(MetalStream& s, const Tensor& x, int64_t rows, int64_t n_head, int64_t head_dim, int64_t n_rot,
               int64_t pos0, const RopeParams& rope, bool inverse);
void fp8_rows(MetalStream& s, const Tensor& x, int64_t rows, int64_t head_dim, int64_t n_rot);
void indexer_qat_rows(MetalStream& s, const Tensor& x, int64_t rows);

namespace {

void check_ratio(int ratio, const char* op) {
    if (ratio != 4 && ratio != 128) {
        fail(ErrorKind::Unsupported, std::string(op) + ": the Metal compressor takes ratio 4 or 128, got " +
                                         std::to_string(ratio));
    }
}

}  // namespace

void compressor_store(MetalStream& s, const CompressorStoreArgs& a) {
    check_ratio(a.ratio, "compressor_store");
    const int64_t width = Shape::coff(a.ratio) * a.head_dim;
    const int64_t pos_mod = a.pos % a.ratio;
    const Tensor ape = s.scratch(Scratch::ApeRow, width, 1);
    s.dequantize_row(*a.ape, pos_mod, ape);
    ds4_comp_store_args g{(uint32_t)width, (uint32_t)Shape::frontier_row(a.ratio, a.pos), 0};
    s.kernel("compressor_store")
        .bytes(0, g)
        .buf(1, ape)
        .buf(2, a.kv_cur)
        .buf(3, a.score_cur)
        .buf(4, a.state_kv)
        .buf(5, a.state_score)
        .threads({(uint32_t)width, 1, 1}, {64, 1, 1});
}

void compressor_pool(MetalStream& s, const CompressorPoolArgs& a) {
    check_ratio(a.ratio, "compressor_pool");
    const int64_t hd = a.head_dim;
    const Tensor pooled = s.scratch(Scratch::Pooled, hd, 1);
    ds4_pool_args g{(uint32_t)hd, (uint32_t)a.ratio, (uint32_t)(Shape::coff(a.ratio) * hd)};
    s.kernel("compressor_pool_state", {FunctionConstant::boolean(0, a.ratio == 4)})
        .bytes(0, g)
        .buf(1, a.state_kv)
        .buf(2, a.state_score)
        .buf(3, pooled)
        .threads({(uint32_t)hd, 1, 1}, {(uint32_t)(hd < 64 ? hd : 64), 1, 1});
    s.rms_norm({pooled, a.out, a.norm, a.eps});
    rope_rows(s, a.out, 1, 1, hd, a.n_rot, a.pos, a.rope, false);
    if (a.fp8) {
        fp8_rows(s, a.out, 1, hd, a.n_rot);
    } else {
        indexer_qat_rows(s, a.out, 1);
    }
}

void compressor_shift(MetalStream& s, const CompressorShiftArgs& a) {
    const int64_t width = Shape::coff(4) * a.head_dim;
    ds4_comp_store_args g{(uint32_t)width, 0, 4};
    s.kernel("compressor_shift")
        .bytes(0, g)
        .buf(1, a.state_kv)
        .buf(2, a.state_score)
        .threads({(uint32_t)width, 4, 1}, {64, 1, 1});
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
