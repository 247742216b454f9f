#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "sampling/exp_weights.h"
#include "sampling/rng.h"

namespace ds4 {

namespace {

constexpr int64_t kTopKMax = 1024;

// The whole-vocabulary loops get an AVX-512 clone, picked at load time where the CPU has it; the
// arithmetic is the same IEEE float32 in either clone, so the picks do not depend on the CPU.
#if defined(DS4_ARCH_X86) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define DS4_SAMPLING_HOT __attribute__((target_clones("arch=x86-64-v4", "default"), noinline))
#else
#define DS4_SAMPLING_HOT
#endif
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline bool finite(float v) { return v - v == 0.0f; }   // false for NaN and +-inf

// Float bits mapped to an integer order: larger logits get smaller keys (a descending sort is an
// ascending sort of keys). -0.0 and 0.0 are equal logits, so they get one key.
inline uint32_t desc_key(float v) {
    v = v + 0.0f;
    uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    const uint32_t asc = (u >> 31) ? ~u : (u | 0x80000000u);
    return ~asc;
}

// Sorts ids (given in ascending id order) by logit descending; equal logits keep id order (LSD
// radix on the 32-bit key is stable).
void sort_desc(const float* a, std::vector<int32_t>& ids, std::vector<uint64_t>& keys, std::vector<uint64_t>& tmp) {
    const size_t m = ids.size();
    if (m < 2) return;
    if (m < 96) {
        std::stable_sort(ids.begin(), ids.end(), [a](int32_t x, int32_t y) { return desc_key(a[x]) < desc_key(a[y]); });
        return;
    }
    keys.resize(m);
    tmp.resize(m);
    for (size_t i = 0; i < m; ++i) keys[i] = ((uint64_t)desc_key(a[ids[i]]) << 32) | (uint32_t)ids[i];
    size_t count[256];
    for (int shift = 32; shift < 64; shift += 8) {
        std::fill(count, count + 256, 0);
        for (size_t i = 0; i < m; ++i) ++count[(keys[i] >> shift) & 0xFF];
        if (count[(keys[0] >> shift) & 0xFF] == m) continue;   // one digit value: the pass is a no-op
        size_t off = 0;
        for (size_t& c : count) { const size_t k = c; c = off; off += k; }
        for (size_t i = 0; i < m; ++i) tmp[count[(keys[i] >> shift) & 0xFF]++] = keys[i];
        keys.swap(tmp);
    }
    for (size_t i = 0; i < m; ++i) ids[i] = (int32_t)(keys[i] & 0xFFFFFFFFu);
}

// Sequential float32 sum, in order (upstream's `sum += p` loops).
inline float seq_sum(const float* w, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) s += w[i];
    return s;
}

// Weights in (0, 1] bucketed by their top 12 bits (exponent and 3 mantissa bits): bucket b holds
// weights in [edge(b), edge(b + 1)). Four interleaved copies keep increments of one bucket apart.
constexpr int kBuckets = 1024;

inline float bucket_edge(int b) {
    const uint32_t bits = (uint32_t)b << 20;
    float v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
}

// The sequential float32 sum (as seq_sum) while counting weights per bucket; the counting rides
// in the slots the sum's dependency chain leaves idle.
float seq_sum_counting(const float* w, int64_t n, uint32_t* counts /* 4 * kBuckets */) {
    std::fill(counts, counts + 4 * kBuckets, 0u);
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &w[i], sizeof bits);
        ++counts[(i & 3) * kBuckets + std::min<uint32_t>(bits >> 20, kBuckets - 1)];
        s += w[i];
    }
    return s;
}

// The largest bucket edge c such that the weights >= c certainly hold `mass` (counted at their
// buckets' lower edges, an underestimate); 0 when no edge does.
float mass_floor(const uint32_t* counts, double mass) {
    double acc = 0.0;
    for (int b = kBuckets - 1; b >= 0; --b) {
        const uint64_t c = (uint64_t)counts[b] + counts[kBuckets + b] + counts[2 * kBuckets + b] + counts[3 * kBuckets + b];
        acc += (double)c * (double)bucket_edge(b);
        if (acc >= mass) return bucket_edge(b);
    }
    return 0.0f;
}

// A logit below which no token can pass expf(fl(fl(l - max) / t)) >= min_p (a superset test; the
// exact test runs on the survivors). RN(exp(x)) >= m implies x >= log(m) - 2^-22; the division and
// subtraction err by 2^-24 each, so a 2^-16 relative margin and rounding down cover them.
float logit_floor(float max_logit, float t, float min_p) {
    const double big_l = -std::log(std::min((double)min_p, 1.0)) + std::ldexp(1.0, -22);
    const double floor = (double)max_logit - (double)t * (big_l * (1 + std::ldexp(1.0, -16)) + std::ldexp(1.0, -60));
    if (!(floor > -3.0e38)) return kNegInf;
    return std::nextafter((float)floor, kNegInf);
}

}  // namespace

