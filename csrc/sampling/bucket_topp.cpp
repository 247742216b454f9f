#include "sampling/bucket_topp.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cfloat>
#include <cstring>

#include "sampling/binade_sum_impl.h"
#include "sampling/bucket_collect.h"
#include "sampling/exp_weights.h"
#include "sampling/scan.h"

// Why a bucket may be added as a count of units (docs/sampling.md, "Top-p over buckets"). Let the
// running sum be s = S u with u = 2^(e-23) and 2^23 <= S < 2^24, and let the bucket's terms w_k
// have no w_k / u that is a half-integer, with S + sum_k round(w_k / u) < 2^24. Each partial sum
// S' u plus w_k then lies below 2^(e+1) - u/2, where the floats are the multiples of u, so
// fl(S' u + w_k) = (S' + round(w_k / u)) u whatever the order of the terms: the bucket's float sum
// in sorted order is (S + R) u. Going down (the draw's walk) the same holds while S - R >= 2^23 + 1:
// every exact difference stays above 2^e + u/2 (at 2^23 it may fall below 2^e, onto the finer grid).
// A bucket's rounded units come from the approximate weights when the error interval of every term
// rounds to one integer (that also rules out a half-integer), else from its exact weights; an exact
// half-integer (a tie, whose rounding depends on the parity of S', i.e. on the order) sorts it.
// Over the whole vocabulary most buckets need neither: bounds on every weight of the bucket, from
// its logit interval, round to one integer (weight_bounds, certified), and only the buckets that
// fail have their ids collected (plan, collect).

