#include "layers/linear.h"

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

}  // namespace ds4
