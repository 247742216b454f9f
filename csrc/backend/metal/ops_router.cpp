// The MoE router on Metal (docs/metal.md, "Router"): one threadgroup per token, one thread per
// expert. Hash routing reads the token's row of the table in place; the host checks the rows of
// the tokens it is given first (the kernel trusts them), with the CPU's error.
#include <algorithm>
#include <string>

#include "backend/metal/metal_stream.h"
#include "common/errors.h"

namespace ds4 {
namespace backend {
namespace metal {

namespace {

// Token ids travel as inline bytes (setBytes: at most 4 KiB), so a batch goes in chunks.
constexpr int64_t kTokensPerDispatch = 1024;

void check_hash_rows(const TensorRef& hash, const int32_t* tokens, int64_t n, int n_expert, int n_used) {
    const int32_t* table = reinterpret_cast<const int32_t*>(hash.data);
    for (int64_t b = 0; b < n; ++b) {
        const int32_t t = tokens[b];
        if (t < 0 || t >= hash.ne[1]) {
            fail(ErrorKind::InvalidArgument, "router: token " + std::to_string(t) + " has no row in the hash table (" +
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

void router(MetalStream& s, const RouterArgs& a) {
    const int64_t nb = a.logits.rows();
    if (nb == 0) return;
    if (a.n_expert < 1 || a.n_used < 1 || a.n_used > a.n_expert) {
        fail(ErrorKind::InvalidArgument, "router: need 1 <= n_used <= n_expert");
    }
    if (a.hash) check_hash_rows(*a.hash, a.tokens, nb, a.n_expert, a.n_used);
    const FunctionConstant hashed = FunctionConstant::boolean(0, a.hash != nullptr);
    if ((uint32_t)a.n_expert > s.max_threads("router", {hashed})) {
        fail(ErrorKind::Unsupported, "router: one thread per expert, and " + std::to_string(a.n_expert) +
                                         " experts exceed the pipeline's threadgroup size");
    }
    Tensor bias;
    if (a.bias) {
        bias = s.weight_tensor(*a.bias);
    } else {
        bias = s.scratch(Scratch::ZeroBias, a.n_expert, 1);
        s.fill({bias, 0.0f});     // biased = p + 0 = p: the CPU's unbiased selection
    }
    const ds4_router_args g{(uint32_t)a.n_expert, (uint32_t)a.n_used, a.weight_scale};
    const uint32_t tg = (uint32_t)(((2 * a.n_expert + a.n_used) * 4 + 15) / 16 * 16);
    for (int64_t b0 = 0; b0 < nb; b0 += kTokensPerDispatch) {
        const int64_t m = std::min(kTokensPerDispatch, nb - b0);
        Dispatch d = s.kernel("router", {hashed});
        d.bytes(0, g).buf(1, a.logits.rows(b0, m)).buf(2, bias);
        if (a.hash) {
            d.weight(3, *a.hash).bytes_raw(6, a.tokens + b0, (uint32_t)(m * sizeof(int32_t)));
        } else {
            d.buf(3, a.logits).buf(6, a.logits);   // not read without hash routing
        }
        d.buf(4, a.sel.rows(b0, m)).buf(5, a.weights.rows(b0, m)).tg_mem(0, tg);
        d.groups({(uint32_t)m, 1, 1}, {(uint32_t)a.n_expert, 1, 1});
    }
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