namespace ds4 {

namespace {

#if defined(DS4_ARCH_X86) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define DS4_BUCKET_HOT __attribute__((target_clones("arch=x86-64-v4", "default"), noinline))
#else
#define DS4_BUCKET_HOT
#endif

constexpr float kShifter = 0x1.8p23f;   // y + 1.5 * 2^23 rounds 0 <= y < 2^22 to an integer

std::atomic<float> g_min_kept{40000.0f};
std::atomic<int64_t> g_selections{0};
std::atomic<int64_t> g_prefix_selections{0};
std::atomic<float> g_prefix_min{1024.0f};
std::atomic<float> g_early_max{50000.0f};
std::atomic<int64_t> g_collections{0};
std::atomic<int> g_plan{0};

// b = fl(fl(hi - l) * scale) clamped to top, the index of logit l's bucket: monotone in l (a
// rounded subtraction and a rounded product by a positive constant never reverse an order), and
// equal logits share it. Not finite: `none`.
DS4_BUCKET_HOT void bucket_index(const float* a, int64_t n, float hi, float scale, float top, float none,
                                 bool all_finite, uint16_t* out) {
    for (int64_t i = 0; i < n; ++i) {
        const float v = a[i];
        float d = (hi - v) * scale;
        d = d < top ? d : top;
        if (!all_finite && !(v - v == 0.0f)) d = none;
        out[i] = (uint16_t)(int32_t)d;
    }
}

// The same for a collected prefix, whose logits are read by id: a[sub[j]] (all finite).
DS4_BUCKET_HOT void bucket_index_sub(const float* a, const int32_t* sub, int64_t n, float hi, float scale, float top,
                                     uint16_t* out) {
    for (int64_t j = 0; j < n; ++j) {
        float d = (hi - a[sub[j]]) * scale;
        d = d < top ? d : top;
        out[j] = (uint16_t)(int32_t)d;
    }
}

// A packed prefix (collect_prefix's words): its ids, and as bucket index the level's range,
// level * nb >> fine_bits (monotone in the level, so in the logit; equal logits share it).
DS4_BUCKET_HOT void unpack_prefix(const uint32_t* w, int64_t n, int id_bits, int fine_bits, uint32_t nb, int32_t* ids,
                                  uint16_t* out) {
    const uint32_t mask = (uint32_t)((1ull << id_bits) - 1);
    for (int64_t j = 0; j < n; ++j) {
        ids[j] = (int32_t)(w[j] & mask);
        out[j] = (uint16_t)(((w[j] >> id_bits) * nb) >> fine_bits);
    }
}

// off[k + 1] = how many bix[i] == k, for k <= nb (nb: not finite). Two histograms, even and odd
// positions, summed at the end: a run of one bucket (ties, a narrow peak) then chains an increment
// on the one before it only every other token (one histogram: 71 -> 38 us on the bench's flat
// logits, per call).
DS4_BUCKET_HOT void count_buckets(const uint16_t* bix, int64_t n, int nb, uint32_t* off, uint32_t* odd) {
    std::memset(off, 0, sizeof(uint32_t) * (size_t)(nb + 2));
    std::memset(odd, 0, sizeof(uint32_t) * (size_t)(nb + 2));
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) {
        ++off[bix[i] + 1];
        ++odd[bix[i + 1] + 1];
    }
    if (i < n) ++off[bix[i] + 1];
    for (int k = 1; k <= nb + 1; ++k) off[k] += odd[k];
}

// The lowest and the highest argument fl(-d / t) of each bucket's tokens (weight_bounds): d lies in
// [k (1 - 2^-24), k + 1) / scale, widened here by 2^-20 so that the double product's and the
// float conversion's roundings (2^-52, 2^-24 relative) stay inside; the last bucket ends at dmax.
// (inv_scale 0: one bucket, d in [0, dmax].)
DS4_BUCKET_HOT void bucket_arguments(int nb, double inv_scale, float dmax, float t, float* xa, float* xb) {
    for (int k = 0; k < nb; ++k) {
        const float dlo = (float)((double)k * inv_scale * (1.0 - 0x1p-20));
        float dhi = (float)((double)(k + 1) * inv_scale * (1.0 + 0x1p-20));
        dhi = k + 1 < nb && dhi < dmax ? dhi : dmax;
        xa[k] = -(dhi / t);   // t = 1: d itself, as shifted_args
        xb[k] = -((dlo < dhi ? dlo : dhi) / t);
    }
}

// The rounded units of approximate weights w (y = w * inv_u, exact: inv_u is a power of two) whose
// exact values lie within y * rel (plus far below 2^-40) of y: false when any rounding is uncertain.
// The bounds fl(y (1 -+ 2 rel)) still enclose the exact value strictly after their own rounding
// (the factor 2 covers it), and adding 1.5 * 2^23 rounds each to an integer: equal integers mean
// the exact value rounds to it and is no half-integer. Terms above 2^21 units are never certain.
DS4_BUCKET_HOT bool approx_units(const float* wa, const int32_t* ids, int64_t m, float inv_u, float rel, int64_t& units) {
    const float up = 1.0f + 2.0f * rel, down = 1.0f - 2.0f * rel;
    int64_t acc = 0;
    int bad = 0;
    for (int64_t j = 0; j < m; ++j) {
        const float y0 = wa[ids[j]] * inv_u;
        const bool big = !(y0 <= 0x1p21f);   // (NaN too)
        const float y = big ? 0.0f : y0;     // keeps the conversion below defined
        const float h = y * up + kShifter;
        const float l = y * down + kShifter;
        bad |= (h != l) | big;
        acc += (int32_t)(h - kShifter);
    }
    units = acc;
    return !bad;
}

// The same for exact weights: false on a half-integer (a tie) or a term above 2^22 units.
DS4_BUCKET_HOT bool exact_units(const float* w, int64_t m, float inv_u, int64_t& units) {
    int64_t acc = 0;
    int bad = 0;
    for (int64_t j = 0; j < m; ++j) {
        const float y0 = w[j] * inv_u;
        const bool big = !(y0 <= 0x1p22f);
        const float y = big ? 0.0f : y0;
        const float q = (y + kShifter) - kShifter;   // round to nearest (exact below 2^22)
        const float off = y - q;                      // exact
        bad |= (off == 0.5f) | (off == -0.5f) | big;
        acc += (int32_t)q;
    }
    units = acc;
    return !bad;
}

// A logit's sort key: larger logits get smaller keys; -0.0 and 0.0 are one key.
inline uint32_t order_key(float v) {
    v = v + 0.0f;
    uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    return ~((u >> 31) ? ~u : (u | 0x80000000u));
}

// The float next to a finite v > 0 (or up from 0), by its bits.
inline float step(float v, int dir) {
    uint32_t b;
    std::memcpy(&b, &v, sizeof b);
    b = (uint32_t)((int64_t)b + dir);
    std::memcpy(&v, &b, sizeof b);
    return v;
}

// out[j] = the probability (float)((double)w[j] * inv) of a token whose bucket comes before the
// stop's, else 0 (kept tokens of the stop's bucket are written after). A select, not a branch:
// at top_p .5 half the tokens pass, in no order, and a branch per token mispredicted (T 100:
// 450 -> 760 us for probabilities()).
DS4_BUCKET_HOT void scale_kept(const float* w, const uint16_t* bix, int64_t n, uint32_t stop, double inv, float* out) {
    for (int64_t j = 0; j < n; ++j) {
        const float v = (float)((double)w[j] * inv);
        out[j] = bix[j] < stop ? v : 0.0f;
    }
}

inline bool in_model(float s) { return s >= binade::kModelMin && s <= binade::kModelMax; }

}  // namespace

