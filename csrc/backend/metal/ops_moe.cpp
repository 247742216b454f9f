// Metal op: the routed experts of a batch of tokens, every step on the device (matvec.metal,
// ffn.metal, quantize_act.metal, misc.metal): quantise x, gate and up mat-vecs of each slot's
// expert (a token's slots share its activation row), SwiGLU scaled by the route weight, per-slot
// quantisation of the mid rows, down mat-vecs, slots summed in slot order. The router's selection
// and weights are read where the router wrote them: nothing goes back to the host.
#include "backend/metal/ops_linear.h"
#include "common/errors.h"

namespace ds4 {
namespace backend {
namespace metal {

namespace {

constexpr uint32_t kMvRows = 4, kMvSimdgroups = 2;   // as in ops_linear.cpp (MV_ROWS in matvec.metal)
// Tokens per pass: bounds the work memory (tokens * n_used * n_ff floats, three times) in a long
// prefill, as the CPU's MoE token batch does.
constexpr int64_t kTokensPerPass = 256;

void experts_matvec(MetalStream& s, const QuantKernel& k, const TensorRef& w, int64_t n, int64_t rows,
                    int n_expert, const Arg& ids, int64_t n_slots, const ActRows& x, uint32_t slots_per_x,
                    const Arg& y) {
    const int64_t row_bytes = n / k.block_elems * k.block_bytes;
    const ds4_matvec_experts_args args{(uint)n,           (uint)rows,         (uint)row_bytes, (uint)n_slots,
                                       (uint)(row_bytes * rows), (uint)x.stride, (uint)n_expert, slots_per_x};
    const std::string kernel = "matvec_experts_" + std::string(k.suffix);
    const uint32_t threads = s.threads_within(kernel.c_str(), {}, 32 * kMvSimdgroups);
    s.dispatch(kernel.c_str(), {}, {bytes_arg(args), s.arg(w), x.arg, ids, y}, {},
               {div_up(rows, kMvRows * (threads / 32)), (uint32_t)n_slots, 1}, {threads, 1, 1});
}

}  // namespace

bool moe_ops_supports(Op, GgmlType t) { return quant_kernel(t) != nullptr; }

void MetalStream::routed_experts(const RoutedExpertsArgs& a) {
    const QuantKernel* kg = quant_kernel(a.gate->type);
    const QuantKernel* kd = quant_kernel(a.down->type);
    if (!kg || !kd || a.up->type != a.gate->type) {
        fail(ErrorKind::Unsupported, "metal: routed_experts: no kernels for these expert weight types");
    }
    const int64_t nb = a.x.rows(), E = a.x.width(), U = a.n_used, F = a.n_ff;
    if (E % kg->block_elems || F % kd->block_elems) {
        fail(ErrorKind::InvalidArgument, "metal: routed_experts: n_embd / n_ff are not multiples of the weight blocks");
    }
    for (int64_t b0 = 0; b0 < nb; b0 += kTokensPerPass) {
        const int64_t m = std::min(kTokensPerPass, nb - b0), slots = m * U;
        const Tensor x = a.x.rows(b0, m);
        const Arg ids = arg(a.sel, (uint64_t)(b0 * U * 4));
        const ActRows xq = quantize_rows(*this, *kg, x, E, m, "moe.xq");
        const Tensor g = scratch("moe.gate", DType::F32, F, slots);
        const Tensor u = scratch("moe.up", DType::F32, F, slots);
        experts_matvec(*this, *kg, *a.gate, E, F, a.n_expert, ids, slots, xq, (uint32_t)U, arg(g));
        experts_matvec(*this, *kg, *a.up, E, F, a.n_expert, ids, slots, xq, (uint32_t)U, arg(u));
        const Tensor mid = scratch("moe.mid", DType::F32, F, slots);
        const ds4_swiglu_args sw{(uint)F, a.clamp, 1.0f};
        dispatch_threads("swiglu_rows", {}, {bytes_arg(sw), arg(g), arg(u), arg(a.weights, (uint64_t)(b0 * U * 4)), arg(mid)},
                         {}, {(uint32_t)F, (uint32_t)slots, 1}, {threads_within("swiglu_rows", {}, 64), 1, 1});
        const ActRows mq = quantize_rows(*this, *kd, mid, F, slots, "moe.midq");
        const Tensor dn = scratch("moe.down", DType::F32, E, slots);
        experts_matvec(*this, *kd, *a.down, F, E, a.n_expert, ids, slots, mq, 1, arg(dn));
        const ds4_sum_rows_args sr{(uint)E, (uint)U};
        dispatch_threads("sum_rows", {}, {bytes_arg(sr), arg(dn), arg(a.out.rows(b0, m))}, {}, {(uint32_t)E, (uint32_t)m, 1},
                         {threads_within("sum_rows", {}, 64), 1, 1});
    }
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
