// The FFN sublayer's experts (docs/model.md §3.10): sqrt(softplus) router with hash routing on the
// first layers or biased top-k elsewhere, routed SwiGLU experts with clamps (routing weight
// applied before the down projection), and the always-on shared expert.
#pragma once
#include <cstdint>

#include "layers/linear.h"
#include "model/tensor.h"

namespace ds4 {

// From the router logits of one token: the selected experts (slot order) and their weights.
// bias: F32 [n_expert] or null; hash: I32 [n_used x n_vocab] token -> experts, or null (top-k).
void route_token(const float* logits, int n_expert, int n_used, const TensorRef* bias, const TensorRef* hash,
                 float weight_scale, int32_t token, int32_t* sel, float* weights, float* probs_scratch);

// mid[i] = silu(min(g, c)) * clamp(u, -c, c) * scale (c <= 1e-6 disables the clamp).
void swiglu(float* mid, const float* g, const float* u, int64_t n, float clamp, float scale);
#if defined(DS4_ARCH_X86)
// The vector swiglu of swiglu_simd.inc on the first n rounded down to whole vectors (returned);
// swiglu() picks one by the active SIMD path and finishes the tail with the scalar loop.
int64_t swiglu_lanes_avx2(float* mid, const float* g, const float* u, int64_t n, float clamp, float scale);
int64_t swiglu_lanes_avx512(float* mid, const float* g, const float* u, int64_t n, float clamp, float scale);
#endif

// The routed experts of one layer: three [n_embd|n_ff] x n_expert stacks of matrices.
struct RoutedExperts {
    const TensorRef* gate;
    const TensorRef* up;
    const TensorRef* down;
    int n_expert, n_used;
    int64_t n_embd, n_ff;
    float clamp;
};

struct MoeScratch {
    float* gate;      // n_expert_used * n_ff_exp
    float* up;        // n_expert_used * n_ff_exp
    float* mid;       // n_expert_used * n_ff_exp
    float* down;      // n_expert_used * n_embd
    ActBuffer* xq;    // routed input activation
    ActBuffer* midq;  // per-slot mid activations
};

// out[n_embd] = sum over slots (in slot order, from 0) of down_e(Q8_K(mid_e)).
void routed_experts(const RoutedExperts& w, const float* x, const int32_t* sel, const float* weights, float* out,
                    MoeScratch scratch, ThreadPool* pool);

// Tokens per batched routed-experts call in prefill: enough pairs per expert that each expert's
// weights are streamed (and, on the GEMM paths, its panels decoded) once for many tokens, while the
// per-pair buffers stay bounded: (3 n_ff + n_embd) floats per (token, slot), 31 MiB on `small`
// and 126 MiB at DeepSeek V4 Flash's shape for a full batch. 512 rather than 256: a 512-token
// prefill chunk is one batch, so each expert's panel is decoded once per chunk instead of twice
// and its token tiles are fuller (docs/gemm.md, "Prefill profile").
constexpr int64_t kMoeTokenBatch = 512;

// routed_experts for nb tokens at once (nb <= kMoeTokenBatch; scratch sized for nb tokens):
// x[b*n_embd], sel/weights[b*n_expert_used], out[b*n_embd]. Same bits as nb calls of
// routed_experts: every dot product is the same kernel call on the same bytes, and each token's
// slots are summed in slot order.
void routed_experts_batch(const RoutedExperts& w, const float* x, int64_t nb, const int32_t* sel,
                          const float* weights, float* out, MoeScratch scratch, ThreadPool* pool);

}  // namespace ds4
