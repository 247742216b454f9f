// logprobs.h: one stats pass (finite count, maximum, block maxima), the exponential sum, and the
// top k taken from the logits above a floor the block maxima give (docs/sampling.md,
// "Log-probabilities").
#include "sampling/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "quant/simd.h"
#include "sampling/exp_weights.h"
#include "sampling/logprobs_kernels.h"
#include "sampling/scan.h"

namespace ds4 {

namespace {

using namespace logprob_kernels;

struct Scratch {
    std::vector<float> block_max, vals;
    std::vector<int32_t> above, tied, pos;
};

Scratch& scratch() {
    thread_local Scratch s;
    return s;
}

// The build the active SIMD path allows (DS4_SIMD=scalar: the portable one).
// On arm64 the NEON build runs where the NEON kernel path does (it needs only base ASIMD, but is
// compiled with the flags of every *_neon.cpp: CMakeLists.txt).
enum class Build { Generic, Avx2, Avx512, Neon };

Build build() {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return Build::Avx512;
    if (simd_path() == SimdPath::AVX2) return Build::Avx2;
#endif
#if defined(DS4_ARCH_ARM64)
    if (simd_path() == SimdPath::NEON) return Build::Neon;
#endif
    return Build::Generic;
}

Stats stats(const float* a, int64_t n, float* block_max) {
    switch (build()) {
#if defined(DS4_ARCH_X86)
        case Build::Avx512: return stats_avx512(a, n, block_max);
        case Build::Avx2: return stats_avx2(a, n, block_max);
#endif
#if defined(DS4_ARCH_ARM64)
        case Build::Neon: return stats_neon(a, n, block_max);
#endif
        default: return stats_generic(a, n, block_max);
    }
}

double sum_of(const float* a, int64_t n, const Stats& st, Collect* col) {
    const bool plain = st.n_finite == n && (double)st.min - (double)st.max >= kClamp;
    switch (build()) {
#if defined(DS4_ARCH_X86)
        case Build::Avx512: return exp_sum_avx512(a, n, st.max, plain, col);
        case Build::Avx2: return exp_sum_avx2(a, n, st.max, plain, col);
#endif
#if defined(DS4_ARCH_ARM64)
        case Build::Neon: return exp_sum_neon(a, n, st.max, plain, col);
#endif
        default: return exp_sum_generic(a, n, st.max, plain, col);
    }
}

double lse_of(const float* a, int64_t n, const Stats& st, Collect* col) {
    return (double)st.max + std::log(sum_of(a, n, st, col));
}

bool by_logit_then_id(const float* vals, int32_t x, int32_t y) {
    return vals[x] > vals[y] || (vals[x] == vals[y] && x < y);
}

}  // namespace

bool finite_logsumexp(const float* a, int64_t n, double* lse) {
    Scratch& s = scratch();
    s.block_max.resize((size_t)((n + kBlock - 1) / kBlock) + 1);
    const Stats st = stats(a, n, s.block_max.data());
    if (st.n_finite == 0) return false;
    *lse = lse_of(a, n, st, nullptr);
    return true;
}

double finite_exp_sum(const float* a, int64_t n) {
    Scratch& s = scratch();
    s.block_max.resize((size_t)((n + kBlock - 1) / kBlock) + 1);
    const Stats st = stats(a, n, s.block_max.data());
    return st.n_finite ? sum_of(a, n, st, nullptr) : 0.0;
}

// The k-th largest block maximum is a floor: the k largest maxima are k distinct finite logits at
// or above it, so the k best are too. The logits above it lie in the (at most k - 1) blocks whose
// maximum is above it, so at most (k - 1) kBlock of them; they are ranked, and the first ones
// equal to it (id order) fill what is left. They are collected during the exponential's pass. With
// fewer than k blocks holding a finite logit, every finite logit is ranked (a pass of its own).
int64_t top_finite_logits(const float* a, int64_t n, int64_t k, int32_t* ids, double* lse) {
    Scratch& s = scratch();
    const int64_t n_blocks = (n + kBlock - 1) / kBlock;
    s.block_max.resize((size_t)n_blocks + 1);
    const Stats st = stats(a, n, s.block_max.data());
    k = std::min(k, st.n_finite);
    const float inf = std::numeric_limits<float>::infinity();
    float floor = inf;   // nothing to collect
    if (k > 0) {
        floor = -inf;
        if (k <= n_blocks) {
            float* bm = s.block_max.data();
            std::nth_element(bm, bm + (k - 1), bm + n_blocks, std::greater<float>());
            floor = bm[k - 1];
        }
    }
    // Collected during the exponential's pass when there is one and the floor is finite; else (and
    // if more logits than the blocks allow rise above the floor: only when the logits change during
    // the call) by a pass of its own over every logit above the floor.
    const bool fused = lse && floor > -inf;
    const int64_t room = fused ? std::min(n, std::max<int64_t>(k - 1, 0) * kBlock) : n;
    if ((int64_t)s.above.size() < room + 16) {
        s.above.resize((size_t)room + 16);
        s.vals.resize((size_t)room + 16);
    }
    if ((int64_t)s.tied.size() < k + 16) s.tied.resize((size_t)k + 16);
    const int64_t limit = floor > -inf && floor < inf ? k : 0;
    Collect col{floor, std::nextafter(floor, inf), limit, s.above.data(), s.vals.data(), s.tied.data(), room};
    if (lse) *lse = st.n_finite ? lse_of(a, n, st, fused ? &col : nullptr) : std::numeric_limits<double>::quiet_NaN();
    if (k <= 0) return 0;
    if (!fused || col.overflow) {
        if ((int64_t)s.above.size() < n + 16) {
            s.above.resize((size_t)n + 16);
            s.vals.resize((size_t)n + 16);
        }
        col = Collect{floor, col.above_floor, limit, s.above.data(), s.vals.data(), s.tied.data(), n};
        col.n_above = collect_above_and_tied(a, n, floor, col.above, col.vals, limit, col.tied, &col.n_tied);
    }
    const float* vals = col.vals;
    std::vector<int32_t>& pos = s.pos;   // positions into above/vals (ids ascend with them)
    pos.resize((size_t)col.n_above);
    for (int64_t i = 0; i < col.n_above; ++i) pos[(size_t)i] = (int32_t)i;
    const int64_t ranked = std::min(col.n_above, k);
    std::partial_sort(pos.begin(), pos.begin() + ranked, pos.end(),
                      [vals](int32_t x, int32_t y) { return by_logit_then_id(vals, x, y); });
    int64_t out = 0;
    for (; out < ranked; ++out) ids[out] = col.above[(size_t)pos[(size_t)out]];
    for (int64_t t = 0; out < k && t < col.n_tied; ++t) ids[out++] = col.tied[(size_t)t];
    return out;
}

void logprob_exp(const double* d, double* out, int64_t n) {
    switch (build()) {
#if defined(DS4_ARCH_X86)
        case Build::Avx512: return exp_avx512(d, out, n);
        case Build::Avx2: return exp_avx2(d, out, n);
#endif
#if defined(DS4_ARCH_ARM64)
        case Build::Neon: return exp_neon(d, out, n);
#endif
        default: return exp_generic(d, out, n);
    }
}

}  // namespace ds4