// Blocks of kBlock logits are screened with a vectorisable reduction; only blocks that can hold
// an answer are scanned element by element.
constexpr int64_t kBlock = 64;

namespace {

// 16 float lanes (GCC/Clang vector extension; lowered to whatever the clone's ISA has).
typedef float F16 __attribute__((vector_size(64)));

inline F16 load16(const float* p) {
    F16 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

inline float lanes_max(F16 acc, float init) {
    float r = init;
    for (int j = 0; j < 16; ++j) r = acc[j] > r ? acc[j] : r;
    return r;
}

// Largest value of a[0..m) by `v > acc` (NaN never wins).
DS4_SAMPLING_HOT float block_max(const float* a, int64_t m, float init) {
    F16 acc = init - (F16){};
    int64_t i = 0;
    for (; i + 16 <= m; i += 16) {
        const F16 v = load16(a + i);
        acc = v > acc ? v : acc;
    }
    float r = lanes_max(acc, init);
    for (; i < m; ++i) r = a[i] > r ? a[i] : r;
    return r;
}

// Largest finite value of a[0..n) (-inf when none is finite).
DS4_SAMPLING_HOT float finite_max(const float* a, int64_t n) {
    const F16 neg = kNegInf - (F16){};
    F16 acc = neg;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const F16 v = load16(a + i);
        const F16 fv = (v - v == 0.0f) ? v : neg;   // NaN and +-inf fail v - v == 0
        acc = fv > acc ? fv : acc;
    }
    float r = lanes_max(acc, kNegInf);
    for (; i < n; ++i) {
        const float fv = finite(a[i]) ? a[i] : kNegInf;
        r = fv > r ? fv : r;
    }
    return r;
}

// First i with a[i] == v (n when none).
DS4_SAMPLING_HOT int64_t first_equal(const float* a, int64_t n, float v) {
    for (int64_t b = 0; b < n; b += kBlock) {
        const int64_t m = std::min(kBlock, n - b);
        int any = 0;
        for (int64_t j = 0; j < m; ++j) any |= a[b + j] == v;
        if (!any) continue;
        for (int64_t j = 0; j < m; ++j) if (a[b + j] == v) return b + j;
    }
    return n;
}

DS4_SAMPLING_HOT int32_t count_finite(const float* a, int64_t n) {
    int32_t c = 0;
    for (int64_t i = 0; i < n; ++i) c += finite(a[i]) ? 1 : 0;
    return c;
}

// x[i] = fl(fl(a[i] - m) / t), -inf for non-finite a[i] (dividing by 1 is exact: skipped).
DS4_SAMPLING_HOT void shifted_args(const float* a, int64_t n, float m, float t, float* x) {
    if (t == 1.0f) {
        for (int64_t i = 0; i < n; ++i) x[i] = finite(a[i]) ? a[i] - m : kNegInf;
    } else {
        for (int64_t i = 0; i < n; ++i) x[i] = finite(a[i]) ? (a[i] - m) / t : kNegInf;
    }
}

// The ids i with key[i] >= floor and a[i] finite, in id order (key: the logits themselves or
// their weights).
void collect_at_least(const float* key, const float* a, int64_t n, float floor, std::vector<int32_t>& out) {
    out.clear();
    for (int64_t b = 0; b < n; b += kBlock) {
        const int64_t m = std::min(kBlock, n - b);
        if (!(block_max(key + b, m, kNegInf) >= floor)) continue;
        for (int64_t i = b; i < b + m; ++i) if (key[i] >= floor && finite(a[i])) out.push_back((int32_t)i);
    }
}

}  // namespace

int32_t argmax_logits(const float* a, int64_t n) {
    // The first block reaching the overall maximum holds the first index of it (later blocks
    // must be strictly greater to take over, as upstream's scalar loop).
    float best = -1.0e30f;
    int64_t best_block = -1;
    for (int64_t b = 0; b < n; b += kBlock) {
        const float bm = block_max(a + b, std::min(kBlock, n - b), -1.0e30f);
        if (bm > best) {
            best = bm;
            best_block = b;
        }
    }
    if (best_block < 0) return 0;
    for (int64_t i = best_block;; ++i) if (a[i] == best) return (int32_t)i;
}