float bucket_top_p_min_kept() { return g_min_kept.load(std::memory_order_relaxed); }
void set_bucket_top_p_min_kept(float v) { g_min_kept.store(v, std::memory_order_relaxed); }
int64_t bucket_top_p_selections() { return g_selections.load(std::memory_order_relaxed); }
float bucket_top_p_prefix_min() { return g_prefix_min.load(std::memory_order_relaxed); }
void set_bucket_top_p_prefix_min(float v) { g_prefix_min.store(v, std::memory_order_relaxed); }
float bucket_top_p_early_max() { return g_early_max.load(std::memory_order_relaxed); }
void set_bucket_top_p_early_max(float v) { g_early_max.store(v, std::memory_order_relaxed); }
int64_t bucket_top_p_prefix_selections() { return g_prefix_selections.load(std::memory_order_relaxed); }
int64_t bucket_top_p_collections() { return g_collections.load(std::memory_order_relaxed); }
int bucket_top_p_plan() { return g_plan.load(std::memory_order_relaxed); }
void set_bucket_top_p_plan(int v) { g_plan.store(v, std::memory_order_relaxed); }

DS4_BUCKET_HOT int64_t estimate_count_at_least(const float* w, int64_t n, float c, int every) {
    int64_t k = 0;
    for (int64_t b = 0; b + 16 <= n; b += 16 * (int64_t)every)
        for (int j = 0; j < 16; ++j) k += w[b + j] >= c;
    return every * k;
}

void BucketTopP::exact_weights(const int32_t* ids, int64_t m, float* out) {
    if (in_.w_exact) {
        for (int64_t j = 0; j < m; ++j) out[j] = in_.w_exact[ids[j]];
        return;
    }
    float* v = vals_.get(m);
    float* x = x_.get(m);
    for (int64_t j = 0; j < m; ++j) v[j] = in_.a[ids[j]];
    shifted_args(v, m, in_.m, in_.t, x);
    exp_weights(x, out, m);
}

void BucketTopP::make_exact(int k) {
    const int64_t p = pos_[k];
    exact_weights(&ids_[p], count(k), &w_[p]);
    state_[k] = kExact;
}

void BucketTopP::sort_bucket(int k) {
    if (state_[k] == kSorted) return;
    const int64_t b0 = pos_[k], m = count(k);
    int32_t* ids = &ids_[b0];
    uint64_t* keys = keys_.get(m);
    for (int64_t j = 0; j < m; ++j) keys[j] = ((uint64_t)order_key(in_.a[ids[j]]) << 32) | (uint32_t)ids[j];
    std::sort(keys, keys + m);   // logit descending, equal logits by id ascending (keys are unique)
    for (int64_t j = 0; j < m; ++j) ids[j] = (int32_t)(keys[j] & 0xFFFFFFFFu);
    exact_weights(ids, m, &w_[b0]);
    state_[k] = kSorted;
}

