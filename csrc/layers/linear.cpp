#include "layers/linear.h"

#include <string>

#include "common/errors.h"
#include "common/thread_pool.h"
#include "quant/kernels.h"

namespace ds4 {

void linear(const TensorRef& w, const float* x, int64_t nb, float* y, ActBuffer& act, ThreadPool* pool,
            int64_t x_stride) {
    const int64_t n = w.ne[0];
    const int64_t rows = w.ne[1];
    if (x_stride == 0) x_stride = n;
    const int64_t ab = act_bytes(w.type, n);
    uint8_t* xq = act.ensure(ab * nb);
    if (nb == 1) {
        quantize_act(w.type, x, xq, n);
    } else {  // independent per token: spread over the pool (same bits for any split)
        (pool ? *pool : ThreadPool::global()).parallel_for(nb, [&](int64_t b0, int64_t b1) {
            for (int64_t b = b0; b < b1; ++b) quantize_act(w.type, x + b * x_stride, xq + b * ab, n);
        }, 8);
    }
    if (nb == 1) {
        matvec(w.type, w.data, rows, n, xq, y, pool);
    } else {
        matmul(w.type, w.data, rows, n, xq, nb, y, pool);
    }
}

namespace {

// Byte offsets are kept 64-aligned so every prepared activation starts on a cache line (the
// F16/BF16 tiles read float activations in place only from aligned addresses).
int64_t align64(int64_t v) { return (v + 63) & ~int64_t(63); }

}  // namespace

void linear_group(const LinearOut* outs, int count, const float* x, int64_t nb, ActBuffer& act, ThreadPool* pool,
                  int64_t x_stride) {
    if (count <= 0 || nb <= 0) return;
    constexpr int kMaxMembers = 16;
    if (count > kMaxMembers) {
        fail(ErrorKind::InvalidArgument, "linear_group: more than " + std::to_string(kMaxMembers) + " weights");
    }
    const int64_t n = outs[0].w->ne[0];
    for (int i = 1; i < count; ++i) {
        if (outs[i].w->ne[0] != n) {
            fail(ErrorKind::InvalidArgument, "linear_group: weights of different input widths (" + std::to_string(n) +
                                                 " and " + std::to_string(outs[i].w->ne[0]) + ")");
        }
    }
    if (x_stride == 0) x_stride = n;
    // One prepared activation per distinct activation type (at most F32, Q8_0-act and Q8_K): kind
    // k is quantised with the first member's weight type of that activation type, which writes the
    // same bytes as any other member's (quantize_act depends only on act_type_for).
    GgmlType kinds[3];
    GgmlType kind_weight[3];
    int64_t kind_off[3], kind_ab[3];
    int n_kinds = 0;
    int kind_of[kMaxMembers];
    int64_t total = 0;
    for (int i = 0; i < count; ++i) {
        const GgmlType t = outs[i].w->type;
        const GgmlType at = act_type_for(t);
        int k = 0;
        while (k < n_kinds && kinds[k] != at) ++k;
        if (k == n_kinds) {
            kinds[k] = at;
            kind_weight[k] = t;
            kind_ab[k] = act_bytes(t, n);
            kind_off[k] = total;
            total += align64(kind_ab[k] * nb);
            ++n_kinds;
        }
        kind_of[i] = k;
    }
    uint8_t* xq = act.ensure(total);
    auto quantize_token = [&](int64_t b) {
        for (int k = 0; k < n_kinds; ++k) {
            quantize_act(kind_weight[k], x + b * x_stride, xq + kind_off[k] + b * kind_ab[k], n);
        }
    };
    if (nb == 1) {
        quantize_token(0);
    } else {  // independent per token: one dispatch for every activation type
        (pool ? *pool : ThreadPool::global()).parallel_for(nb, [&](int64_t b0, int64_t b1) {
            for (int64_t b = b0; b < b1; ++b) quantize_token(b);
        }, 8);
    }
    if (nb == 1) {
        MatvecPart parts[kMaxMembers];
        for (int i = 0; i < count; ++i) {
            const TensorRef& w = *outs[i].w;
            parts[i] = MatvecPart{w.type, w.data, w.ne[1], xq + kind_off[kind_of[i]], outs[i].y};
        }
        matvec_group(parts, count, n, pool);
        return;
    }
    // The batched kernels (GEMM, F16 tiles, small-batch Q8_0) each split their own work: one call
    // per weight, on the shared activations.
    for (int i = 0; i < count; ++i) {
        const TensorRef& w = *outs[i].w;
        matmul(w.type, w.data, w.ne[1], n, xq + kind_off[kind_of[i]], nb, outs[i].y, pool);
    }
}

}  // namespace ds4
