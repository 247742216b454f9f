// The logprob passes in plain C++ (no fused multiply-adds: the portable build has none in
// hardware), for any CPU and for DS4_SIMD=scalar. Same bound as the vector builds, other bits
// (docs/sampling.md, "Log-probabilities").
#include <cstring>

#include "sampling/logprobs_kernels.h"

namespace ds4 {
namespace logprob_kernels {

namespace {

// ln2/16 split so that k * kLn2Hi is exact for |k| < 2^21 (fdlibm's split, over 16): with k
// within one of round(d 16/ln2), d - k kLn2Hi is then exact (Sterbenz) and r errs by about
// u |r| + |k| 2^-80.
constexpr double kLn2Hi = 0x1.62e42fee00000p-5;
constexpr double kLn2Lo = 0x1.a39ef35793c76p-37;

inline double from_bits(uint64_t b) {
    double v;
    std::memcpy(&v, &b, sizeof v);
    return v;
}

// exp(d) for d in [kClamp, 0] (logprobs_kernels.h): T + T (e^r - 1) with T = 2^q 2^(j/16); the
// small part carries the polynomial's rounding, so the result errs by the table's rounding plus
// the last add's (about 2u relative).
inline double exp_term(double d) {
    const double kshift = d * kInvLn2_16 + kShifter;
    const double k = kshift - kShifter;
    const double r = (d - k * kLn2Hi) - k * kLn2Lo;
    double h = kC[6];
    for (int i = 5; i >= 0; --i) h = h * r + kC[i];
    uint64_t kb;
    std::memcpy(&kb, &kshift, sizeof kb);
    const uint64_t scale = kb << 48;   // (k << 48) mod 2^64: the exponent and table index of k
    const double t = from_bits(kTable[kb & 15] + scale);
    return t + (t * r) * h;
}

inline double term(float v, double m) {
    if (!(v - v == 0.0f)) return 0.0;
    const double d = (double)v - m;
    return exp_term(d < kClamp ? kClamp : d);
}

// Error-free: s + c gains x exactly in s (new) plus the error term added to c.
inline void two_sum(double& s, double& c, double x) {
    const double t = s + x;
    const double z = t - s;
    c += (s - (t - z)) + (x - z);
    s = t;
}

}  // namespace

Stats stats_generic(const float* a, int64_t n, float* block_max) {
    Stats st{-__builtin_inff(), __builtin_inff(), 0};
    for (int64_t b = 0; b * kBlock < n; ++b) {
        const int64_t end = (b + 1) * kBlock < n ? (b + 1) * kBlock : n;
        float hi = -__builtin_inff();
        for (int64_t i = b * kBlock; i < end; ++i) {
            const bool fin = a[i] - a[i] == 0.0f;
            st.n_finite += fin;
            if (fin && a[i] > hi) hi = a[i];
            if (fin && a[i] < st.min) st.min = a[i];
        }
        block_max[b] = hi;
        if (hi > st.max) st.max = hi;
    }
    return st;
}

// Eight terms at a time added as a tree (three roundings), then into the compensated accumulator.
// (The portable build has no use for `plain`: its per-term test is a branch either way.)
double exp_sum_generic(const float* a, int64_t n, float m, bool plain, Collect* col) {
    const double md = m;
    const float inf = __builtin_inff();
    float at_least = !col ? inf : col->n_tied >= col->limit ? col->above_floor : col->floor;
    double s = 0.0, c = 0.0;
    int64_t i = 0;
    auto step = [&](int64_t j) {
        if (a[j] >= at_least && a[j] - a[j] == 0.0f) {
            collect_one(*col, a, j);
            if (col->n_tied >= col->limit) at_least = col->above_floor;
        }
        return term(a[j], md);
    };
    for (; i + 8 <= n; i += 8) {
        double w[8];
        for (int j = 0; j < 8; ++j) w[j] = step(i + j);
        two_sum(s, c, ((w[0] + w[1]) + (w[2] + w[3])) + ((w[4] + w[5]) + (w[6] + w[7])));
    }
    for (; i < n; ++i) two_sum(s, c, step(i));
    return s + c;
}

void exp_generic(const double* d, double* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = exp_term(d[i] < kClamp ? kClamp : d[i]);
}

}  // namespace logprob_kernels
}  // namespace ds4
