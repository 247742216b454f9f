// RopeTail and Fp8KvRoundtrip on Metal: one kernel each (rope_tail, fp8_kv_roundtrip), in place.
#include <string>

#include "backend/metal/metal_stream.h"
#include "common/errors.h"

namespace ds4 {
namespace backend {
namespace metal {

ds4_rope_args rope_args(int64_t n_head, int64_t head_dim, int64_t n_rot, int64_t pos0, const RopeParams& r,
                        bool inverse) {
    if (pos0 < 0 || pos0 > 0xFFFFFFFFll) fail(ErrorKind::InvalidArgument, "rope_tail: position out of 32-bit range");
    ds4_rope_args g{};
    g.n_head = (uint32_t)n_head;
    g.head_dim = (uint32_t)head_dim;
    g.n_rot = (uint32_t)n_rot;
    g.pos0 = (uint32_t)pos0;
    g.freq_scale = r.freq_scale;
    g.ext_factor = r.ext_factor;
    g.attn_factor = r.attn_factor;
    g.corr_low = r.corr_low;
    g.corr_high = r.corr_high;
    g.theta_scale = r.theta_scale;
    g.mscale_ext = r.mscale_ext;
    g.sin_sign = inverse ? -1.0f : 1.0f;
    return g;
}

void rope_rows(MetalStream& s, const Tensor& x, int64_t rows, int64_t n_head, int64_t head_dim, int64_t n_rot,
               int64_t pos0, const RopeParams& rope, bool inverse) {
    if (x.width() != n_head * head_dim && rows > 1) {
        fail(ErrorKind::InvalidArgument, "rope_tail: rows must be n_head * head_dim wide on Metal");
    }
    if (n_rot % 2 || n_rot > head_dim) fail(ErrorKind::InvalidArgument, "rope_tail: n_rot must be even and <= head_dim");
    const uint32_t pairs = (uint32_t)(n_rot / 2);
    if (pairs == 0 || rows == 0 || n_head == 0) return;
    s.kernel("rope_tail")
        .bytes(0, rope_args(n_head, head_dim, n_rot, pos0, rope, inverse))
        .buf(1, x)
        .threads({pairs, (uint32_t)n_head, (uint32_t)rows}, {pairs < 32 ? pairs : 32u, 1, 1});
}

void fp8_rows(MetalStream& s, const Tensor& x, int64_t rows, int64_t head_dim, int64_t n_rot) {
    const int64_t n_nope = head_dim - n_rot;
    if (n_nope < 0 || n_nope % 64) {
        fail(ErrorKind::InvalidArgument, "fp8_kv_roundtrip: head_dim - n_rot must be a multiple of 64, got " +
                                             std::to_string(n_nope));
    }
    if (n_nope == 0 || rows == 0) return;
    ds4_fp_args g{(uint32_t)n_nope, (uint32_t)x.width()};
    s.kernel("fp8_kv_roundtrip").bytes(0, g).buf(1, x).groups({(uint32_t)(n_nope / 64), (uint32_t)rows, 1}, {32, 1, 1});
}

void rope_tail(MetalStream& s, const RopeTailArgs& a) {
    rope_rows(s, a.x, a.x.rows(), a.n_head, a.head_dim, a.n_rot, a.pos0, a.rope, a.inverse);
}

void fp8_kv_roundtrip(MetalStream& s, const Fp8KvRoundtripArgs& a) {
    fp8_rows(s, a.x, a.x.rows(), a.head_dim, a.n_rot);
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
