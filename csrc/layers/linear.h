// Dense projections y = W·x over a batch of tokens, with the activation prepared in the format the
// weight type wants (docs/model.md §4.2: Q8_0 activations for Q8_0 weights, Q8_K for k-quants, floats
// for F16/F32). Row results do not depend on the batch size, so prefill equals decode bit for bit.
#pragma once
#include <cstdint>
#include <vector>

#include "model/tensor.h"

namespace ds4 {

class ThreadPool;

// Grows-only byte buffer for prepared activations (no allocation once warm).
struct ActBuffer {
    std::vector<uint8_t> bytes;
    // 64-byte aligned: the F16/BF16 tiles load whole cache lines of it (a misaligned start makes
    // them copy it first, quant/matmul_half.cpp).
    uint8_t* ensure(int64_t n) {
        if ((int64_t)bytes.size() < n + 64) bytes.resize((size_t)n + 64);
        return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(bytes.data()) + 63) & ~uintptr_t(63));
    }
};

// Y[b*out + r] = dot(W row r, x_b) for b < nb, where x_b = x + b*x_stride (x_stride 0 means
// W.ne[0]) and out = W.ne[1].
void linear(const TensorRef& w, const float* x, int64_t nb, float* y, ActBuffer& act, ThreadPool* pool,
            int64_t x_stride = 0);

// One member of linear_group: Y = W x over the group's batch (out = W.ne[1] floats per token).
struct LinearOut {
    const TensorRef* w;
    float* y;
};

// linear() of every member over the same nb rows of x (n = every W.ne[0], rows x_stride floats
// apart, 0 meaning n), bit-identical to separate calls: x is prepared once per activation type the
// weights need (act_type_for) instead of once per weight, and for one token all the mat-vecs run
// in one dispatch (matvec_group); batches run each weight's matmul on the shared activations.
void linear_group(const LinearOut* outs, int count, const float* x, int64_t nb, ActBuffer& act, ThreadPool* pool,
                  int64_t x_stride = 0);

}  // namespace ds4
