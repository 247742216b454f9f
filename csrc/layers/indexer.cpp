#include "layers/indexer.h"

#include <cmath>
#include <algorithm>
#include <functional>
#include <cstring>
#include <vector>

#include "common/thread_pool.h"
#include "layers/attention_simd.h"
#include "layers/fp_quant.h"
#include "layers/numerics.h"
#include "layers/rope.h"
#include "quant/kernels.h"
#include "quant/simd.h"

namespace ds4 {

namespace {

LanesRowDotsFn x86_row_dots() {
#if defined(DS4_ARCH_X86)
    switch (simd_path()) {
        case SimdPath::AVX2: return lanes_row_dots_avx2;
        case SimdPath::AVX512:
        case SimdPath::AVX512VNNI: return lanes_row_dots_avx512;
        default: break;
    }
#endif
    return nullptr;
}

}  // namespace

void indexer_scores(float* q, float* w, const float* rows, int64_t n_comp, int64_t nh, int64_t hd, int64_t n_rot,
                    int64_t pos, const RopeParams& rope, float* scores, ThreadPool* pool) {
    rope_tail(q, nh, hd, n_rot, pos, rope, false);
    for (int64_t h = 0; h < nh; ++h) indexer_qat_row(q + h * hd, hd);
    const float scale = 1.0f / std::sqrt((float)(hd * nh));
    for (int64_t h = 0; h < nh; ++h) w[h] *= scale;

    const bool lanes = simd_path() != SimdPath::Scalar;
    const LanesRowDotsFn row_dots = x86_row_dots();
    auto score_rows = [&](int64_t c0, int64_t c1) {
        if (row_dots) {   // the lanes dots, all heads per row load (attention_simd.inc): same bits
            std::vector<const float*> qs((size_t)nh);
            std::vector<float> d((size_t)nh);
            for (int64_t h = 0; h < nh; ++h) qs[(size_t)h] = q + h * hd;
            for (int64_t c = c0; c < c1; ++c) {
                row_dots(qs.data(), nh, rows + c * hd, hd, d.data());
                float acc = 0.0f;
                for (int64_t h = 0; h < nh; ++h) acc += (d[(size_t)h] < 0.0f ? 0.0f : d[(size_t)h]) * w[h];
                scores[c] = acc;
            }
            return;
        }
        auto run = [&](auto dot) {
            for (int64_t c = c0; c < c1; ++c) {
                const float* kv = rows + c * hd;
                float acc = 0.0f;
                for (int64_t h = 0; h < nh; ++h) {
                    float d = dot(kv, q + h * hd, hd);
                    if (d < 0.0f) d = 0.0f;
                    acc += d * w[h];
                }
                scores[c] = acc;
            }
        };
        if (lanes) {
            run([](const float* a, const float* b, int64_t n) { return dot_f32_lanes(a, b, n); });
        } else {
            run([](const float* a, const float* b, int64_t n) { return dot_f32(a, b, n); });
        }
    };
    if (pool) pool->parallel_for(n_comp, std::ref(score_rows), 64); else score_rows(0, n_comp);
}

void select_top_k(const float* scores, int64_t n, int64_t k, int32_t* order, uint8_t* allowed) {
    std::memset(allowed, 0, (size_t)n);
    int64_t m = 0;
    for (int64_t c = 0; c < n; ++c) {
        if (scores[c] > kNeg) order[m++] = (int32_t)c;   // false for NaN and the sentinel
    }
    const int64_t take = std::min(k, m);
    auto better = [scores](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); };
    if (take < m) std::nth_element(order, order + take, order + m, better);
    for (int64_t i = 0; i < take; ++i) allowed[order[i]] = 1;
    if (take < k && n > 0) allowed[0] = 1;
}

}  // namespace ds4
