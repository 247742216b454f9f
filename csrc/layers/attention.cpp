#include "layers/attention.h"

#include <cmath>
#include <algorithm>
#include <functional>
#include <vector>

#include "common/thread_pool.h"
#include "layers/attention_simd.h"
#include "layers/numerics.h"
#include "quant/kernels.h"
#include "quant/simd.h"

namespace ds4 {

namespace {

// One range of heads. Dot is a functor (not a pointer) so the row dots inline and vectorise.
template <class Dot>
void attend_heads(const AttentionInputs& in, float* out, float* scores, int64_t h0, int64_t h1, Dot dot) {
    const int64_t D = in.head_dim;
    const int64_t n_raw = in.n_raw;
    const int64_t stride = in.raw_cap + in.n_comp;
    auto raw_row = [&](int64_t i) {
        int64_t slot = in.raw_first + i;
        if (slot >= in.raw_cap) slot -= in.raw_cap;
        return in.raw + slot * D;
    };
    const float kq_scale = 1.0f / std::sqrt((float)D);
    for (int64_t h = h0; h < h1; ++h) {
        const float* qh = in.q + h * D;
        float* sc = scores + h * stride;
        float mx = in.sinks[h];
        for (int64_t r = 0; r < n_raw; ++r) {
            sc[r] = dot(qh, raw_row(r), D) * kq_scale;
            if (sc[r] > mx) mx = sc[r];
        }
        for (int64_t r = 0; r < in.n_comp; ++r) {
            float& v = sc[n_raw + r];
            if (in.allowed && !in.allowed[r]) {
                v = kNeg;
                continue;
            }
            v = dot(qh, in.comp + r * D, D) * kq_scale;
            if (v > mx) mx = v;
        }
        float* oh = out + h * D;
        for (int64_t i = 0; i < D; ++i) oh[i] = 0.0f;
        float denom = std::exp(in.sinks[h] - mx);
        for (int64_t r = 0; r < n_raw; ++r) {
            const float w = std::exp(sc[r] - mx);
            const float* row = raw_row(r);
            denom += w;
            for (int64_t i = 0; i < D; ++i) oh[i] += w * row[i];
        }
        for (int64_t r = 0; r < in.n_comp; ++r) {
            const float v = sc[n_raw + r];
            if (v <= kNegSkip) continue;
            const float w = std::exp(v - mx);
            const float* row = in.comp + r * D;
            denom += w;
            for (int64_t i = 0; i < D; ++i) oh[i] += w * row[i];
        }
        const float inv = 1.0f / denom;
        for (int64_t i = 0; i < D; ++i) oh[i] *= inv;
    }
}

struct SeqDot {
    float operator()(const float* a, const float* b, int64_t n) const { return dot_f32(a, b, n); }
};
struct LanesDot {
    float operator()(const float* a, const float* b, int64_t n) const { return dot_f32_lanes(a, b, n); }
};

// The x86 kernel for the active SIMD path, or null (scalar, NEON: the portable loops above).
AttendHeadsFn x86_kernel() {
#if defined(DS4_ARCH_X86)
    switch (simd_path()) {
        case SimdPath::AVX2: return attend_heads_avx2;
        case SimdPath::AVX512:
        case SimdPath::AVX512VNNI: return attend_heads_avx512;
        default: break;
    }
#endif
    return nullptr;
}

}  // namespace

void attend(const AttentionInputs& in, float* out, float* scores, ThreadPool* pool) {
    const int64_t n_head = in.n_head;
    if (AttendHeadsFn kernel = x86_kernel()) {
        std::vector<const float*> rows;
        rows.reserve((size_t)(in.n_raw + in.n_comp));
        for (int64_t r = 0; r < in.n_raw; ++r) {
            int64_t slot = in.raw_first + r;
            if (slot >= in.raw_cap) slot -= in.raw_cap;
            rows.push_back(in.raw + slot * in.head_dim);
        }
        for (int64_t r = 0; r < in.n_comp; ++r) {
            if (!in.allowed || in.allowed[r]) rows.push_back(in.comp + r * in.head_dim);
        }
        const AttentionRows list{rows.data(), (int64_t)rows.size()};
        const int64_t stride = in.raw_cap + in.n_comp;
        // Blocks of 4 heads share each row load (attention_simd.inc); a task is one or more blocks.
        const int64_t n_blocks = (n_head + 3) / 4;
        auto blocks = [&](int64_t b0, int64_t b1) {
            kernel(in, list, out, scores, stride, b0 * 4, std::min(n_head, b1 * 4));
        };
        if (pool) pool->parallel_for(n_blocks, std::ref(blocks), 1); else blocks(0, n_blocks);
        return;
    }
    const bool lanes = simd_path() != SimdPath::Scalar;
    auto heads = [&](int64_t h0, int64_t h1) {
        if (lanes) attend_heads(in, out, scores, h0, h1, LanesDot{});
        else attend_heads(in, out, scores, h0, h1, SeqDot{});
    };
    if (pool) pool->parallel_for(n_head, std::ref(heads), 1); else heads(0, n_head);
}

}  // namespace ds4