void Sampler::top_sorted(const float* a, int64_t n, int64_t m) {
    // A running threshold: tokens below the m-th best seen so far cannot be among the m best,
    // so most of the vocabulary costs one comparison. Ties at the threshold are kept (the final
    // sort orders them by id).
    ids_.clear();
    float thr = kNegInf;
    size_t cap = (size_t)std::max<int64_t>(2 * m, m + 512);
    for (int64_t i = 0; i < n; ++i) {
        if ((i & (kBlock - 1)) == 0 && !(block_max(a + i, std::min(kBlock, n - i), kNegInf) >= thr)) {
            i += kBlock - 1;   // nothing in this block reaches the threshold
            continue;
        }
        const float v = a[i];
        if (!(v >= thr) || !finite(v)) continue;
        ids_.push_back((int32_t)i);
        if (ids_.size() >= cap) {
            vals_.resize(ids_.size());
            for (size_t j = 0; j < ids_.size(); ++j) vals_[j] = a[ids_[j]];
            std::nth_element(vals_.begin(), vals_.begin() + (m - 1), vals_.end(), std::greater<float>());
            thr = vals_[m - 1];
            size_t k = 0;
            for (size_t j = 0; j < ids_.size(); ++j) if (a[ids_[j]] >= thr) ids_[k++] = ids_[j];
            ids_.resize(k);
            if (ids_.size() * 2 > cap) cap *= 2;   // many ties at the threshold
        }
    }
    sort_desc(a, ids_, keys_, tmp_keys_);
    if ((int64_t)ids_.size() > m) ids_.resize((size_t)m);
}

bool Sampler::filter_sorted(float total, float top_p, float min_p, bool list_is_everything) {
    const int64_t m = (int64_t)ids_.size();
    w_.resize((size_t)m);
    for (int64_t i = 0; i < m; ++i) w_[i] = wall_[ids_[i]];
    const float min_prob = (w_[0] / total) * min_p;
    float fsum = 0.0f;
    for (int64_t i = 0; i < m; ++i) {
        if (i > 0 && w_[i] / total < min_prob) {
            c_.count = i;
            c_.sum = fsum;
            return true;
        }
        fsum += w_[i];
        if (fsum / total >= top_p) {
            c_.count = i + 1;
            c_.sum = fsum;
            return true;
        }
    }
    c_.count = m;
    c_.sum = fsum;
    return list_is_everything;
}

void Sampler::select_full(const float* a, int64_t n, float t, float top_p, float min_p) {
    const float m = finite_max(a, n);
    if (m == kNegInf) {   // no finite logit
        c_.no_draw = argmax_logits(a, n);
        return;
    }
    const int64_t best = first_equal(a, n, m);   // first index of the largest finite logit
    c_.no_draw = c_.after_walk = (int32_t)best;

    if (top_p >= 1.0f && min_p > 0.0f) {
        // Only tokens with weight >= min_p are kept, in id order: a logit floor finds a superset.
        const float floor = logit_floor(m, t, min_p);
        collect_at_least(a, a, n, floor, ids_);
        x_.resize(ids_.size());
        w_.resize(ids_.size());
        for (size_t j = 0; j < ids_.size(); ++j) x_[j] = (a[ids_[j]] - m) / t;
        exp_weights(x_.data(), w_.data(), (int64_t)x_.size());
        size_t k = 0;
        for (size_t j = 0; j < ids_.size(); ++j) {
            if (!(w_[j] < min_p)) {
                ids_[k] = ids_[j];
                w_[k++] = w_[j];
            }
        }
        const float total = seq_sum(w_.data(), (int64_t)k);
        if (!(total > 0.0f && std::isfinite(total))) return;
        c_ = Candidates{true, c_.no_draw, c_.after_walk, ids_.data(), w_.data(), (int64_t)k, total};
        return;
    }

    // Every finite token's weight (non-finite logits weigh 0: they add nothing to sums or walks).
    x_.resize((size_t)n);
    wall_.resize((size_t)n);
    shifted_args(a, n, m, t, x_.data());
    exp_weights(x_.data(), wall_.data(), n);
    const bool need_mass_floor = top_p < 1.0f && min_p == 0.0f;
    if (need_mass_floor) counts_.resize(4 * kBuckets);
    const float total = need_mass_floor ? seq_sum_counting(wall_.data(), n, counts_.data()) : seq_sum(wall_.data(), n);
    if (!(total > 0.0f && std::isfinite(total))) return;

    if (top_p >= 1.0f) {   // min_p 0: every token kept, in id order
        c_ = Candidates{true, c_.no_draw, c_.after_walk, nullptr, wall_.data(), n, total};
        return;
    }

    // Sorted branch: a sorted prefix that the filters stop inside decides; grow it until one does.
    const int32_t n_finite = count_finite(a, n);
    bool done = false;
    if (min_p > 0.0f) {
        // p/total >= fl(1/total)*min_p needs p >= min_p up to a few ulps: a 0.1% margin is a superset.
        const float c = std::min(min_p, 1.0f) * 0.999f;
        collect_at_least(wall_.data(), a, n, c, ids_);
        sort_desc(a, ids_, keys_, tmp_keys_);
        done = filter_sorted(total, top_p, min_p, (int64_t)ids_.size() == n_finite);
        if (!done) {
            // The next token weighs < c; it fails min-p if even the largest float below c does.
            const float min_prob = (1.0f / total) * min_p;
            done = min_prob >= std::numeric_limits<float>::min() && std::nextafter(c, 0.0f) / total < min_prob;
        }
    }
    if (!done && need_mass_floor) {
        // The top-p walk stops once the kept weights reach top_p of the total: the tokens whose
        // weights certainly hold a little more than that are a sorted prefix that contains the stop
        // (the 0.2% margin covers the float32 running sum's rounding; if not, the fallback below).
        const float c = mass_floor(counts_.data(), (double)top_p * (double)total * 1.002);
        if (c > 0.0f) {
            collect_at_least(wall_.data(), a, n, c, ids_);
            sort_desc(a, ids_, keys_, tmp_keys_);
            done = filter_sorted(total, top_p, min_p, (int64_t)ids_.size() == n_finite);
        }
    }
    for (int64_t pool = 256; !done; pool *= 8) {
        if (pool >= n_finite) {
            top_sorted(a, n, n_finite);
            filter_sorted(total, top_p, min_p, true);
            break;
        }
        top_sorted(a, n, pool);
        done = filter_sorted(total, top_p, min_p, false);
    }
    c_ = Candidates{true, c_.no_draw, ids_[c_.count - 1], ids_.data(), w_.data(), c_.count, c_.sum};
}

