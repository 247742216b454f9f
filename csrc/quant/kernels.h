// The CPU backend's quantised kernels: dequantisation, activation preparation, row products.
//
// A weight row of n elements is consumed together with an *activation* of the same n elements,
// prepared once by quantize_act() in the format that weight type wants (upstream numerics):
//   F32, BF16, F16 weights  -> float activations (no quantisation)
//   Q8_0 weights            -> BlockQ8_0Act per 32 (float scale d = amax/127, not rounded to f16)
//   Q2_K, Q4_K, IQ2_XXS     -> BlockQ8K per 256 (ggml Q8_K: d = -max/127 sign convention)
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace ds4 {

class ThreadPool;

// ---- exact dequantisation (one row or any whole number of blocks) ----
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);

// ---- activations ----
GgmlType act_type_for(GgmlType weight_type);               // F32, Q8_0 (act) or Q8_K
int64_t act_bytes(GgmlType weight_type, int64_t n);        // bytes quantize_act writes for n values
void quantize_act(GgmlType weight_type, const float* x, void* out, int64_t n);
void quantize_q8_0_act(const float* x, BlockQ8_0Act* out, int64_t n);
void quantize_q8_K(const float* x, BlockQ8K* out, int64_t n);

// ---- products ----
// y[r] = dot(W row r, xq), r in [0, rows). W rows are row_bytes(t, n) apart.
void matvec(GgmlType t, const void* w, int64_t rows, int64_t n, const void* xq, float* y,
            ThreadPool* pool = nullptr);

// One member of matvec_group: y[r] = dot(W row r, xq) for r < rows, W of type t (rows of n).
struct MatvecPart {
    GgmlType t;
    const void* w;
    int64_t rows;
    const void* xq;      // the activation prepared for t (quantize_act); parts may share one
    float* y;
};

// matvec() of every part in one parallel dispatch over the parts' concatenated rows (the
// same-input projections of a layer). Each y is bit-identical to matvec() of its part.
void matvec_group(const MatvecPart* parts, int n_parts, int64_t n, ThreadPool* pool = nullptr);

// Batch of nb activations (each act_bytes(t, n) apart): Y[b*rows + r] = dot(W row r, xq_b).
void matmul(GgmlType t, const void* w, int64_t rows, int64_t n, const void* xq, int64_t nb, float* y,
            ThreadPool* pool = nullptr);

// Routed experts: w holds n_expert matrices of [rows x n] one after another. For slot i,
// y[i*rows + r] = dot(expert ids[i] row r, xq_i), where xq_i is xq + i*xq_stride bytes
// (xq_stride == 0: every slot shares one activation). Throws InvalidArgument on a bad id.
void matvec_experts(GgmlType t, const void* w, int64_t n_expert, int64_t rows, int64_t n,
                    const int32_t* ids, int64_t n_ids, const void* xq, int64_t xq_stride, float* y,
                    ThreadPool* pool = nullptr);

// Batched routed experts (prefill): pair p = b*n_used + i (token b, slot i) uses expert ids[p]
// and the activation at xq + b*tok_stride + i*slot_stride bytes (gate/up: tok_stride = act
// bytes, slot_stride = 0; down: tok_stride = n_used * act bytes, slot_stride = act bytes), and
// y[p*rows + r] = dot(expert ids[p] row r, that activation). Bit-identical to matvec_experts on
// each token; each selected expert's weights are streamed once per call for all its pairs.
// Throws InvalidArgument on a bad id.
void matmul_experts(GgmlType t, const void* w, int64_t n_expert, int64_t rows, int64_t n, const int32_t* ids,
                    int64_t n_tokens, int64_t n_used, const void* xq, int64_t tok_stride, int64_t slot_stride,
                    float* y, ThreadPool* pool = nullptr);

// Reads every byte of [p, p + bytes) once, split over the pool's threads like a decode matvec, and
// returns a checksum (so the reads cannot be optimised away): the machine's read bandwidth, the
// ceiling that decode's weight streaming is measured against (bench/kernels.py).
uint64_t stream_read(const void* p, int64_t bytes, ThreadPool* pool = nullptr);

}  // namespace ds4