bool BucketTopP::units(int k, int64_t m, float inv_u, int64_t& r) {
    const int64_t b0 = pos_[k];
    if (state_[k] == kApprox) {
        if (in_.rel > 0.0f && approx_units(in_.wa, &ids_[b0], m, inv_u, in_.rel, r)) return true;
        make_exact(k);
    }
    return exact_units(&w_[b0], m, inv_u, r);
}

// A stable counting sort's scatter: positions in id order inside each bucket. (Two passes, by
// the top and then the low half of the bucket's bits, each writing to fewer places at once, were
// measured slower: they move twice the bytes, and memory traffic is what this costs.)
void BucketTopP::scatter(int64_t n, int nb, int64_t n_finite) {
    const uint16_t* bix = bix_.get(n);
    uint32_t* cur = cur_.get(nb + 1);
    std::memcpy(cur, off_.get(nb + 2), sizeof(uint32_t) * (size_t)nb);
    int32_t* ids = ids_.get(n_finite + 1);
    w_.get(n_finite + 1);   // the exact weights of buckets that need them, by position
    if (const int32_t* sub = in_.sub) {   // a prefix: every candidate finite
        for (int64_t i = 0; i < n; ++i) ids[cur[bix[i]]++] = sub[i];
        return;
    }
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t b = bix[i];
        if (b == (uint32_t)nb) continue;   // not finite
        const uint32_t p = cur[b]++;
        ids[p] = (int32_t)i;
    }
}

// Bounds on the exact weight of every token in each bucket, from the bucket's logit interval
// alone (docs/sampling.md, "Eighth round"). A token of bucket k has d = fl(hi - l) with
// fl(d * scale) in [k, k + 1) (at least k for the last bucket, whose d is at most fl(hi - lo)): so
// k (1 - 2^-24) <= d * scale < k + 1 (k + 1 < 2^24 is a float, and rounding is monotone). Its
// argument x = fl(fl(l - hi) / t) = -fl(d / t) is monotone in d, so it lies between the arguments of
// the interval's float ends, exactly. exp_weights rounds a double evaluation within a few double
// ulps of exp(x) once to float, so for x >= xa its result is at least the float before
// exp_weights(xa) (the evaluation error can move a rounding by at most one float ulp), and likewise
// above. Arguments below -87 (subnormal weights, where that error bound is not documented) get the
// bounds [0, 2^-125] instead: exp(-87) < 2^-125.5.
bool BucketTopP::weight_bounds(int nb, float scale) {
    if (in_.w_exact || !(in_.m == in_.hi) || !(in_.t > 0.0f)) return false;   // given weights: no formula
    float* xa = wlo_.get(nb);
    float* xb = whi_.get(nb);
    bucket_arguments(nb, scale > 0.0f ? 1.0 / (double)scale : 0.0, in_.hi - in_.lo, in_.t, xa, xb);
    float* wb = vals_.get(2 * (int64_t)nb);
    exp_weights(xa, wb, nb);
    exp_weights(xb, wb + nb, nb);
    for (int k = 0; k < nb; ++k) {   // one float ulp out (weights are >= 0 and finite)
        const float lo_w = xa[k] >= -87.0f && wb[k] > 0.0f ? step(wb[k], -1) : 0.0f;
        const float hi_w = xb[k] >= -87.0f ? step(wb[nb + k], 1) : 0x1p-125f;
        wlo_[k] = lo_w;
        whi_[k] = hi_w;
    }
    return true;
}