void Sampler::select_top_k(const float* a, int64_t n, float t, int64_t k, float top_p, float min_p) {
    top_sorted(a, n, k);
    if (ids_.empty()) {
        c_.no_draw = argmax_logits(a, n);
        return;
    }
    const int64_t m = (int64_t)ids_.size();
    const float v0 = a[ids_[0]];
    x_.resize((size_t)m);
    w_.resize((size_t)m);
    for (int64_t i = 0; i < m; ++i) x_[i] = (a[ids_[i]] - v0) / t;
    exp_weights(x_.data(), w_.data(), m);
    c_.no_draw = ids_[0];
    const float total = seq_sum(w_.data(), m);
    if (!(total > 0.0f && std::isfinite(total))) return;
    wall_.resize((size_t)n);   // filter_sorted reads weights by token id
    for (int64_t i = 0; i < m; ++i) wall_[ids_[i]] = w_[i];
    filter_sorted(total, top_p, min_p, true);
    c_ = Candidates{true, c_.no_draw, ids_[c_.count - 1], ids_.data(), w_.data(), c_.count, c_.sum};
}

const Candidates& Sampler::select(const float* a, int64_t n, const SamplerParams& p) {
    c_ = Candidates{};
    const float t = p.temperature;
    if (!(t > 0.0f) || n <= 0) {   // NaN too: upstream's `<= 0` test would pass it on to exp
        c_.no_draw = n > 0 ? argmax_logits(a, n) : 0;
        return c_;
    }
    const float top_p = (p.top_p > 0.0f && p.top_p <= 1.0f) ? p.top_p : 1.0f;
    const float min_p = p.min_p < 0.0f ? 0.0f : p.min_p;
    if (p.top_k <= 0) {
        select_full(a, n, t, top_p, min_p);
    } else {
        select_top_k(a, n, t, std::min<int64_t>({(int64_t)p.top_k, kTopKMax, n}), top_p, min_p);
    }
    return c_;
}

int32_t Sampler::sample(const float* a, int64_t n, const SamplerParams& p, uint64_t& rng_state) {
    const Candidates& c = select(a, n, p);
    if (!c.draw) return c.no_draw;
    float r = rng_uniform(rng_state) * c.sum;
    for (int64_t i = 0; i < c.count; ++i) {
        r -= c.w[i];
        if (r <= 0.0f) return c.id(i);
    }
    return c.after_walk;
}

void Sampler::probabilities(const float* a, int64_t n, const SamplerParams& p, float* probs) {
    const Candidates& c = select(a, n, p);
    std::fill(probs, probs + n, 0.0f);
    if (!c.draw) {
        probs[c.no_draw] = 1.0f;
        return;
    }
    const double inv = 1.0 / (double)c.sum;
    for (int64_t i = 0; i < c.count; ++i) probs[c.id(i)] = (float)((double)c.w[i] * inv);
}

}  // namespace ds4
