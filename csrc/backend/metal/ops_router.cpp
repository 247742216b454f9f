// Metal op: the MoE router (router.metal; docs/metal.md, "Router"): one threadgroup per token,
// one thread per expert. Hash routing reads the token's row of the table in place; the host
// checks the rows of the tokens it is given first (the kernel trusts them), with the CPU's error.
#include <string>

#include "backend/metal/metal_stream.h"
#include "common/errors.h"

namespace ds4 {
namespace backend {
namespace metal {

namespace {

void check_hash_rows(const TensorRef& hash, const int32_t* tokens, int64_t n, int n_expert, int n_used) {
    const int32_t* table = reinterpret_cast<const int32_t*>(hash.data);
    for (int64_t b = 0; b < n; ++b) {
        const int32_t t = tokens[b];
        if (t < 0 || t >= hash.ne[1]) {
            fail(ErrorKind::InvalidArgument, "metal: router: token " + std::to_string(t) +
                                                 " has no row in the hash routing table (" +
                                                 std::to_string(hash.ne[1]) + " rows)");
        }
        for (int i = 0; i < n_used; ++i) {
            const int32_t e = table[(int64_t)t * n_used + i];
            if (e < 0 || e >= n_expert) {
                fail(ErrorKind::ModelFormat, "hash routing table maps token " + std::to_string(t) + " to expert " +
                                                 std::to_string(e) + ", outside [0, " + std::to_string(n_expert) + ")");
            }
        }
    }
}

}  // namespace

bool router_ops_supports(Op, GgmlType t) { return t == GgmlType::F32 || t == GgmlType::I32; }

void MetalStream::router(const RouterArgs& a) {
    const int64_t nb = a.logits.rows();
    if (nb == 0) return;
    if (a.n_expert < 1 || a.n_used < 1 || a.n_used > a.n_expert) {
        fail(ErrorKind::InvalidArgument, "metal: router: need 1 <= n_used <= n_expert");
    }
    const FunctionConstant hashed = FunctionConstant::boolean(0, a.hash != nullptr);
    if (threads_within("router", {hashed}, (uint32_t)a.n_expert) < (uint32_t)a.n_expert) {
        fail(ErrorKind::Unsupported, "metal: router: one thread per expert, and " + std::to_string(a.n_expert) +
                                         " experts exceed the pipeline's threadgroup size");
    }
    if (a.hash) check_hash_rows(*a.hash, a.tokens, nb, a.n_expert, a.n_used);
    Arg bias;
    if (a.bias) {
        bias = arg(*a.bias);
    } else {
        const Tensor zero = scratch("router.zero_bias", DType::F32, a.n_expert, 1);
        fill({zero, 0.0f});     // biased = p + 0 = p: the CPU's selection without a bias
        bias = arg(zero);
    }
    // Without hash routing the kernel reads neither the table nor the token ids.
    const Arg table = a.hash ? arg(*a.hash) : arg(a.logits);
    const Arg tokens = a.hash ? host_array(a.tokens, (uint64_t)nb * sizeof(int32_t)) : arg(a.logits);
    const ds4_router_args args{(uint)a.n_expert, (uint)a.n_used, a.weight_scale};
    dispatch("router", {hashed}, {bytes_arg(args), arg(a.logits), bias, table, arg(a.sel), arg(a.weights), tokens},
             {(uint32_t)((2 * a.n_expert + a.n_used) * 4)}, {(uint32_t)nb, 1, 1}, {(uint32_t)a.n_expert, 1, 1});
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