// Every weight of bucket k rounds to the same n units at unit 1/inv_u, and none is a half-integer,
// when the bounds' units do (exact in double): the bucket's m tokens add or take m n units.
bool BucketTopP::certified(int k, int64_t m, float inv_u, int64_t& r) const {
    if (!bounds_) return false;
    const double ylo = (double)wlo_[k] * (double)inv_u, yhi = (double)whi_[k] * (double)inv_u;
    if (!(yhi <= 0x1p22)) return false;
    const double n = std::floor(ylo + 0.5);
    if (!(ylo + 0.5 > n && yhi + 0.5 < n + 1.0)) return false;   // (n - 0.5, n + 0.5) holds both
    r = m * (int64_t)n;
    return true;
}

// A bucket's m tokens as units of un at the running value S un: from the weight bounds when they
// certify it, else from its tokens (their ids collected first).
bool BucketTopP::units_at(int k, int64_t m, const binade::Unit& un, int64_t S, bool walk, int64_t& r) {
    if (certified(k, m, un.inv_u, r)) return true;
    need_ids(k, (float)S * un.u, walk);
    return units(k, m, un.inv_u, r);
}

// Before a bucket's tokens are read: collect its ids, and in the same pass those of the buckets
// the running value v is predicted to need next (plan).
void BucketTopP::need_ids(int k, float v, bool walk) {
    if (state_[k] != kNone) return;
    plan(k, v, walk);
    collect();
}

// Marks bucket k0 and, from the bucket bounds, every later uncollected bucket that the sum (or the
// walk, down from v0) will probably not certify: where the certificate fails, where the running
// value lies within 2^-10 of a binade's edge at the bucket's start or end, near the stop (the sum
// within 2^-10 of top_p * total, the walk within 2^-10 of 0). The prediction adds certified
// buckets' exact units and the others' midpoint weights, so it follows the real value closely; a
// bucket it misses only costs another pass (need_ids), never a different result.
void BucketTopP::plan(int k0, float v0, bool walk) {
    // want_ 2: the bucket's exact weights are taken in the collection's batch (the approximation
    // cannot round terms of more than ~2^15 units at this value); 1: approximate first.
    auto want = [&](int k, float inv_u) {
        if (state_[k] == kNone && !want_[k]) {
            want_[k] = !bounds_ || !(whi_[k] * inv_u < 0x1p15f) ? 2 : 1;
            wanted_[n_wanted_++] = k;
        }
    };
    want(k0, v0 > 0.0f ? 1.0f / v0 * 0x1p23f : INFINITY);
    const int last = walk ? stop_bucket_ : in_.buckets - 1;
    if (g_plan.load(std::memory_order_relaxed) == 1) return;
    if (!bounds_) {   // no weight estimates (given weights): every bucket still to come
        for (int k = k0 + 1; k <= last; ++k)
            if (count(k)) want(k, INFINITY);
        return;
    }
    const double goal = walk ? 0.0 : (double)in_.top_p * (double)in_.total;
    const double near = walk ? (double)v0 * 0x1p-10 : goal * 0x1p-10;
    double v = v0;
    // v's unit, refreshed only when v leaves its binade [vlo, 2 vlo) (the loop then carries v alone).
    double vlo = 0.0, u = 0.0;
    float inv_u = 0.0f;
    for (int k = k0; k <= last; ++k) {
        const int64_t c = count(k);
        if (c == 0) continue;
        bool risky = true;
        double mass = (double)c * 0.5 * ((double)wlo_[k] + (double)whi_[k]);
        if (!(v >= vlo && v < 2.0 * vlo)) {
            vlo = 0.0;
            if (v >= (double)binade::kModelMin && v <= (double)binade::kModelMax) {
                const int e = std::ilogb(v);
                vlo = std::ldexp(1.0, e);
                u = std::ldexp(1.0, e - 23);
                inv_u = (float)std::ldexp(1.0, 23 - e);
            }
        }
        if (vlo > 0.0) {
            int64_t r;
            const bool cert = certified(k, c, inv_u, r);
            if (cert) mass = (double)r * u;
            const double end = walk ? v - mass : v + mass;
            // within 2^-10 of the binade's edges at the start or the end: the real unit may differ
            risky = !cert || v < vlo * (1.0 + 0x1p-10) || v > 2.0 * vlo * (1.0 - 0x1p-10) ||
                    end < vlo * (1.0 + 0x1p-10) || end > 2.0 * vlo * (1.0 - 0x1p-10);
        }
        v = walk ? v - mass : v + mass;
        if (walk ? v <= near : v >= goal - near) risky = true;
        if (risky) want(k, vlo > 0.0 ? inv_u : INFINITY);
        if (walk ? v < -near : v > goal + near) break;   // past the pick or the stop, with a margin
    }
}

