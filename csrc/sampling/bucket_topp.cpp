#include "sampling/bucket_topp.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cstring>

#include "sampling/binade_sum_impl.h"
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

inline bool in_model(float s) { return s >= binade::kModelMin && s <= binade::kModelMax; }

}  // namespace

float bucket_top_p_min_kept() { return g_min_kept.load(std::memory_order_relaxed); }
void set_bucket_top_p_min_kept(float v) { g_min_kept.store(v, std::memory_order_relaxed); }
int64_t bucket_top_p_selections() { return g_selections.load(std::memory_order_relaxed); }
float bucket_top_p_prefix_min() { return g_prefix_min.load(std::memory_order_relaxed); }
void set_bucket_top_p_prefix_min(float v) { g_prefix_min.store(v, std::memory_order_relaxed); }
int64_t bucket_top_p_prefix_selections() { return g_prefix_selections.load(std::memory_order_relaxed); }

DS4_BUCKET_HOT int64_t estimate_count_at_least(const float* w, int64_t n, float c) {
    int64_t k = 0;
    for (int64_t b = 0; b + 16 <= n; b += 64)
        for (int j = 0; j < 16; ++j) k += w[b + j] >= c;
    return 4 * k;
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
    const int64_t b0 = off_[k];
    exact_weights(&ids_[b0], (int64_t)off_[k + 1] - b0, &w_[b0]);
    state_[k] = kExact;
}

void BucketTopP::sort_bucket(int k) {
    if (state_[k] == kSorted) return;
    const int64_t b0 = off_[k], m = (int64_t)off_[k + 1] - b0;
    int32_t* ids = &ids_[b0];
    uint64_t* keys = keys_.get(m);
    for (int64_t j = 0; j < m; ++j) keys[j] = ((uint64_t)order_key(in_.a[ids[j]]) << 32) | (uint32_t)ids[j];
    std::sort(keys, keys + m);   // logit descending, equal logits by id ascending (keys are unique)
    for (int64_t j = 0; j < m; ++j) ids[j] = (int32_t)(keys[j] & 0xFFFFFFFFu);
    exact_weights(ids, m, &w_[b0]);
    state_[k] = kSorted;
}

bool BucketTopP::units(int k, int64_t end, float inv_u, int64_t& r) {
    const int64_t b0 = off_[k];
    if (state_[k] == kApprox) {
        if (in_.rel > 0.0f && approx_units(in_.wa, &ids_[b0], end - b0, inv_u, in_.rel, r)) return true;
        make_exact(k);
    }
    return exact_units(&w_[b0], end - b0, inv_u, r);
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

bool BucketTopP::select(const BucketTopPInput& in) {
    in_ = in;
    const int nb = in.buckets;
    const float range = in.hi - in.lo;
    if (nb < 1 || nb > 65535 || !(range >= 0.0f && range <= FLT_MAX) || !(in.total > 0.0f)) return false;
    float scale = range > 0.0f ? (float)nb / range : 0.0f;
    if (!(scale <= FLT_MAX)) scale = FLT_MAX;   // still monotone; the clamp keeps indices in range

    uint16_t* bix = bix_.get(in.n);
    if (in.sub) {
        bucket_index(in.sub_vals, in.n, in.hi, scale, (float)(nb - 1), (float)nb, true, bix);
    } else {
        bucket_index(in.a, in.n, in.hi, scale, (float)(nb - 1), (float)nb, in.all_finite, bix);
    }
    // A stable counting sort into buckets: positions in id order inside each bucket.
    uint32_t* off = off_.get(nb + 2);
    std::memset(off, 0, sizeof(uint32_t) * (size_t)(nb + 2));
    for (int64_t i = 0; i < in.n; ++i) ++off[bix[i] + 1];   // (bucket nb: not finite, last)
    for (int k = 0; k < nb; ++k) off[k + 1] += off[k];
    const int64_t n_finite = off[nb];
    scatter(in.n, nb, n_finite);
    std::memset(state_.get(nb), kApprox, (size_t)nb);

    // The top-p sum in sorted order, bucket by bucket.
    float s = 0.0f;
    for (int k = 0; k < nb; ++k) {
        const int64_t b0 = off_[k], b1 = off_[k + 1];
        if (b0 == b1) continue;
        if (in_model(s)) {
            const binade::Unit un = binade::unit_of(s);
            const int64_t S = (int64_t)(s * un.inv_u);
            int64_t R;
            if (units(k, b1, un.inv_u, R) && S + R < (1 << 24)) {
                const float end = (float)(S + R) * un.u;
                // fl(s / total) never decreases along the bucket: below top_p at its end, no stop in it
                if (end / in.total < in.top_p) {
                    s = end;
                    continue;
                }
            }
        }
        sort_bucket(k);
        const int64_t hit = binade::seq_until_plain(&w_[b0], b1 - b0, in.total, in.top_p, s);
        if (hit < b1 - b0) {
            stop_bucket_ = k;
            kept_ = b0 + hit + 1;
            sum_ = s;
            (in.sub ? g_prefix_selections : g_selections).fetch_add(1, std::memory_order_relaxed);
            return true;
        }
    }
    return false;   // rounding kept the sum below top_p: every finite token is kept (the sorted path)
}

int64_t BucketTopP::walk(float r) {
    for (int k = 0; k <= stop_bucket_; ++k) {
        const int64_t b0 = off_[k], b1 = k == stop_bucket_ ? kept_ : (int64_t)off_[k + 1];
        if (b0 == b1) continue;
        if (in_model(r)) {
            const binade::Unit un = binade::unit_of(r);
            const int64_t S = (int64_t)(r * un.inv_u);
            int64_t R;
            if (units(k, b1, un.inv_u, R) && S - R >= (1 << 23) + 1) {
                r = (float)(S - R) * un.u;
                continue;
            }
        }
        sort_bucket(k);   // (the stop bucket is sorted already: its prefix is the kept part)
        const int64_t hit = binade::seq_walk_plain(&w_[b0], b1 - b0, r);
        if (hit >= 0) return ids_[b0 + hit];
    }
    return -1;
}

void BucketTopP::probabilities(double inv, float* probs) {
    constexpr int64_t kPiece = 2048;
    float wb[kPiece];
    for (int64_t p = 0; p < kept_; p += kPiece) {
        const int64_t len = std::min(kPiece, kept_ - p);
        exact_weights(&ids_[p], len, wb);
        for (int64_t j = 0; j < len; ++j) probs[ids_[p + j]] = (float)((double)wb[j] * inv);
    }
}

int64_t BucketTopP::sorted_tokens() const {
    int64_t c = 0;
    for (int k = 0; k <= stop_bucket_; ++k) {
        if (state_[k] != kSorted) continue;
        c += std::min<int64_t>(off_[k + 1], kept_) - off_[k];
    }
    return c;
}

}  // namespace ds4
