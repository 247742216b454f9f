// Attention on Metal (docs/metal.md, "Attention"): attention_decode, one threadgroup per head over
// the raw ring (oldest first) then the compressed rows, masked by the indexer's top-k when a mask
// is given (function constant FC_ATTN_MASKED). The graph calls it once per token.
#include <cmath>
#include <string>

#include "backend/metal/metal_stream.h"
#include "common/errors.h"

namespace ds4 {
namespace backend {
namespace metal {

namespace {

constexpr uint32_t kSimdgroups = 4;    // simdgroups per head: they split the rows
constexpr int64_t kMaxHeadDim = 512;   // ATTN_MAX_PER_LANE * 32 in attention.metal

}  // namespace

void attention(MetalStream& s, const AttentionArgs& a) {
    const int64_t D = a.head_dim;
    if (D % 32 || D > kMaxHeadDim) {
        fail(ErrorKind::Unsupported, "attention: the Metal kernel takes head_dim a multiple of 32 up to 512, got " +
                                         std::to_string(D));
    }
    if (a.n_raw < 0 || a.n_raw > a.raw_cap || a.raw_cap < 1 || a.raw_first < 0 || a.raw_first >= a.raw_cap) {
        fail(ErrorKind::InvalidArgument, "attention: raw window (cap " + std::to_string(a.raw_cap) + ", live " +
                                             std::to_string(a.n_raw) + ", first " + std::to_string(a.raw_first) +
                                             ") is inconsistent");
    }
    if (a.n_head == 0) return;
    const bool masked = a.n_comp > 0 && (bool)a.mask;
    ds4_attn_args g{};
    g.n_head = (uint32_t)a.n_head;
    g.head_dim = (uint32_t)D;
    g.raw_cap = (uint32_t)a.raw_cap;
    g.n_raw = (uint32_t)a.n_raw;
    g.raw_first = (uint32_t)a.raw_first;
    g.n_comp = (uint32_t)a.n_comp;
    g.scale = 1.0f / std::sqrt((float)D);
    // Unused bindings (no compressed rows, no mask) still get a buffer: the kernel never reads them.
    const Tensor& comp = a.n_comp > 0 ? a.comp : a.q;
    const Tensor& mask = masked ? a.mask : a.q;
    const uint32_t tg = (uint32_t)((kSimdgroups * (D + 2) * 4 + 15) / 16 * 16);
    s.kernel("attention_decode", {FunctionConstant::boolean(0, masked)})
        .bytes(0, g)
        .buf(1, a.q)
        .buf(2, a.raw)
        .buf(3, comp)
        .buf(4, mask)
        .weight(5, *a.sinks)
        .buf(6, a.out)
        .tg_mem(0, tg)
        .groups({(uint32_t)a.n_head, 1, 1}, {32 * kSimdgroups, 1, 1});
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