// Whether a collected prefix clearly holds less than top_p of the total, from its bucket counts
// (off[k + 1], not yet summed) and each bucket's largest weight: then no stop lies inside, and
// the partition's passes are skipped (the caller's fallback decides, so this is a guess with a
// 2 % margin, not a proof: a wrong answer only costs time). A bucket of the prefix's logit range
// starts about k (hi - lo) / nb below hi (either bucket index), its weights at most
// exp(-k (hi - lo) / (nb t)).
bool BucketTopP::prefix_too_light(const uint32_t* off, int nb) const {
    // (four interleaved chains of multiplies and adds: one chain waited a multiply per bucket)
    const double q = std::exp(-((double)in_.hi - (double)in_.lo) / ((double)nb * (double)in_.t));
    const double q4 = q * q * q * q;
    double w[4] = {1.0, q, q * q, q * q * q}, mass[4] = {0.0, 0.0, 0.0, 0.0};
    int k = 0;
    for (; k + 4 <= nb; k += 4)
        for (int j = 0; j < 4; ++j) {
            mass[j] += (double)off[k + j + 1] * w[j];
            w[j] *= q4;
        }
    for (int j = 0; k < nb; ++k, ++j) mass[0] += (double)off[k + 1] * w[j];
    return (mass[0] + mass[1] + mass[2] + mass[3]) * 1.02 < (double)in_.top_p * (double)in_.total;
}

// The smallest S in [2^23, 2^24) whose sum S u has fl(S u / total) >= top_p (2^24: none). The
// ratio never decreases with S, so a bucket whose end S + R stays below it holds no stop.
int64_t BucketTopP::stop_units(float u) const {
    const int64_t lo = 1 << 23, hi = 1 << 24;
    auto stops = [&](int64_t S) { return ((float)S * u) / in_.total >= in_.top_p; };
    const double est = (double)in_.top_p * (double)in_.total / (double)u;
    if (est > (double)hi + 8.0) return hi;   // (S u / total <= top_p (1 - 2^-22): rounding stays below)
    int64_t S = est < (double)lo ? lo : est >= (double)hi ? hi - 1 : (int64_t)est;
    while (S > lo && stops(S - 1)) --S;   // (a few steps: the estimate is off by rounding only)
    while (S < hi && !stops(S)) ++S;
    return S;
}

// One pass over the bucket indices: the ids of every wanted bucket into ids_, the buckets one after
// another from next_ (those that want exact weights first, which are then taken in one batch).
void BucketTopP::collect() {
    const int nb = in_.buckets;
    uint32_t* cur = cur_.get(nb + 1);
    const int64_t first = next_;
    for (int pass = 2; pass >= 1; --pass) {
        for (int j = 0; j < n_wanted_; ++j) {
            const int k = wanted_[j];
            if (want_[k] != pass) continue;
            cur[k] = pos_[k] = (uint32_t)next_;
            next_ += count(k);
        }
        if (pass == 2) exact_end_ = next_;
    }
    bucket_collect(bix_.get(in_.n), in_.n, want_.get(nb + 1), nb, cur, ids_.get(1), hits_.get(in_.n + 64));
    // One call for the batch's exact weights costs less than one per bucket.
    exact_weights(&ids_[first], exact_end_ - first, &w_[first]);
    for (int j = 0; j < n_wanted_; ++j) {
        state_[wanted_[j]] = want_[wanted_[j]] == 2 ? kExact : kApprox;
        want_[wanted_[j]] = 0;
    }
    n_wanted_ = 0;
    g_collections.fetch_add(1, std::memory_order_relaxed);
}

