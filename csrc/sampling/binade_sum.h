// Sequential float32 sums and walks over the sampling weights, computed a binade at a time
// (docs/sampling.md, "Exact sums without the add chain"). Every function returns exactly what the
// plain one-add-at-a-time float32 loop returns; only the time differs.
#pragma once
#include <cstdint>

namespace ds4 {

class ThreadPool;

// s = 0; for i: s = fl(s + w[i]); return s. Any inputs (inf, NaN, negative, denormal).
float binade_seq_sum(const float* w, int64_t n);

// The same loop from a running sum s instead of 0 (a sum carried over pieces of an array:
// probabilities() of the whole vocabulary).
float binade_seq_sum_from(const float* w, int64_t n, float s);

// The same loop over the weights exp_weights(x) (x: shifted arguments <= 0 or -inf), without
// evaluating most of those exponentials exactly. When wa is not null it receives an
// approximation of every weight (within kApproxWeightRel relative + 2^-125 absolute): a guide for
// choosing thresholds, never used for a decision that must be exact.
float binade_weight_total(const float* x, int64_t n, float* wa);

// The walk r = fl(r - w[i]) over the weights exp_weights(x) in order: the first i where
// r <= 0, or -1 when the walk runs off the end. wa: binade_weight_total's approximations of the
// same weights (saves evaluating them again), or null.
int64_t binade_weight_walk(const float* x, const float* wa, int64_t n, float r);

// binade_weight_total and binade_weight_walk over the arguments of logits a, shifted_args(a, m, t)
// (scan.h), computed as they are read: the whole vocabulary's passes read the logits alone.
// all_finite: a has no NaN or inf (then the finiteness test is skipped); lowest: the smallest
// finite logit (runs of logits that weigh exactly 0 are skipped when some do). Neither changes
// results. wa (when not null) receives approximations of the weights, as binade_weight_total's.
float binade_logit_total(const float* a, int64_t n, float m, float t, bool all_finite, float lowest,
                         float* wa = nullptr);
int64_t binade_logit_walk(const float* a, int64_t n, float m, float t, bool all_finite, float lowest, const float* wa,
                          float r);

// At a temperature t != 1 the argument's division fl(fl(a - m) / t) is the slowest step of the
// passes above. Their approximate weights need the argument only to ~2^-20: when the arguments
// span little (|fl(lowest - m) / t| <= 4), taking it as fl(fl(a - m) * fl(1/t)) moves each weight
// by a relative 2^-22 at most, and the certificate widened by that much still decides every
// rounding exactly (docs/sampling.md, "The division at T != 1"). reciprocal_weight_rel gives that
// widened bound, or 0 when the reciprocal may not be used (t == 1, or wide arguments).
float reciprocal_weight_rel(float m, float t, float lowest);

// binade_logit_total and binade_logit_walk with those approximations (rel from
// reciprocal_weight_rel, not 0); the same results. wa then holds approximations within rel (not
// kApproxWeightRel), and the walk must be given the same rel as the total whose wa it reads.
float binade_logit_total_rcp(const float* a, int64_t n, float m, float t, bool all_finite, float lowest, float rel,
                             float* wa);
int64_t binade_logit_walk_rcp(const float* a, int64_t n, float m, float t, bool all_finite, float lowest, float rel,
                              const float* wa, float r);

// binade_seq_sum of weights w >= 0 split over `pool` (AVX-512 builds; elsewhere the serial sum),
// given each chunk's float sum chunk_sum[c] of w[c * kBinadeChunk, (c + 1) * kBinadeChunk) in any
// order (a guide to the unit the running sum has there: total_parallel's method, docs/sampling.md).
// The same bits as the serial sum. probabilities() of the whole vocabulary on two threads.
constexpr int64_t kBinadeChunk = 128;
float binade_seq_sum_guided(const float* w, int64_t n, const float* chunk_sum, ThreadPool& pool);

// The same walk over given weights w (any values): the first i where fl(r - ...) <= 0, or -1.
int64_t binade_seq_walk(const float* w, int64_t n, float r);

// s = fl(s + w[i]) for i = 0, 1, ... (from the s given) until fl(s / total) >= top_p after an
// addition: returns that i (s includes w[i]), or n when it never happens (s is then the whole sum).
// w >= 0 (the plain loop runs otherwise, with the same result).
int64_t binade_seq_until(const float* w, int64_t n, float total, float top_p, float& s);

// The fast exponential used to skip exact evaluations (exp_weights itself where there is no
// AVX-512 build), and its relative error bound against exp_weights for arguments >= -87 (2^-125
// absolute below). Checked over every float32 argument in [-87, 0]: at most
// 2^-21.2 (tests/test_sampling.py samples it); the bound leaves a factor 2.3.
void approx_exp_weights(const float* x, float* w, int64_t n);
constexpr float kApproxWeightRel = 0x1p-20f;

}  // namespace ds4
