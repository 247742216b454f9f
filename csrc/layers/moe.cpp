#include "layers/moe.h"

#include <cmath>

#include "common/errors.h"
#include "common/thread_pool.h"
#include "layers/numerics.h"
#include "quant/kernels.h"
#include "quant/matvec_experts_pair.h"
#include "quant/simd.h"

namespace ds4 {

namespace {

// Insertion top-k: scan ascending, insert before the first strictly smaller; ties keep the lower id.
void topk_desc(const float* score, int n, int k, int32_t* idx) {
    for (int i = 0; i < k; ++i) idx[i] = -1;
    for (int i = 0; i < n; ++i) {
        for (int j = 0; j < k; ++j) {
            if (idx[j] < 0 || score[i] > score[idx[j]]) {
                for (int m = k - 1; m > j; --m) idx[m] = idx[m - 1];
                idx[j] = i;
                break;
            }
        }
    }
}

}  // namespace

void route_token(const float* logits, int ne, int nu, const TensorRef* bias, const TensorRef* hash, float weight_scale,
                 int32_t token, int32_t* sel, float* weights, float* probs) {
    for (int e = 0; e < ne; ++e) probs[e] = std::sqrt(softplus_stable(logits[e]));
    if (hash) {
        const int32_t* row = reinterpret_cast<const int32_t*>(hash->data) + (int64_t)token * nu;
        for (int i = 0; i < nu; ++i) {
            if (row[i] < 0 || row[i] >= ne) {
                fail(ErrorKind::ModelFormat, "hash routing table maps token " + std::to_string(token) + " to expert " +
                                                 std::to_string(row[i]) + ", outside [0, " + std::to_string(ne) + ")");
            }
            sel[i] = row[i];
        }
    } else {
        // The bias steers selection only; the weights below use the unbiased probs, so the
        // biased copy lives in the second half of the scratch (2*n_expert floats).
        float* biased = probs + ne;
        for (int e = 0; e < ne; ++e) biased[e] = probs[e];
        if (bias) {
            const float* b = bias->f32();
            for (int e = 0; e < ne; ++e) biased[e] += b[e];
        }
        topk_desc(biased, ne, nu, sel);
    }
    float sum = 0.0f;
    for (int i = 0; i < nu; ++i) {
        weights[i] = probs[sel[i]];
        sum += weights[i];
    }
    if (sum < 6.103515625e-5f) sum = 6.103515625e-5f;
    for (int i = 0; i < nu; ++i) weights[i] = weights[i] / sum * weight_scale;
}

namespace {

void swiglu_scalar(float* mid, const float* g, const float* u, int64_t n, float c, float scale) {
    for (int64_t i = 0; i < n; ++i) {
        float gv = g[i], uv = u[i];
        if (c > 1.0e-6f) {
            if (gv > c) gv = c;
            if (uv > c) uv = c;
            if (uv < -c) uv = -c;
        }
        mid[i] = silu(gv) * uv * scale;
    }
}

}  // namespace

// The vector paths compute the scalar loop's bits (swiglu_simd.inc); DS4_SIMD=scalar keeps it.
void swiglu(float* mid, const float* g, const float* u, int64_t n, float c, float scale) {
    int64_t done = 0;
    switch (simd_path()) {
#if defined(DS4_ARCH_X86)
        case SimdPath::AVX2: done = swiglu_lanes_avx2(mid, g, u, n, c, scale); break;
        case SimdPath::AVX512:
        case SimdPath::AVX512VNNI: done = swiglu_lanes_avx512(mid, g, u, n, c, scale); break;
#endif
        default: break;
    }
    swiglu_scalar(mid + done, g + done, u + done, n - done, c, scale);
}

void routed_experts(const RoutedExperts& w, const float* x, const int32_t* sel, const float* weights, float* out,
                    MoeScratch sc, ThreadPool* pool) {
    const int nu = w.n_used;
    const int64_t E = w.n_embd, F = w.n_ff;
    const GgmlType gt = w.gate->type, dt = w.down->type;
    const int64_t xb = act_bytes(gt, E);
    uint8_t* xq = sc.xq->ensure(xb);
    quantize_act(gt, x, xq, E);
    // Gate and up in one dispatch (docs/kernels.md, "decode dispatches"); the same bits as two
    // matvec_experts calls (up is read as gate's type, as before).
    matvec_experts_pair(gt, w.gate->data, w.up->data, w.n_expert, F, E, sel, nu, xq, sc.gate, sc.up, pool);
    const int64_t mb = act_bytes(dt, F);
    uint8_t* mq = sc.midq->ensure(mb * nu);
    for (int i = 0; i < nu; ++i) {
        // The routing weight scales mid before the down projection (upstream's order).
        float* mid = sc.mid + i * F;
        swiglu(mid, sc.gate + i * F, sc.up + i * F, F, w.clamp, weights[i]);
        quantize_act(dt, mid, mq + i * mb, F);
    }
    matvec_experts(dt, w.down->data, w.n_expert, E, F, sel, nu, mq, mb, sc.down, pool);
    for (int64_t r = 0; r < E; ++r) {
        float acc = 0.0f;
        for (int i = 0; i < nu; ++i) acc += sc.down[i * E + r];
        out[r] = acc;
    }
}

void routed_experts_batch(const RoutedExperts& w, const float* x, int64_t nb, const int32_t* sel,
                          const float* weights, float* out, MoeScratch sc, ThreadPool* pool) {
    if (nb == 1) {
        routed_experts(w, x, sel, weights, out, sc, pool);
        return;
    }
    const int64_t nu = w.n_used;
    const int64_t E = w.n_embd, F = w.n_ff;
    const GgmlType gt = w.gate->type, dt = w.down->type;
    const int64_t xb = act_bytes(gt, E);
    uint8_t* xq = sc.xq->ensure(xb * nb);
    // Per-token steps are independent: spread them over the pool (same bits for any split).
    ThreadPool& tp = pool ? *pool : ThreadPool::global();
    tp.parallel_for(nb, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) quantize_act(gt, x + b * E, xq + b * xb, E);
    }, 8);
    matmul_experts(gt, w.gate->data, w.n_expert, F, E, sel, nb, nu, xq, xb, 0, sc.gate, pool);
    matmul_experts(gt, w.up->data, w.n_expert, F, E, sel, nb, nu, xq, xb, 0, sc.up, pool);
    const int64_t mb = act_bytes(dt, F);
    uint8_t* mq = sc.midq->ensure(mb * nu * nb);
    tp.parallel_for(nb * nu, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
            float* mid = sc.mid + p * F;
            swiglu(mid, sc.gate + p * F, sc.up + p * F, F, w.clamp, weights[p]);
            quantize_act(dt, mid, mq + p * mb, F);
        }
    }, 8);
    matmul_experts(dt, w.down->data, w.n_expert, E, F, sel, nb, nu, mq, nu * mb, mb, sc.down, pool);
    // Each token's slots summed in slot order from 0.0f, as routed_experts does per row; the slot
    // loop is outside the row loop so the rows vectorise (the same additions per element), and
    // tokens are split over the pool (docs/gemm.md, "Prefill profile").
    tp.parallel_for(nb, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
            const float* down = sc.down + b * nu * E;
            float* o = out + b * E;
            for (int64_t r = 0; r < E; ++r) o[r] = 0.0f;
            for (int64_t i = 0; i < nu; ++i) {
                const float* d = down + i * E;
                for (int64_t r = 0; r < E; ++r) o[r] += d[r];
            }
        }
    }, 8);
}

}  // namespace ds4