bool BucketTopP::select(const BucketTopPInput& in) {
    in_ = in;
    const int nb = in.buckets;
    const float range = in.hi - in.lo;
    if (nb < 1 || nb > 65535 || !(range >= 0.0f && range <= FLT_MAX) || !(in.total > 0.0f)) return false;
    float scale = range > 0.0f ? (float)nb / range : 0.0f;
    if (!(scale <= FLT_MAX)) scale = FLT_MAX;   // still monotone; the clamp keeps indices in range

    uint16_t* bix = bix_.get(in.n);
    if (in.packed) {
        if (in.fine_bits < 1 || in.fine_bits > 16 || in.id_bits < 1 || in.id_bits + in.fine_bits > 32) return false;
        in_.sub = sub_.get(in.n);
        unpack_prefix(in.packed, in.n, in.id_bits, in.fine_bits, (uint32_t)nb, sub_.get(in.n), bix);
    } else if (in.sub) {
        bucket_index_sub(in.a, in.sub, in.n, in.hi, scale, (float)(nb - 1), bix);
    } else {
        bucket_index(in.a, in.n, in.hi, scale, (float)(nb - 1), (float)nb, in.all_finite, bix);
    }
    // A counting sort into buckets: bucket k's segment is [off_[k], off_[k + 1]).
    uint32_t* off = off_.get(nb + 2);
    count_buckets(bix, in.n, nb, off, cur_.get(nb + 2));
    if (in_.sub && !in_.w_exact && in_.m == in_.hi && prefix_too_light(off, nb)) return false;
    for (int k = 0; k < nb; ++k) off[k + 1] += off[k];
    const int64_t n_finite = off[nb];
    lazy_ = in_.sub == nullptr;
    if (lazy_) {
        // The whole vocabulary: ids only for the buckets that need them (collect), the rest
        // certified from their weight bounds.
        ids_.get(n_finite + 1);
        w_.get(n_finite + 1);
        std::memset(state_.get(nb), kNone, (size_t)nb);
        std::memset(want_.get(nb + 1), 0, (size_t)nb + 1);
        wanted_.get(nb);
        n_wanted_ = 0;
        next_ = 0;
        pos_.get(nb + 1);
        bounds_ = weight_bounds(nb, scale);
    } else {
        scatter(in.n, nb, n_finite);
        std::memcpy(pos_.get(nb + 1), off_.get(nb + 1), sizeof(uint32_t) * (size_t)(nb + 1));
        std::memset(state_.get(nb), kApprox, (size_t)nb);
        bounds_ = false;
    }

    // The top-p sum in sorted order, bucket by bucket. While the sum stays in one binade it is
    // carried as its unit count S (the loop's only dependency: an integer add), up to lim: the
    // binade's top or the stop's count, whichever is lower.
    float s = 0.0f;
    bool fast = false;
    binade::Unit un{};
    int64_t S = 0, lim = 0;
    for (int k = 0; k < nb; ++k) {
        const int64_t c = count(k);
        if (c == 0) continue;
        if (!fast && in_model(s)) {
            un = binade::unit_of(s);
            S = (int64_t)(s * un.inv_u);
            lim = stop_units(un.u);
            fast = true;
        }
        if (fast) {
            int64_t R;
            const bool ok = units_at(k, c, un, S, false, R);
            if (ok && S + R < lim) {
                S += R;
                continue;
            }
            s = (float)S * un.u;   // (exact: S < 2^24)
            fast = false;
        }
        need_ids(k, s, false);
        sort_bucket(k);
        const int64_t hit = binade::seq_until_plain(&w_[pos_[k]], c, in.total, in.top_p, s);
        if (hit < c) {
            stop_bucket_ = k;
            kept_stop_ = hit + 1;
            kept_ = off_[k] + hit + 1;
            sum_ = s;
            (lazy_ ? g_selections : g_prefix_selections).fetch_add(1, std::memory_order_relaxed);
            return true;
        }
    }
    return false;   // rounding kept the sum below top_p: every finite token is kept (the sorted path)
}

