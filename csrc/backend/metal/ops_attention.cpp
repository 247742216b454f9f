// Metal op: attention with sinks (attention.metal attention_decode; docs/metal.md, "Attention"):
// one threadgroup per head over the raw ring (oldest first) and then the compressed rows, only
// those the indexer kept when a mask is given (function constant FC_ATTN_MASKED). The graph
// calls it once per token, prefill included (engine/forward.cpp).
#include <cmath>
#include <string>

#include "backend/metal/metal_stream.h"
#include "common/errors.h"

namespace ds4 {
namespace backend {
namespace metal {

namespace {

constexpr uint32_t kSimdgroups = 4;    // simdgroups per head (fewer under a lower pipeline cap); they split the rows
constexpr int64_t kMaxHeadDim = 512;   // ATTN_MAX_PER_LANE (16) * 32 lanes in attention.metal

}  // namespace

bool attention_ops_supports(Op, GgmlType t) { return t == GgmlType::F32; }

void MetalStream::attention(const AttentionArgs& a) {
    const int64_t D = a.head_dim;
    if (D % 32 || D <= 0 || D > kMaxHeadDim) {
        fail(ErrorKind::Unsupported, "metal: attention: head_dim must be a multiple of 32 up to 512, got " +
                                         std::to_string(D));
    }
    if (a.raw_cap < 1 || a.n_raw < 0 || a.n_raw > a.raw_cap || a.raw_first < 0 || a.raw_first >= a.raw_cap ||
        a.n_comp < 0) {
        fail(ErrorKind::InvalidArgument, "metal: attention: inconsistent raw window (cap " + std::to_string(a.raw_cap) +
                                             ", live " + std::to_string(a.n_raw) + ", first " +
                                             std::to_string(a.raw_first) + ")");
    }
    const bool masked = a.n_comp > 0 && (bool)a.mask;
    const ds4_attn_args args{(uint)a.n_head, (uint)D, (uint)a.raw_cap, (uint)a.n_raw, (uint)a.raw_first,
                             (uint)a.n_comp, 1.0f / std::sqrt((float)D)};
    // Bindings the kernel does not read (no compressed rows, no mask) still need a buffer.
    const Arg comp = a.n_comp > 0 ? arg(a.comp) : arg(a.q);
    const Arg mask = masked ? arg(a.mask) : arg(a.q);
    const FunctionConstant fc = FunctionConstant::boolean(0, masked);
    const uint32_t sgs = threads_within("attention_decode", {fc}, 32 * kSimdgroups) / 32;
    dispatch("attention_decode", {fc}, {bytes_arg(args), arg(a.q), arg(a.raw), comp, mask, arg(*a.sinks), arg(a.out)},
             {(uint32_t)(sgs * (D + 2) * 4)}, {(uint32_t)a.n_head, 1, 1}, {32 * sgs, 1, 1});
}

// supports(Op::AttentionBlock) is false, so the graph never calls this (engine/forward.cpp).
void MetalStream::attention_block(const AttentionBlockArgs&) {
    fail(ErrorKind::Unsupported, "metal: attention_block has no kernel; run attention per token");
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
