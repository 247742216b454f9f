// Hyper-connection ops on Metal (docs/metal.md, "From the backend ops to kernels"):
//   HcPre          rms_norm_f32 (plain) -> Linear -> hc_split_sinkhorn -> hc_weighted_sum
//   HcPost         hc_post
//   HcCollapseNorm rms_norm_f32 (plain) -> Linear -> hc_collapse_weights -> hc_weighted_sum
//                  -> rms_norm_f32 (weighted)
// Every step stays on the device; intermediate rows live in the stream's scratch tensors.
#include <string>

#include "backend/metal/metal_stream.h"
#include "common/errors.h"

namespace ds4 {
namespace backend {
namespace metal {

namespace {

// hc_split_sinkhorn keeps the n_hc x n_hc combine matrix in one simdgroup (a lane per entry).
void check_streams(int n_hc, const char* op) {
    if (n_hc < 1 || n_hc * n_hc > 32) {
        fail(ErrorKind::Unsupported, std::string(op) + ": the Metal kernels take 1..5 HC streams (n_hc^2 <= 32), got " +
                                         std::to_string(n_hc));
    }
}

ds4_hc_args hc_args(int n_hc, int64_t n_embd, int iters, float eps, int64_t mix_stride) {
    ds4_hc_args g{};
    g.n_hc = (uint32_t)n_hc;
    g.n_embd = (uint32_t)n_embd;
    g.iters = (uint32_t)iters;
    g.eps = eps;
    g.mix_stride = (uint32_t)mix_stride;
    return g;
}

// x[tok] = sum over streams of H[tok][h] * pre[h], pre from the split rows (stride 2n + n^2).
void weighted_sum(MetalStream& s, const Tensor& H, const Tensor& split, const Tensor& x, int n_hc, int64_t E,
                  int64_t nb) {
    s.kernel("hc_weighted_sum")
        .bytes(0, hc_args(n_hc, E, 0, 0.0f, 0))
        .buf(1, H)
        .buf(2, split)
        .buf(3, x)
        .threads({(uint32_t)E, (uint32_t)nb, 1}, {64, 1, 1});
}

}  // namespace

void hc_pre(MetalStream& s, const HcPreArgs& a) {
    check_streams(a.n_hc, "hc_pre");
    const int64_t nb = a.H.rows(), hd = a.H.width(), E = a.x.width();
    if (nb == 0) return;
    const Tensor flat = s.scratch(Scratch::HcFlat, hd, nb);
    const Tensor mix = s.scratch(Scratch::HcMix, a.fn->ne[1], nb);
    s.rms_norm({a.H, flat, nullptr, a.rms_eps});
    s.linear({a.fn, flat, mix});
    s.kernel("hc_split_sinkhorn")
        .bytes(0, hc_args(a.n_hc, 0, a.sinkhorn_iters, a.hc_eps, mix.width()))
        .buf(1, mix)
        .weight(2, *a.scale)
        .weight(3, *a.base)
        .buf(4, a.split)
        .groups({(uint32_t)nb, 1, 1}, {32, 1, 1});
    weighted_sum(s, a.H, a.split, a.x, a.n_hc, E, nb);
}

void hc_post(MetalStream& s, const HcPostArgs& a) {
    check_streams(a.n_hc, "hc_post");
    const int64_t nb = a.block.rows(), E = a.block.width();
    if (nb == 0) return;
    s.kernel("hc_post")
        .bytes(0, hc_args(a.n_hc, E, 0, 0.0f, 0))
        .buf(1, a.block)
        .buf(2, a.residual)
        .buf(3, a.split)
        .buf(4, a.out)
        .threads({(uint32_t)E, (uint32_t)a.n_hc, (uint32_t)nb}, {64, 1, 1});
}

void hc_collapse_norm(MetalStream& s, const HcCollapseNormArgs& a) {
    check_streams(a.n_hc, "hc_collapse_norm");
    const int64_t hd = a.H.width(), E = a.y.width(), n = a.n_hc;
    const Tensor flat = s.scratch(Scratch::HcFlat, hd, 1);
    const Tensor pre = s.scratch(Scratch::HcMix, a.fn->ne[1], 1);
    const Tensor split = s.scratch(Scratch::HcSplit, 2 * n + n * n, 1);
    const Tensor mixed = s.scratch(Scratch::HcCollapsed, E, 1);
    s.rms_norm({a.H, flat, nullptr, a.rms_eps});
    s.linear({a.fn, flat, pre});
    s.kernel("hc_collapse_weights")
        .bytes(0, hc_args(a.n_hc, 0, 0, a.hc_eps, pre.width()))
        .buf(1, pre)
        .weight(2, *a.scale)
        .weight(3, *a.base)
        .buf(4, split)
        .threads({(uint32_t)n, 1, 1}, {(uint32_t)n, 1, 1});
    weighted_sum(s, a.H, split, mixed, a.n_hc, E, 1);
    s.rms_norm({mixed, a.y, a.norm, a.rms_eps});
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
