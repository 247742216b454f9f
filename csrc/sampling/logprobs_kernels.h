// The whole-vocabulary passes behind logprobs.h, one build per file (logprobs_generic.cpp, and
// logprobs_avx512.cpp / logprobs_avx2.cpp / logprobs_neon.cpp chosen at run time); logprobs.cpp
// combines them.
#pragma once
#include <cstdint>

namespace ds4 {
namespace logprob_kernels {

// Blocks of this many logits have their maxima taken by the stats pass (the top-k floor).
constexpr int64_t kBlock = 256;

// Arguments below this are counted as exp(kClamp) (docs/sampling.md, "Log-probabilities").
constexpr double kClamp = -600.0;

struct Stats {
    float max;          // the largest finite logit (-inf when none is finite)
    float min;          // the smallest finite logit (+inf when none is finite)
    int64_t n_finite;
};

// What the exponential pass also collects, in id order: the finite logits above `floor` (ids and
// values) and the first `limit` ids whose logit equals it. `above_floor` is the next float above
// floor (once `limit` ties are in, "at least above_floor" is "above floor"). +inf: nothing.
struct Collect {
    float floor, above_floor;
    int64_t limit;
    int32_t* above;   // room for `room` ids and values
    float* vals;
    int32_t* tied;    // room for limit
    int64_t room;
    int64_t n_above = 0, n_tied = 0;
    bool overflow = false;   // more than `room` above floor: the logits changed under the call
};

// exp(d) = 2^q 2^(j/16) exp(r), k = 16q + j, r = d - k ln2/16 with |r| <= ln2/32. 2^(j/16) is the
// nearest double, stored as its bits minus j << 48 so that adding k << 48 gives 2^q 2^(j/16) with
// one integer add (the low 4 bits of k pick j, the rest of k lands in the exponent); 2^q stays
// normal for d >= kClamp.
constexpr uint64_t table_entry(double v, int j) { return __builtin_bit_cast(uint64_t, v) - ((uint64_t)j << 48); }

alignas(64) constexpr uint64_t kTable[16] = {
    table_entry(0x1.0000000000000p+0, 0),  table_entry(0x1.0b5586cf9890fp+0, 1),
    table_entry(0x1.172b83c7d517bp+0, 2),  table_entry(0x1.2387a6e756238p+0, 3),
    table_entry(0x1.306fe0a31b715p+0, 4),  table_entry(0x1.3dea64c123422p+0, 5),
    table_entry(0x1.4bfdad5362a27p+0, 6),  table_entry(0x1.5ab07dd485429p+0, 7),
    table_entry(0x1.6a09e667f3bcdp+0, 8),  table_entry(0x1.7a11473eb0187p+0, 9),
    table_entry(0x1.8ace5422aa0dbp+0, 10), table_entry(0x1.9c49182a3f090p+0, 11),
    table_entry(0x1.ae89f995ad3adp+0, 12), table_entry(0x1.c199bdd85529cp+0, 13),
    table_entry(0x1.d5818dcfba487p+0, 14), table_entry(0x1.ea4afa2a490dap+0, 15),
};

constexpr double kInvLn2_16 = 0x1.71547652b82fep+4;   // 16 / ln2
// The fused builds' ln2/16: the nearest double plus the rest. With k != 0, |d| >= ln2/32 makes d a
// multiple of 2^-58 and k kLn2Hi16 one of 2^-57, so their difference (below 2^-5) is exact and the
// fused step rounds nothing; the second step rounds r once (u |r|), and |k kLn2Lo16| < 2^-43.
// (The portable build, without fused steps, splits ln2/16 its own way.)
constexpr double kLn2Hi16 = 0x1.62e42fefa39efp-5;
constexpr double kLn2Lo16 = 0x1.abc9e3b39803fp-60;
constexpr double kShifter = 0x1.8p52;                 // adding 1.5 * 2^52 rounds to an integer
// (e^r - 1) / r = 1 + r/2 + ... + r^6/7!: Taylor, truncation below 2^-54 relative for |r| <= ln2/32,
// and it is multiplied by r (so below 2^-59 of the result).
constexpr double kC[7] = {1.0, 0.5, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040};

// One pass: Stats, and the largest finite logit of each block of kBlock (-inf for a block without
// any) to block_max (ceil(n / kBlock) entries).
Stats stats_generic(const float* a, int64_t n, float* block_max);
// The sum over finite logits of exp(max((double)l - m, kClamp)), within kLogprobSumRel of the
// exact one (logprobs.h). `plain`: every logit is finite and at least m + kClamp (no masks, no
// clamp). col (may be null): also collects as Collect says.
double exp_sum_generic(const float* a, int64_t n, float m, bool plain, Collect* col);
void exp_generic(const double* d, double* out, int64_t n);
#if defined(DS4_ARCH_X86)
Stats stats_avx2(const float* a, int64_t n, float* block_max);
double exp_sum_avx2(const float* a, int64_t n, float m, bool plain, Collect* col);
void exp_avx2(const double* d, double* out, int64_t n);
Stats stats_avx512(const float* a, int64_t n, float* block_max);
double exp_sum_avx512(const float* a, int64_t n, float m, bool plain, Collect* col);
void exp_avx512(const double* d, double* out, int64_t n);
#endif
#if defined(DS4_ARCH_ARM64)
Stats stats_neon(const float* a, int64_t n, float* block_max);
double exp_sum_neon(const float* a, int64_t n, float m, bool plain, Collect* col);
void exp_neon(const double* d, double* out, int64_t n);
#endif

// The scalar end of a stats block (its logits [i, end) past the last whole vector): the finite
// count, the minimum and the block's maximum `hi` updated, then recorded in `slot` and st.max.
inline void finish_block(const float* a, int64_t i, int64_t end, float hi, int64_t& fin, Stats& st, float& slot) {
    for (; i < end; ++i) {
        const bool f = a[i] - a[i] == 0.0f;
        fin += f;
        if (f && a[i] > hi) hi = a[i];
        if (f && a[i] < st.min) st.min = a[i];
    }
    slot = hi;
    if (hi > st.max) st.max = hi;
}

// The per-lane compensated sums (s[j] + c[j], j < lanes) combined by the same error-free step, lane
// 0 first: every build ends its pass here, so the lanes' order is one contract.
inline double combine_lanes(const double* s, const double* c, int lanes) {
    double total = s[0], comp = c[0];
    for (int j = 1; j < lanes; ++j) {
        const double t = total + s[j];
        const double z = t - total;
        comp += ((total - (t - z)) + (s[j] - z)) + c[j];
        total = t;
    }
    return total + comp;
}

// Collect's step for one logit known to be finite and at least col.floor.
inline void collect_one(Collect& col, const float* a, int64_t i) {
    if (a[i] > col.floor) {
        if (col.n_above == col.room) {
            col.overflow = true;
            return;
        }
        col.above[col.n_above] = (int32_t)i;
        col.vals[col.n_above++] = a[i];
    } else if (col.n_tied < col.limit) {
        col.tied[col.n_tied++] = (int32_t)i;
    }
}

}  // namespace logprob_kernels
}  // namespace ds4