int64_t BucketTopP::walk(float r) {
    // As the sum: r carried as its unit count S while it stays at least 2^23 + 1 units.
    bool fast = false;
    binade::Unit un{};
    int64_t S = 0;
    for (int k = 0; k <= stop_bucket_; ++k) {
        const int64_t m = k == stop_bucket_ ? kept_stop_ : count(k);
        if (m == 0) continue;
        if (!fast && in_model(r)) {
            un = binade::unit_of(r);
            S = (int64_t)(r * un.inv_u);
            fast = true;
        }
        if (fast) {
            int64_t R;
            const bool ok = units_at(k, m, un, S, true, R);
            if (ok && S - R >= (1 << 23) + 1) {
                S -= R;
                continue;
            }
            r = (float)S * un.u;
            fast = false;
        }
        need_ids(k, r, true);
        sort_bucket(k);   // (the stop bucket is sorted already: its prefix is the kept part)
        const int64_t p = pos_[k];
        const int64_t hit = binade::seq_walk_plain(&w_[p], m, r);
        if (hit >= 0) return ids_[p + hit];
    }
    return -1;
}

void BucketTopP::probabilities(double inv, float* probs) {
    constexpr int64_t kPiece = 2048;
    alignas(64) float wb[kPiece];
    if (lazy_) {
        // Every token of a bucket before the stop's is kept: the vocabulary in id order, in
        // pieces, weighing every finite token and writing every entry (0 past the stop's bucket);
        // then the stop bucket's sorted prefix, whose exact weights are in w_.
        alignas(64) float xb[kPiece];
        const uint16_t* bix = bix_.get(in_.n);
        const uint32_t stop = (uint32_t)stop_bucket_;
        for (int64_t p = 0; p < in_.n; p += kPiece) {
            const int64_t len = std::min(kPiece, in_.n - p);
            shifted_args(in_.a + p, len, in_.m, in_.t, xb);
            exp_weights(xb, wb, len);
            scale_kept(wb, bix + p, len, stop, inv, probs + p);
        }
        const int64_t p0 = pos_[stop_bucket_];
        for (int64_t j = p0; j < p0 + kept_stop_; ++j) probs[ids_[j]] = (float)((double)w_[j] * inv);
        return;
    }
    for (int64_t p = 0; p < kept_; p += kPiece) {
        const int64_t len = std::min(kPiece, kept_ - p);
        exact_weights(&ids_[p], len, wb);
        for (int64_t j = 0; j < len; ++j) probs[ids_[p + j]] = (float)((double)wb[j] * inv);
    }
}

void BucketTopP::kept_ids(int32_t* out) const {
    if (!lazy_) {
        std::memcpy(out, ids_.p.get(), sizeof(int32_t) * (size_t)kept_);
        return;
    }
    int64_t k = 0;
    const uint16_t* bix = bix_.p.get();
    for (int64_t i = 0; i < in_.n; ++i)
        if (bix[i] < (uint32_t)stop_bucket_) out[k++] = (int32_t)i;
    const int64_t p0 = pos_[stop_bucket_];
    for (int64_t j = p0; j < p0 + kept_stop_; ++j) out[k++] = ids_[j];
}

int64_t BucketTopP::sorted_tokens() const {
    int64_t c = 0;
    for (int k = 0; k <= stop_bucket_; ++k) {
        if (state_[k] != kSorted) continue;
        c += k == stop_bucket_ ? kept_stop_ : count(k);
    }
    return c;
}

}  // namespace ds4
