// Log-probabilities of float32 logits over the finite ones (docs/sampling.md, "Log-probabilities"):
// lse = M + log(sum over finite l of exp((double)l - M)), M the largest finite logit, and
// logprob(l) = (float)((double)l - lse); the k most likely tokens are the k largest finite logits,
// equal logits by lower id first. The semantics are upstream's ds4_session_top_logprobs /
// ds4_session_token_logprob; the summation order is not (upstream adds sequentially with libm's
// exp): each build evaluates exp in double with its own polynomial and sums with compensated
// multi-lane accumulators, within the bound below.
//
// The bound, u = 2^-53: each term exp(d) is within kLogprobTermRel of exact (relative), the sum S
// within kLogprobSumRel of the exact sum of exact terms (every term is positive, so the term error
// carries over unchanged), and so the returned lse within
//     kLogprobSumRel + 2u ln(S) + u |lse|          (absolute; libm's log within 1 ulp)
// of M + ln(exact S); a logprob's double before its float rounding adds u |logprob|. Terms with
// exp((double)l - M) < e^-600 are counted as e^-600 (S >= 1, so that is far below u).
#pragma once
#include <cstdint>

namespace ds4 {

constexpr double kLogprobTermRel = 2.25 * 0x1p-53;
constexpr double kLogprobSumRel = 6.5 * 0x1p-53;

// The log-sum-exp over the finite logits; false (lse untouched) when none is finite.
bool finite_logsumexp(const float* a, int64_t n, double* lse);

// The sum behind it, over the finite logits of exp((double)l - M), within kLogprobSumRel of the
// exact sum (tests); 0 when none is finite.
double finite_exp_sum(const float* a, int64_t n);

// The ids of the min(k, finite count) largest finite logits, by logit descending then id
// ascending, to ids (room for min(k, n) entries); returns how many. With lse given, also the
// log-sum-exp as finite_logsumexp (NaN when no logit is finite), sharing one pass over the logits.
int64_t top_finite_logits(const float* a, int64_t n, int64_t k, int32_t* ids, double* lse = nullptr);

// Upstream's logprob of a token whose logit is not finite (its DS4_NEG_INF, -1e30, as a double).
constexpr double kNonFiniteLogprob = -1.0e30;

// (float)((double)logit - lse) for a finite logit (returned widened), kNonFiniteLogprob otherwise.
inline double logprob_of(float logit, double lse) {
    return logit - logit == 0.0f ? (double)(float)((double)logit - lse) : kNonFiniteLogprob;
}

// The per-term exponential of the active build, exp(d) for d in [-600, 0] (tests:
// tests/test_sampling_logprobs.py measures its error).
void logprob_exp(const double* d, double* out, int64_t n);

}  // namespace ds4
