// Metal ops: HC pre / post / collapse (docs/metal.md, "From the backend ops to kernels"):
//   HcPre          rms_norm_f32 (plain) -> linear() -> hc_split_sinkhorn -> hc_weighted_sum
//   HcPost         hc_post
//   HcCollapseNorm rms_norm_f32 (plain) -> linear() -> hc_collapse_weights -> hc_weighted_sum
//                  -> rms_norm_f32 (weighted)
// Every step stays on the device; the intermediate rows live in this file's scratch slots.
#include <string>

#include "backend/metal/metal_stream.h"
#include "common/errors.h"

namespace ds4 {
namespace backend {
namespace metal {

namespace {

constexpr uint32_t kElementThreads = 64;   // threadgroup of the one-thread-per-element HC kernels

// hc_split_sinkhorn holds the n_hc x n_hc combine matrix in one simdgroup, a lane per entry.
void check_streams(int n_hc, const char* op) {
    if (n_hc < 1 || n_hc * n_hc > 32) {
        fail(ErrorKind::Unsupported, std::string("metal: ") + op + ": the kernels take 1..5 HC streams (n_hc^2 <= 32), got " +
                                         std::to_string(n_hc));
    }
}

ds4_hc_args hc_args(int n_hc, int64_t n_embd, int iters, float eps, int64_t mix_stride) {
    return ds4_hc_args{(uint)n_hc, (uint)n_embd, (uint)iters, eps, (uint)mix_stride};
}

// x[tok] = sum over the streams (in order) of H[tok][h] * pre[h], pre from split rows of 2n + n^2.
void weighted_sum(MetalStream& s, const Tensor& H, const Tensor& split, const Tensor& x, int n_hc, int64_t E,
                  int64_t nb) {
    const ds4_hc_args args = hc_args(n_hc, E, 0, 0.0f, 0);
    s.dispatch_threads("hc_weighted_sum", {}, {bytes_arg(args), s.arg(H), s.arg(split), s.arg(x)}, {},
                       {(uint32_t)E, (uint32_t)nb, 1}, {s.threads_within("hc_weighted_sum", {}, kElementThreads), 1, 1});
}

}  // namespace

bool hc_ops_supports(Op op, GgmlType t) {
    // The projection runs through linear(): any weight type with Metal kernels.
    if (op == Op::HcPost) return t == GgmlType::F32;
    return quant_kernel(t) != nullptr;
}

void MetalStream::hc_pre(const HcPreArgs& a) {
    check_streams(a.n_hc, "hc_pre");
    const int64_t nb = a.H.rows(), hd = a.H.width(), E = a.x.width(), mixn = a.split.width();
    if (nb == 0) return;
    if (a.fn->ne[1] != mixn || mixn != 2 * a.n_hc + a.n_hc * a.n_hc) {
        fail(ErrorKind::InvalidArgument, "metal: hc_pre: the mix projection and the split rows disagree on 2n + n^2");
    }
    const Tensor flat = scratch("hc.flat", DType::F32, hd, nb);
    const Tensor mix = scratch("hc.mix", DType::F32, mixn, nb);
    rms_norm({a.H, flat, nullptr, a.rms_eps});
    linear({a.fn, flat, mix});
    const ds4_hc_args args = hc_args(a.n_hc, 0, a.sinkhorn_iters, a.hc_eps, mixn);
    dispatch("hc_split_sinkhorn", {}, {bytes_arg(args), arg(mix), arg(*a.scale), arg(*a.base), arg(a.split)}, {},
             {(uint32_t)nb, 1, 1}, {32, 1, 1});
    weighted_sum(*this, a.H, a.split, a.x, a.n_hc, E, nb);
}

void MetalStream::hc_post(const HcPostArgs& a) {
    check_streams(a.n_hc, "hc_post");
    const int64_t nb = a.block.rows(), E = a.block.width();
    const ds4_hc_args args = hc_args(a.n_hc, E, 0, 0.0f, 0);
    dispatch_threads("hc_post", {}, {bytes_arg(args), arg(a.block), arg(a.residual), arg(a.split), arg(a.out)}, {},
                     {(uint32_t)E, (uint32_t)a.n_hc, (uint32_t)nb}, {threads_within("hc_post", {}, kElementThreads), 1, 1});
}

void MetalStream::hc_collapse_norm(const HcCollapseNormArgs& a) {
    check_streams(a.n_hc, "hc_collapse_norm");
    const int64_t hd = a.H.width(), E = a.y.width(), n = a.n_hc;
    const Tensor flat = scratch("hc.flat", DType::F32, hd, 1);
    const Tensor pre = scratch("hc.mix", DType::F32, n, 1);
    const Tensor split = scratch("hc.collapse_split", DType::F32, 2 * n + n * n, 1);
    const Tensor mixed = scratch("hc.collapsed", DType::F32, E, 1);
    rms_norm({a.H, flat, nullptr, a.rms_eps});
    linear({a.fn, flat, pre});
    const ds4_hc_args args = hc_args(a.n_hc, 0, 0, a.hc_eps, n);
    dispatch_threads("hc_collapse_weights", {}, {bytes_arg(args), arg(pre), arg(*a.scale), arg(*a.base), arg(split)},
                     {}, {(uint32_t)n, 1, 1}, {(uint32_t)n, 1, 1});
    weighted_sum(*this, a.H, split, mixed, a.n_hc, E, 1);
    rms_norm({mixed, a.y, a.norm, a.rms_eps});
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
