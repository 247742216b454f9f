// logprobs.h: one stats pass (finite count, maximum, block maxima), the exponential sum, and the
// top k taken from the logits above a floor the block maxima give (docs/sampling.md,
// "Log-probabilities").
#include "sampling/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

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

Stats stats(const float* a, int64_t n, float* block_max) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return stats_avx512(a, n, block_max);
#endif
    return stats_generic(a, n, block_max);
}

double exp_sum(const float* a, int64_t n, float m, bool all_finite) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return exp_sum_avx512(a, n, m, all_finite);
#endif
    return exp_sum_generic(a, n, m, all_finite);
}

double lse_of(const float* a, int64_t n, const Stats& st) {
    return (double)st.max + std::log(exp_sum(a, n, st.max, st.n_finite == n));
}

// The k (<= finite count) best ids. The k-th largest block maximum is a floor: the k largest
// maxima are k distinct finite logits at or above it, so the k best are too. Logits above it are
// ranked; the first ones equal to it (id order) fill what is left. Fewer than k blocks with a
// finite logit: every finite logit is ranked.
int64_t select_top(const float* a, int64_t n, int64_t k, float* block_max, int32_t* ids) {
    Scratch& s = scratch();
    const int64_t n_blocks = (n + kBlock - 1) / kBlock;
    float floor = -std::numeric_limits<float>::infinity();
    if (k <= n_blocks) {
        std::nth_element(block_max, block_max + (k - 1), block_max + n_blocks, std::greater<float>());
        floor = block_max[k - 1];
    }
    const bool tie_fill = floor > -std::numeric_limits<float>::infinity();
    if ((int64_t)s.above.size() < n + 16) {
        s.above.resize((size_t)n + 16);
        s.vals.resize((size_t)n + 16);
    }
    if ((int64_t)s.tied.size() < k + 16) s.tied.resize((size_t)k + 16);
    int64_t n_tied = 0;
    const int64_t n_above = collect_above_and_tied(a, n, floor, s.above.data(), s.vals.data(), tie_fill ? k : 0,
                                                   s.tied.data(), &n_tied);
    const float* vals = s.vals.data();
    // positions into above/vals, ranked by logit descending then id ascending (ids ascend with the
    // position: the collection keeps id order)
    std::vector<int32_t>& pos = s.pos;
    pos.resize((size_t)n_above);
    for (int64_t i = 0; i < n_above; ++i) pos[(size_t)i] = (int32_t)i;
    const int64_t ranked = std::min(n_above, k);
    std::partial_sort(pos.begin(), pos.begin() + ranked, pos.end(),
                      [vals](int32_t x, int32_t y) { return vals[x] > vals[y] || (vals[x] == vals[y] && x < y); });
    int64_t out = 0;
    for (; out < ranked; ++out) ids[out] = s.above[(size_t)pos[(size_t)out]];
    for (int64_t t = 0; out < k && t < n_tied; ++t) ids[out++] = s.tied[(size_t)t];
    return out;
}

}  // namespace

bool finite_logsumexp(const float* a, int64_t n, double* lse) {
    Scratch& s = scratch();
    s.block_max.resize((size_t)((n + kBlock - 1) / kBlock) + 1);
    const Stats st = stats(a, n, s.block_max.data());
    if (st.n_finite == 0) return false;
    *lse = lse_of(a, n, st);
    return true;
}

int64_t top_finite_logits(const float* a, int64_t n, int64_t k, int32_t* ids, double* lse) {
    Scratch& s = scratch();
    s.block_max.resize((size_t)((n + kBlock - 1) / kBlock) + 1);
    const Stats st = stats(a, n, s.block_max.data());
    if (lse) *lse = st.n_finite ? lse_of(a, n, st) : std::numeric_limits<double>::quiet_NaN();
    k = std::min(k, st.n_finite);
    if (k <= 0) return 0;
    return select_top(a, n, k, s.block_max.data(), ids);
}

void logprob_exp(const double* d, double* out, int64_t n) {
#if defined(DS4_ARCH_X86)
    if (sampling_avx512()) return exp_avx512(d, out, n);
#endif
    exp_generic(d, out, n);
}

}  // namespace ds4
