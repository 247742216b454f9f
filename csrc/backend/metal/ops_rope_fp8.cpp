// Metal ops: RoPE tail (rope.metal) and the FP8 KV round trip (fp_quant.metal), both in place;
// rope_rows / fp8_rows are shared with the compressor and indexer ops (ops_rope_fp8.h).
#include "backend/metal/ops_rope_fp8.h"

#include <string>

#include "common/errors.h"

namespace ds4 {
namespace backend {
namespace metal {

namespace {

ds4_rope_args rope_args(int64_t n_head, int64_t head_dim, int64_t n_rot, int64_t pos0, int64_t rows,
                        const RopeParams& r, bool inverse) {
    if (pos0 < 0 || pos0 + rows > 0xFFFFFFFFll) {
        fail(ErrorKind::InvalidArgument, "metal: rope_tail: positions past 2^32 (the kernel's uint)");
    }
    return ds4_rope_args{(uint)n_head, (uint)head_dim, (uint)n_rot, (uint)pos0, r.freq_scale, r.ext_factor,
                         r.attn_factor, r.corr_low, r.corr_high, r.theta_scale, r.mscale_ext, inverse ? -1.0f : 1.0f};
}

}  // namespace

void rope_rows(MetalStream& s, const Tensor& x, int64_t rows, int64_t n_head, int64_t head_dim, int64_t n_rot,
               int64_t pos0, const RopeParams& rope, bool inverse) {
    if (rows > 1 && x.width() != n_head * head_dim) {
        fail(ErrorKind::InvalidArgument, "metal: rope_tail: rows must be n_head * head_dim floats wide");
    }
    if (n_rot % 2 || n_rot > head_dim) fail(ErrorKind::InvalidArgument, "metal: rope_tail: n_rot must be even and <= head_dim");
    const uint32_t pairs = (uint32_t)(n_rot / 2);
    const ds4_rope_args args = rope_args(n_head, head_dim, n_rot, pos0, rows, rope, inverse);
    s.dispatch_threads("rope_tail", {}, {bytes_arg(args), s.arg(x)}, {}, {pairs, (uint32_t)n_head, (uint32_t)rows},
                       {pairs < 32 ? pairs : 32u, 1, 1});
}

void fp8_rows(MetalStream& s, const Tensor& x, int64_t rows, int64_t head_dim, int64_t n_rot) {
    const int64_t n_nope = head_dim - n_rot;
    if (n_nope < 0 || n_nope % 64) {
        fail(ErrorKind::InvalidArgument, "metal: fp8_kv_roundtrip: head_dim - n_rot must be a multiple of 64, got " +
                                             std::to_string(n_nope));
    }
    const ds4_fp_args args{(uint)n_nope, (uint)x.width()};
    s.dispatch("fp8_kv_roundtrip", {}, {bytes_arg(args), s.arg(x)}, {}, {(uint32_t)(n_nope / 64), (uint32_t)rows, 1},
               {32, 1, 1});
}

bool rope_fp8_ops_supports(Op, GgmlType t) { return t == GgmlType::F32; }

void MetalStream::rope_tail(const RopeTailArgs& a) {
    rope_rows(*this, a.x, a.x.rows(), a.n_head, a.head_dim, a.n_rot, a.pos0, a.rope, a.inverse);
}

void MetalStream::fp8_kv_roundtrip(const Fp8KvRoundtripArgs& a) {
    fp8_rows(*this, a.x, a.x.rows(), a.head_dim, a.n_rot);
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
