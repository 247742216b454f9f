// Pieces shared by the builds of binade_sum (not part of its interface).
#pragma once
#include <cstdint>
#include <cstring>

#include "sampling/exp_weights.h"

namespace ds4 {

class ThreadPool;

float binade_seq_sum_avx512(const float* w, int64_t n);
float binade_seq_sum_from_avx512(const float* w, int64_t n, float s);
float binade_seq_sum_guided_avx512(const float* w, int64_t n, const float* chunk_sum, ThreadPool& pool);
float binade_weight_total_avx512(const float* x, int64_t n, float* wa);
int64_t binade_weight_walk_avx512(const float* x, const float* wa, int64_t n, float r);
int64_t binade_seq_walk_avx512(const float* w, int64_t n, float r);
int64_t binade_seq_until_avx512(const float* w, int64_t n, float total, float top_p, float& s);
void approx_exp_weights_avx512(const float* x, float* w, int64_t n);
float binade_logit_total_avx512(const float* a, int64_t n, float m, float t, bool all_finite, float zero_below, float* wa);
int64_t binade_logit_walk_avx512(const float* a, int64_t n, float m, float t, bool all_finite, float zero_below, const float* wa, float r);
float binade_logit_total_rcp_avx512(const float* a, int64_t n, float m, float t, bool all_finite, float zero_below,
                                    float rel, float* wa);
int64_t binade_logit_walk_rcp_avx512(const float* a, int64_t n, float m, float t, bool all_finite, float zero_below,
                                     float rel, const float* wa, float r);

namespace binade {

// Running values inside [2^-60, 2^60] use the integer model: their unit u >= 2^-83, so 1/u is a
// normal float and the approximation's 2^-125 absolute error is below 2^-40 units.
constexpr float kModelMin = 0x1p-60f;
constexpr float kModelMax = 0x1p+60f;

struct Unit {
    float u, inv_u;
};

// The unit u = 2^(e-23) of the binade [2^e, 2^(e+1)) holding s (kModelMin <= s <= kModelMax).
inline Unit unit_of(float s) {
    uint32_t b;
    std::memcpy(&b, &s, sizeof b);
    const int e = (int)(b >> 23) - 127;
    const uint32_t ub = (uint32_t)(e - 23 + 127) << 23, ib = (uint32_t)(23 - e + 127) << 23;
    Unit r;
    std::memcpy(&r.u, &ub, sizeof ub);
    std::memcpy(&r.inv_u, &ib, sizeof ib);
    return r;
}

// The plain walk r = fl(r - exp_weights(x[j])) over m <= 128 arguments: the first j with r <= 0,
// or -1 (r is left where the walk ended).
inline int64_t walk_plain(const float* x, int64_t m, float& r) {
    float wb[128];
    for (int64_t i = 0; i < m; i += 128) {
        const int64_t k = m - i < 128 ? m - i : 128;
        exp_weights(x + i, wb, k);
        for (int64_t j = 0; j < k; ++j) {
            r -= wb[j];
            if (r <= 0.0f) return i + j;
        }
    }
    return -1;
}

// The plain loops over given weights.
inline int64_t seq_walk_plain(const float* w, int64_t n, float& r) {
    for (int64_t i = 0; i < n; ++i) {
        r -= w[i];
        if (r <= 0.0f) return i;
    }
    return -1;
}

inline int64_t seq_until_plain(const float* w, int64_t n, float total, float top_p, float& s) {
    for (int64_t i = 0; i < n; ++i) {
        s += w[i];
        if (s / total >= top_p) return i;
    }
    return n;
}

}  // namespace binade
}  // namespace ds4
