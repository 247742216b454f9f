#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/thread_pool.h"
#include "sampling/binade_sum.h"
#include "sampling/bucket_collect.h"
#include "sampling/exp_weights.h"
#include "sampling/rng.h"
#include "sampling/scale_weights.h"
#include "sampling/sampling_pool.h"
#include "sampling/scan.h"

namespace ds4 {

namespace {

constexpr int64_t kTopKMax = 1024;
// A top-p prefix of at least bucket_top_p_prefix_min() tokens goes through the bucket partition
// (shorter ones are radix-sorted), about this many tokens to a bucket (docs/sampling.md, "Sixth round").
constexpr int64_t kPrefixTokensPerBucket = 16;
// Vocabularies from this size on collect a likely top-p prefix right after the max pass (min_p 0).
constexpr int64_t kEarlyPrefixMinVocab = 16384;

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

// The smallest and largest desc_key of v[0..m) (a vectorisable integer reduction).
DS4_SAMPLING_HOT void key_range(const float* v, int64_t m, uint32_t& lo_out, uint32_t& hi_out) {
    uint32_t lo = UINT32_MAX, hi = 0;
    for (int64_t i = 0; i < m; ++i) {
        const uint32_t k = desc_key(v[i]);
        lo = k < lo ? k : lo;
        hi = k > hi ? k : hi;
    }
    lo_out = lo;
    hi_out = hi;
}

// Whether x[0..m) all equal v.
DS4_SAMPLING_HOT bool all_equal(const float* x, int64_t m, float v) {
    int differ = 0;
    for (int64_t i = 0; i < m; ++i) differ |= x[i] != v;
    return !differ;
}

inline float key_value(uint32_t key) {   // the logit of a desc_key (0.0 for the -0.0/0.0 key)
    const uint32_t asc = ~key;
    const uint32_t u = (asc >> 31) ? (asc & 0x7FFFFFFFu) : ~asc;
    float v;
    std::memcpy(&v, &u, sizeof v);
    return v;
}

}  // namespace

// Sorts ids (given in ascending id order, with their logits vals) by logit descending; equal
// logits keep id order (LSD radix is stable). Keys are taken relative to the smallest, so a list
// of logits spanning few float values needs few 12-bit digits (two cover 2^24 distinct values),
// and a list of one value (all equal) is already sorted.
template <class IdVec, class ValVec, class KeyVec>
static void sort_desc(const float* a, IdVec& ids, ValVec& vals, KeyVec& keys, KeyVec& tmp, std::vector<uint32_t>& count) {
    const size_t m = ids.size();
    if (m < 2) return;
    if (m < 96) {
        std::stable_sort(ids.begin(), ids.end(), [a](int32_t x, int32_t y) { return desc_key(a[x]) < desc_key(a[y]); });
        for (size_t i = 0; i < m; ++i) vals[i] = a[ids[i]];
        return;
    }
    uint32_t lo, hi;
    key_range(vals.data(), (int64_t)m, lo, hi);
    if (lo == hi) return;
    keys.resize(m);
    tmp.resize(m);
    for (size_t i = 0; i < m; ++i) keys[i] = ((uint64_t)(desc_key(vals[i]) - lo) << 32) | (uint32_t)ids[i];
    // Digits of 8 to 12 bits, as even as the passes allow. A pass clears and scans 2^digit counts
    // and reads and scatters every key; a count costs about a quarter of a key (measured: 12-bit
    // digits sort the ~6,900 keys of flat top_p .9 8 us faster than 8-bit ones, 8-bit digits the
    // few hundred of flat top_p .5 2.6 us faster; docs/sampling.md, "Fifth round"), so short lists
    // take more, narrower passes.
    const int bits = 32 - __builtin_clz(hi - lo);
    auto pass_cost = [&](int p) { return (double)p * ((double)(1u << ((bits + p - 1) / p)) * 0.25 + (double)m); };
    int passes = (bits + 11) / 12;
    for (int p = passes + 1; p <= (bits + 7) / 8; ++p)
        if (pass_cost(p) < pass_cost(passes)) passes = p;
    const int digit = (bits + passes - 1) / passes;
    const uint64_t mask = (1u << digit) - 1;
    count.resize((size_t)1 << digit);
    uint32_t* c = count.data();
    uint64_t* k = keys.data();
    uint64_t* t = tmp.data();
    for (int shift = 32; shift < 32 + bits; shift += digit) {
        std::fill(c, c + ((size_t)1 << digit), 0u);
        for (size_t i = 0; i < m; ++i) ++c[(k[i] >> shift) & mask];
        uint32_t off = 0;
        for (size_t d = 0; d < ((size_t)1 << digit); ++d) { const uint32_t n = c[d]; c[d] = off; off += n; }
        for (size_t i = 0; i < m; ++i) t[c[(k[i] >> shift) & mask]++] = k[i];
        std::swap(k, t);
    }
    if (k != keys.data()) std::memcpy(keys.data(), k, sizeof(uint64_t) * m);
    for (size_t i = 0; i < m; ++i) {
        ids[i] = (int32_t)(keys[i] & 0xFFFFFFFFu);
        vals[i] = key_value((uint32_t)(keys[i] >> 32) + lo);
    }
}

std::vector<int32_t> sorted_finite_ids(const float* a, int64_t n) {
    std::vector<int32_t> ids((size_t)n + 16);
    std::vector<float> vals((size_t)n + 16);
    const int64_t k = collect_finite_at_least(a, n, kNegInf, ids.data(), vals.data());
    ids.resize((size_t)k);
    vals.resize((size_t)k);
    std::vector<uint64_t> keys, tmp;
    std::vector<uint32_t> count;
    sort_desc(a, ids, vals, keys, tmp, count);
    return ids;
}

namespace {

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

// out[c] = the float sum, in some order, of w[c * 128, (c + 1) * 128) for c in [c0, c1): the guides
// of binade_seq_sum_guided (a clone per ISA; any order will do there).
DS4_SAMPLING_HOT void chunk_sums(const float* w, int64_t c0, int64_t c1, float* out) {
    for (int64_t c = c0; c < c1; ++c) {
        F16 acc = load16(w + c * 128);
        for (int j = 16; j < 128; j += 16) acc += load16(w + c * 128 + j);
        float r = 0.0f;
        for (int j = 0; j < 16; ++j) r += acc[j];
        out[c] = r;
    }
}

// out[i] = v: probabilities()' equal weights (a clone per ISA: whole-vector stores where there
// are; std::fill of a non-zero float got 16-byte stores). Zeros go through std::fill (memset).
DS4_SAMPLING_HOT void fill_floats(float* out, int64_t n, float v) {
    for (int64_t i = 0; i < n; ++i) out[i] = v;
}

// First i with a finite a[i] (n when none).
int64_t first_finite(const float* a, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        if (finite(a[i])) return i;
    return n;
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

// A weight c = 2^(-k/4) whose (estimated) entries >= c hold `mass`, as large as the grid allows;
// 0 when even 2^-48 does not: a guess, which the caller checks. Bisection, about 8 steps. The
// weights >= 2^-8 are gathered once and summed exactly when they are few (a heavy tail holds much
// of the mass in a few tokens, which a sample would miss), else sampled; below 2^-8, every fourth
// block of 16 estimates the rest. When a sample already shows many of them (narrow logits: tens of
// thousands, docs/sampling.md "Ninth round") they are sampled in place instead of gathered first.
template <class IdVec, class ValVec>
float mass_threshold(const float* w, int64_t n, double mass, IdVec& ids, ValVec& big_w) {
    const float big = 0x1p-8f;
    const float inf = std::numeric_limits<float>::infinity();
    const int step = n >= 4096 ? 4 : 1;
    const bool gather = estimate_count_at_least(w, n, big, 16) < 4096;
    int64_t n_big = 0;
    if (gather) {
        if (ids.size() < (size_t)n + 16) ids.resize((size_t)n + 16);
        if (big_w.size() < (size_t)n + 16) big_w.resize((size_t)n + 16);
        n_big = collect_finite_at_least(w, n, big, ids.data(), big_w.data());
    }
    const int big_step = n_big >= 4096 ? 4 : 1;
    // Far from the answer (the first steps, a factor of 4 or more in weight away) a sparser sample
    // of the small weights decides as well: every 16th block until two binades remain.
    const int coarse = n >= 65536 ? 4 * step : step;
    auto mass_at = [&](float c, int st) {
        if (!gather) return mass_in(w, n, c, inf, st);
        const double r = mass_in(big_w.data(), n_big, c, inf, big_step);
        return c >= big ? r : r + mass_in(w, n, c, big, st);
    };
    auto c_of = [](int k) { return (float)std::exp2(-0.25 * k); };
    int lo = 0, hi = 192;   // mass_at(c_of(hi)) >= mass > mass_at(c_of(lo)) once checked
    if (mass_at(c_of(hi), coarse) < mass) return 0.0f;
    if (mass_at(c_of(lo), step) >= mass) return c_of(lo);
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        (mass_at(c_of(mid), hi - lo > 8 ? coarse : step) >= mass ? hi : lo) = mid;
    }
    return c_of(hi);
}

// The first i with x[i] < bound (n when none).
DS4_SAMPLING_HOT int64_t first_below(const float* x, int64_t n, float bound) {
    for (int64_t b = 0; b < n; b += kBlock) {
        const int64_t m = std::min(kBlock, n - b);
        int any = 0;
        for (int64_t j = 0; j < m; ++j) any |= x[b + j] < bound;
        if (!any) continue;
        for (int64_t j = 0; j < m; ++j) if (x[b + j] < bound) return b + j;
    }
    return n;
}

// out[j] = the largest finite a[i] with i = j (mod g) (-inf when none): g disjoint columns.
DS4_SAMPLING_HOT void column_maxima(const float* a, int64_t n, int64_t g, float* out) {
    std::fill(out, out + g, kNegInf);
    const F16 neg = kNegInf - (F16){};
    for (int64_t row = 0; row < n; row += g) {
        const float* r = a + row;
        const int64_t m = std::min(g, n - row);
        int64_t j = 0;
        for (; j + 16 <= m; j += 16) {
            const F16 v = load16(r + j);
            const F16 fv = (v - v == 0.0f) ? v : neg;
            F16 acc = load16(out + j);
            acc = fv > acc ? fv : acc;
            std::memcpy(out + j, &acc, sizeof acc);
        }
        for (; j < m; ++j) if (finite(r[j]) && r[j] > out[j]) out[j] = r[j];
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
    // The m-th largest of g >= m column maxima is a floor: the m largest maxima are m distinct
    // finite logits at or above it, so the m best are all at or above it. 2m columns leave about
    // 1.5 m survivors on smooth logits. Tokens above the floor are sorted; tokens equal to it come
    // after them in id order, and only as many as the m best need (many tokens can tie with it).
    // At least 256 columns: few columns make long rows of dependent maxima (slow), and more
    // columns only raise the floor.
    const int64_t g = std::max<int64_t>(256, (2 * m + 15) / 16 * 16);
    if (n < 4 * g) {
        collect_logits_at_least(a, n, kNegInf);
        sort_candidates(a);
        if ((int64_t)ids_.size() > m) { ids_.resize((size_t)m); vals_.resize((size_t)m); }
        return;
    }
    maxima_.resize((size_t)g);
    column_maxima(a, n, g, maxima_.data());
    std::nth_element(maxima_.begin(), maxima_.begin() + (m - 1), maxima_.end(), std::greater<float>());
    const float floor = maxima_[m - 1];
    ids_.resize((size_t)n + 16);
    vals_.resize((size_t)n + 16);
    tmp_ids_.resize((size_t)m + 16);
    int64_t tied = 0;
    // A floor of -inf (fewer than m columns hold a finite logit): every finite logit is above it,
    // and the -inf entries equal to it are never candidates.
    const int64_t tie_limit = floor == kNegInf ? 0 : m;
    const int64_t above = collect_above_and_tied(a, n, floor, ids_.data(), vals_.data(), tie_limit, tmp_ids_.data(), &tied);
    ids_.resize((size_t)above);
    vals_.resize((size_t)above);
    sort_candidates(a);
    if (above >= m) {
        ids_.resize((size_t)m);
        vals_.resize((size_t)m);
        return;
    }
    const int64_t take = std::min(tied, m - above);
    ids_.insert(ids_.end(), tmp_ids_.begin(), tmp_ids_.begin() + take);
    vals_.resize((size_t)(above + take), floor);
}

void Sampler::collect_logits_at_least(const float* a, int64_t n, float floor) {
    ids_.resize((size_t)n + 16);
    vals_.resize((size_t)n + 16);
    const int64_t k = collect_finite_at_least(a, n, floor, ids_.data(), vals_.data());
    ids_.resize((size_t)k);
    vals_.resize((size_t)k);
}

void Sampler::sort_candidates(const float* a) { sort_desc(a, ids_, vals_, keys_, tmp_keys_, radix_count_); }

void Sampler::weights_of_sorted(float m, float t) {
    // Sorted logits come in runs of equal values (ties): a block of 16 equal to the last argument
    // evaluated copies its weight instead of evaluating exp again.
    const int64_t k = (int64_t)vals_.size();
    x_.resize((size_t)k);
    w_.resize((size_t)k);
    shifted_args(vals_.data(), k, m, t, x_.data());
    float last_x = 1.0f, last_w = 0.0f;   // 1 is never an argument (arguments are <= 0)
    for (int64_t i = 0; i < k; i += 16) {
        const int64_t len = std::min<int64_t>(16, k - i);
        if (all_equal(x_.data() + i, len, last_x)) {
            std::fill(w_.begin() + i, w_.begin() + i + len, last_w);
            continue;
        }
        exp_weights(x_.data() + i, w_.data() + i, len);
        last_x = x_[i + len - 1];
        last_w = w_[i + len - 1];
    }
}

bool Sampler::filter_sorted(float total, float top_p, float min_p, bool list_is_everything) {
    // Upstream's loop: stop before token i > 0 when fl(w_i / total) < min_prob, else add w_i and
    // stop after it once fl(sum / total) >= top_p. The min-p stop is found by a scan, the top-p
    // stop by the sequential sum a binade at a time (binade_sum.h) up to it.
    const int64_t m = (int64_t)ids_.size();
    const float min_prob = (w_[0] / total) * min_p;
    const int64_t cut = min_prob > 0.0f ? first_ratio_below(w_.data(), m, total, min_prob) : m;
    float fsum = 0.0f;
    const int64_t stop = binade_seq_until(w_.data(), cut, total, top_p, fsum);
    c_.sum = fsum;
    if (stop < cut) {
        c_.count = stop + 1;
        return true;
    }
    c_.count = cut;
    return cut < m || list_is_everything;
}

float Sampler::max_and_prefix(const float* a, int64_t n, float d, int64_t* n_finite, float* lowest, float* floor_out) {
    // The max pass, then one collection at fl(m - d). (Collecting during the max pass at the
    // running maximum's threshold was measured: on flat logits the running maximum approaches the
    // final one slowly, and the superset, three times the prefix, cost more than the pass it saved.)
    // When every finite logit is within d (a high temperature) nothing is collected: the whole
    // vocabulary is no prefix worth bucketing apart from the whole-vocabulary branch.
    // Each collected token is one word, its id and its level on a grid below m (bucket_collect.h):
    // the bucket partition's index without reading the logits again (docs/sampling.md, "Ninth round").
    const float m = finite_max(a, n, n_finite, lowest);
    *floor_out = kNegInf;
    const float floor = m - d;
    if (m == kNegInf || !(floor > *lowest)) return m;
    // A long prefix costs more to collect and partition than the mass threshold's tighter floor
    // (or the whole-vocabulary partition) after the total: not collected (bucket_topp.h).
    if ((float)estimate_count_at_least(a, n, floor, 32) > bucket_top_p_early_max()) return m;
    collect_packed(a, n, m, floor, *n_finite == n);
    *floor_out = floor;
    return m;
}

void Sampler::collect_packed(const float* a, int64_t n, float m, float floor, bool all_finite) {
    PrefixGrid& g = prefix_grid_;
    g.hi = m;
    g.id_bits = std::max(1, 64 - __builtin_clzll((unsigned long long)(n - 1) | 1));
    g.fine_bits = std::min(16, 32 - g.id_bits);
    const float scale = (float)(1u << g.fine_bits) / (m - floor);
    g.scale = scale <= std::numeric_limits<float>::max() ? scale : std::numeric_limits<float>::max();
    packed_.resize((size_t)n + 64);
    packed_.resize((size_t)collect_prefix(a, n, floor, g, all_finite, packed_.data()));
}

void Sampler::unpack_packed(const float* a) {
    const size_t k = packed_.size();
    const uint32_t mask = (uint32_t)((1ull << prefix_grid_.id_bits) - 1);
    ids_.resize(k);
    vals_.resize(k);
    for (size_t j = 0; j < k; ++j) {
        ids_[j] = (int32_t)(packed_[j] & mask);
        vals_[j] = a[ids_[j]];
    }
}

void Sampler::select_full(const float* a, int64_t n, float t, float top_p, float min_p) {
    int64_t n_finite = 0;
    float lowest = 0.0f;
    // min_p 0 with top_p < 1 on a large vocabulary: right after the max pass, collect the logits
    // within d of the maximum, a prefix of the sorted order that likely holds the top-p stop (the
    // code below checks that it does; else the mass threshold's guesses follow). d covers weights
    // down to 2^-(9 + 1.5 log2(1 / (1 - top_p))): 2^-14 at top_p .9, where N(0, 3) logits stop
    // between 2^-11.5 and 2^-13.7 (docs/sampling.md, "Sixth round").
    float prefix_floor = kNegInf;
    const bool early = min_p == 0.0f && top_p < 1.0f && n >= kEarlyPrefixMinVocab &&
                       bucket_top_p_prefix_min() <= (float)n;
    const float d = early ? t * (float)(std::log(2.0) * std::min(24.0, 9.0 - 1.5 * std::log2(1.0 - (double)top_p))) : 0.0f;
    const float m = early ? max_and_prefix(a, n, d, &n_finite, &lowest, &prefix_floor)
                          : finite_max(a, n, &n_finite, &lowest);
    if (m == kNegInf) {   // no finite logit
        c_.no_draw = argmax_logits(a, n);
        return;
    }
    // The first index of the largest finite logit (the pick without a draw, or when the walk runs
    // off the end) costs a pass and is rarely needed: found on demand (resolve_best).
    best_of_ = {a, n, m};
    c_.no_draw = c_.after_walk = kBestOnDemand;
    if (lowest == m && n_finite < (1 << 24)) return select_equal(a, n, n_finite, top_p, min_p);

    const bool all_finite = n_finite == n;
    if (top_p >= 1.0f && min_p > 0.0f) return select_min_p(a, n, m, lowest, all_finite, t, min_p);
    if (top_p >= 1.0f) return keep_all_finite(a, n, m, lowest, t, all_finite);   // min_p 0

    // Every finite token's weight (non-finite logits weigh 0: they add nothing to sums or walks),
    // evaluated exactly only where the total needs it (binade_sum.h).
    // min_p 0: the mass threshold below needs approximate weights, taken on the way.
    const bool need_mass = min_p == 0.0f;
    if (need_mass) wall_.resize((size_t)n);
    const float total = binade_logit_total(a, n, m, t, all_finite, lowest, need_mass ? wall_.data() : nullptr);
    if (!(total > 0.0f && std::isfinite(total))) return;

    // Sorted branch: a sorted prefix that the filters stop inside decides; grow it until one does.
    // Prefixes are taken by logit (logit_floor), so equal logits are never split.
    // min_p 0 with a top-p prefix of many tokens: the bucket partition sorts only the few buckets
    // where the order can change a bit (bucket_topp.h). Certainly many (each weighs at most 1):
    const float min_kept = bucket_top_p_min_kept();
    bool buckets_tried = false;
    if (need_mass && (double)top_p * (double)total > (double)min_kept) {
        buckets_tried = true;
        if (select_buckets(a, n, m, lowest, all_finite, t, total, top_p)) return;
    }
    // The prefix collected after the max pass (every finite logit >= prefix_floor), if it holds
    // the stop: bucketed when long, else sorted (filter_sorted checks that the stop is inside).
    bool done = false;
    // The collected candidates (ids_/vals_) sorted, weighed and filtered: true when a filter stops
    // inside them (or they are every finite token), so they decide.
    auto sort_and_filter = [&] {
        sort_candidates(a);
        weights_of_sorted(m, t);
        return filter_sorted(total, top_p, min_p, (int64_t)ids_.size() == n_finite);
    };
    if (prefix_floor > kNegInf) {
        if (select_prefix_buckets(a, m, prefix_floor, t, total, top_p)) return;
        if ((float)packed_.size() < bucket_top_p_prefix_min()) {
            unpack_packed(a);
            done = sort_and_filter();
        }
    }
    if (min_p > 0.0f) {
        // p/total >= fl(1/total)*min_p needs p >= min_p up to a few ulps: a 0.1% margin is a superset.
        const float c = std::min(min_p, 1.0f) * 0.999f;
        collect_logits_at_least(a, n, logit_floor(m, t, c));
        done = sort_and_filter();
        if (!done) {
            // The next token weighs < c; it fails min-p if even the largest float below c does.
            const float min_prob = (1.0f / total) * min_p;
            done = min_prob >= std::numeric_limits<float>::min() && std::nextafter(c, 0.0f) / total < min_prob;
        }
    }
    if (!done && need_mass) {
        // The top-p walk stops once the kept weights reach top_p of the total: the tokens whose
        // (approximate) weights hold a little more than that are a sorted prefix that very likely
        // contains the stop; filter_sorted checks that it does, else the pools below decide.
        // A second, 4x lower guess covers an unlucky estimate before the pools take over.
        // (The 2 % margin, capped halfway to the whole total: above top_p .98 it would ask for more
        // than the total, no guess would come back, and the pools would sort everything.)
        const double target = std::min((double)top_p * 1.02, 0.5 * (1.0 + (double)top_p)) * (double)total;
        float c = mass_threshold(wall_.data(), n, target, tmp_ids_, w_);
        // About as many tokens are kept as weigh >= c; more than min_kept only if c is small
        // enough for that many to hold no more than about top_p of the total (then counted).
        if (!buckets_tried && c > 0.0f && (double)c * min_kept < 1.25 * (double)top_p * (double)total &&
            (double)estimate_count_at_least(wall_.data(), n, c) > (double)min_kept &&
            select_buckets(a, n, m, lowest, all_finite, t, total, top_p))
            return;
        for (int guess = 0; guess < 2 && !done && c > 0.0f; ++guess, c *= 0.25f) {
            const float floor = logit_floor(m, t, c);
            collect_packed(a, n, m, floor, all_finite);
            if (select_prefix_buckets(a, m, floor, t, total, top_p)) return;
            unpack_packed(a);
            done = sort_and_filter();
        }
    }
    for (int64_t pool = 256; !done; pool *= 8) {
        if (pool >= n_finite) {
            top_sorted(a, n, n_finite);
            weights_of_sorted(m, t);
            filter_sorted(total, top_p, min_p, true);
            break;
        }
        top_sorted(a, n, pool);
        weights_of_sorted(m, t);
        done = filter_sorted(total, top_p, min_p, false);
    }
    c_ = Candidates{true, c_.no_draw, ids_[c_.count - 1], ids_.data(), w_.data(), c_.count, c_.sum};
}

bool Sampler::select_buckets(const float* a, int64_t n, float m, float lowest, bool all_finite, float t, float total,
                             float top_p) {
    // wall_ is select_full's binade_logit_total's: within kApproxWeightRel (a total that
    // approximates differently, e.g. binade_logit_total_rcp, must pass its own bound here).
    const BucketTopPInput in{a, n, m, lowest, all_finite, wall_.data(), kApproxWeightRel, nullptr, m, t, total, top_p};
    if (!bucket_.select(in)) return false;
    c_ = Candidates{true, c_.no_draw, bucket_.last(), nullptr, nullptr, bucket_.count(), bucket_.sum()};
    c_.buckets = &bucket_;
    return true;
}

bool Sampler::select_prefix_buckets(const float* a, float m, float floor, float t, float total, float top_p) {
    // The collected prefix (packed_: every finite logit >= floor) through the bucket partition
    // instead of a radix sort: only the buckets where the order can change a bit are sorted. Short
    // prefixes sort faster than they bucket (docs/sampling.md, "Sixth round").
    const int64_t k = (int64_t)packed_.size();
    // k == 0 cannot hold the stop (and the partition needs a candidate); with every route enabled
    // (the tests' prefix_min 0) it would otherwise get an empty prefix.
    if (k == 0 || (float)k < bucket_top_p_prefix_min() || !(floor > kNegInf)) return false;
    BucketTopPInput in{a, k, m, floor, true, wall_.data(), kApproxWeightRel, nullptr, m, t, total, top_p};
    in.buckets = (int)std::min<int64_t>(4096, std::max<int64_t>(16, k / kPrefixTokensPerBucket));
    in.packed = packed_.data();
    in.id_bits = prefix_grid_.id_bits;
    in.fine_bits = prefix_grid_.fine_bits;
    if (!bucket_.select(in)) return false;   // no stop inside the prefix: the sorted path decides
    c_ = Candidates{true, c_.no_draw, bucket_.last(), nullptr, nullptr, bucket_.count(), bucket_.sum()};
    c_.buckets = &bucket_;
    return true;
}

void Sampler::keep_all_finite(const float* a, int64_t n, float m, float lowest, float t, bool all_finite) {
    // Every finite token kept, in id order; the weights stay implicit: the walk reads the logits,
    // or at a temperature other than 1 the arguments, divided once here (the division is the
    // slowest step of a pass, and the walk would repeat it).
    float total;
    if (exact_into_) {
        // probabilities(): every exact weight is needed anyway, and their sequential sum is the
        // total (the binade sum of exact terms needs no exponential and no certificate). In pieces
        // that stay in cache between the exponential and the sum; the sum runs on from piece to
        // piece (binade_seq_sum_from). The exponential takes each argument as it reads the logit
        // (no argument array; with every logit finite, without the finiteness test).
        constexpr int64_t kPiece = 2048;
        auto weigh = [&](int64_t i, int64_t len) { exp_weights_of_logits(a + i, len, m, t, all_finite, exact_into_ + i); };
        ThreadPool* const pool = n >= (1 << 15) ? sampling_pool() : nullptr;
        if (pool) {
            // On the pool: the pieces' weights and each chunk's float sum (a guide to the running
            // sum's unit), then the exact sum split the same way (binade_seq_sum_guided).
            const int64_t chunks = n / kBinadeChunk;
            chunk_sums_.resize((size_t)chunks);
            static_assert(kPiece % kBinadeChunk == 0, "pieces hold whole chunks");
            pool->parallel_for((n + kPiece - 1) / kPiece, [&](int64_t q0, int64_t q1) {
                for (int64_t q = q0; q < q1; ++q) {
                    const int64_t i = q * kPiece, len = std::min(kPiece, n - i);
                    weigh(i, len);
                    static_assert(kBinadeChunk == 128, "chunk_sums' chunk");
                    chunk_sums(exact_into_, i / kBinadeChunk, std::min(chunks, (i + len) / kBinadeChunk), chunk_sums_.data());
                }
            }, 4);
            total = binade_seq_sum_guided(exact_into_, n, chunk_sums_.data(), *pool);
        } else {
            total = 0.0f;
            for (int64_t i = 0; i < n; i += kPiece) {
                const int64_t len = std::min(kPiece, n - i);
                weigh(i, len);
                total = binade_seq_sum_from(exact_into_ + i, len, total);
            }
        }
        if (!(total > 0.0f && std::isfinite(total))) return;
        c_.draw = true;
        c_.count = n;
        c_.sum = total;
        c_.w = exact_into_;
        return;
    }
    wall_.resize((size_t)n);   // approximate weights: the walk reads them instead of evaluating again
    // At t != 1 with arguments that span little (T 100), the approximations take the argument by a
    // reciprocal and only uncertain blocks divide; otherwise the arguments are divided once here.
    const float rcp_rel = reciprocal_weight_rel(m, t, lowest);
    const bool divided = t != 1.0f && rcp_rel == 0.0f;
    if (divided) {
        x_.resize((size_t)n);
        shifted_args(a, n, m, t, x_.data());
        total = binade_weight_total(x_.data(), n, wall_.data());
    } else if (rcp_rel > 0.0f) {
        total = binade_logit_total_rcp(a, n, m, t, all_finite, lowest, rcp_rel, wall_.data());
    } else {
        total = binade_logit_total(a, n, m, t, all_finite, lowest, wall_.data());
    }
    if (!(total > 0.0f && std::isfinite(total))) return;
    c_.draw = true;
    c_.count = n;
    c_.sum = total;
    c_.logits = a;
    c_.x = divided ? x_.data() : nullptr;
    c_.rcp_rel = rcp_rel;
    c_.wa = wall_.data();
    c_.m = m;
    c_.t = t;
    c_.lowest = lowest;
    c_.all_finite = all_finite;
}

void Sampler::select_min_p(const float* a, int64_t n, float m, float lowest, bool all_finite, float t, float min_p) {
    // Only tokens with weight >= min_p are kept, in id order: a logit floor finds a superset.
    // Arguments at or above log(min_p) + 2^-20 certainly have weights >= min_p (exp_weights errs
    // by far less than 2^-20 relative); only the few between the floor and that bound evaluate
    // their weight. The kept arguments then go through the binade sum and walk like the whole
    // vocabulary (their weights are mostly never evaluated exactly).
    float sure = std::nextafter((float)(std::log((double)min_p) + std::ldexp(1.0, -20)), 1.0f);
    if (min_p <= 1.0f) sure = std::min(sure, 0.0f);   // exp(0) = 1 >= min_p
    // The smallest finite logit's argument is the smallest argument: when it is sure, every
    // finite token is kept and the whole vocabulary's walk over the logits applies.
    const float lowest_arg = t == 1.0f ? lowest - m : (lowest - m) / t;
    if (lowest_arg >= sure) return keep_all_finite(a, n, m, lowest, t, all_finite);
    collect_logits_at_least(a, n, logit_floor(m, t, min_p));
    const int64_t k0 = (int64_t)ids_.size();
    x_.resize((size_t)k0);
    shifted_args(vals_.data(), k0, m, t, x_.data());
    int64_t k = 0, j = 0;
    while (j < k0) {
        const int64_t run = first_below(x_.data() + j, k0 - j, sure);   // certainly kept
        if (k != j) {
            std::memmove(ids_.data() + k, ids_.data() + j, sizeof(int32_t) * run);
            std::memmove(x_.data() + k, x_.data() + j, sizeof(float) * run);
        }
        k += run;
        j += run;
        if (j == k0) break;
        float w;
        exp_weights(&x_[j], &w, 1);
        if (!(w < min_p)) {
            ids_[k] = ids_[j];
            x_[k++] = x_[j];
        }
        ++j;
    }
    const float total = binade_weight_total(x_.data(), k, nullptr);
    if (!(total > 0.0f && std::isfinite(total))) return;
    c_ = Candidates{true, c_.no_draw, c_.after_walk, ids_.data(), nullptr, k, total, x_.data(), nullptr};
}

void Sampler::select_equal(const float* a, int64_t n, int64_t n_finite, float top_p, float min_p) {
    // Every candidate weighs expf(0) = 1 and sorts in id order (ties), so every sum is the integer
    // count, exact below 2^24: the filters reduce to arithmetic on counts (docs/sampling.md).
    if (n_finite < n) collect_logits_at_least(a, n, kNegInf);   // the finite ids, ascending
    const float total = (float)n_finite;
    int64_t kept = n_finite;
    if (top_p >= 1.0f) {
        if (min_p > 0.0f && 1.0f < min_p) kept = 0;   // select_min_p's test: w = 1 < min_p
        if (kept == 0) return;                          // a zero total: no draw
    } else {
        // upstream's loop: stop before token i > 0 when fl(1 / total) < fl(fl(1 / total) * min_p),
        // else stop after token i once fl((i + 1) / total) >= top_p (monotone in i: a bisection).
        const float ratio = 1.0f / total;
        if (ratio < ratio * min_p) kept = 1;
        int64_t lo = 0, hi = kept;   // the first count c in (lo, hi] with fl(c / total) >= top_p, else kept
        while (hi - lo > 1) {
            const int64_t mid = lo + (hi - lo) / 2;
            ((float)mid / total >= top_p ? hi : lo) = mid;
        }
        if (!((float)hi / total >= top_p)) hi = kept;
        kept = std::min(kept, hi);
    }
    c_.draw = true;
    c_.ones = true;
    c_.ids = n_finite < n ? ids_.data() : nullptr;
    c_.count = kept;
    c_.sum = (float)kept;
    c_.after_walk = c_.id(kept - 1);
}

void Sampler::select_top_k(const float* a, int64_t n, float t, int64_t k, float top_p, float min_p) {
    top_sorted(a, n, k);
    if (ids_.empty()) {
        c_.no_draw = argmax_logits(a, n);
        return;
    }
    const int64_t m = (int64_t)ids_.size();
    weights_of_sorted(vals_[0], t);
    c_.no_draw = ids_[0];
    const float total = binade_seq_sum(w_.data(), m);
    if (!(total > 0.0f && std::isfinite(total))) return;
    filter_sorted(total, top_p, min_p, true);
    c_ = Candidates{true, c_.no_draw, ids_[c_.count - 1], ids_.data(), w_.data(), c_.count, c_.sum};
}

int32_t Sampler::resolve_best(int32_t pick) const {
    return pick == kBestOnDemand ? (int32_t)first_equal(best_of_.a, best_of_.n, best_of_.m) : pick;
}

const Candidates& Sampler::select(const float* a, int64_t n, const SamplerParams& p) {
    select_knobs(a, n, p);
    if (!c_.draw) c_.no_draw = resolve_best(c_.no_draw);   // (a draw resolves after_walk if it runs off)
    return c_;
}

void Sampler::select_knobs(const float* a, int64_t n, const SamplerParams& p) {
    c_ = Candidates{};
    const float t = p.temperature;
    if (!(t > 0.0f) || n <= 0) {   // NaN too: upstream's `<= 0` test would pass it on to exp
        c_.no_draw = n > 0 ? argmax_logits(a, n) : 0;
        return;
    }
    const float top_p = (p.top_p > 0.0f && p.top_p <= 1.0f) ? p.top_p : 1.0f;
    const float min_p = p.min_p < 0.0f ? 0.0f : p.min_p;
    if (p.top_k <= 0) {
        select_full(a, n, t, top_p, min_p);
    } else {
        select_top_k(a, n, t, std::min<int64_t>({(int64_t)p.top_k, kTopKMax, n}), top_p, min_p);
    }
}

int32_t Sampler::sample(const float* a, int64_t n, const SamplerParams& p, uint64_t& rng_state) {
    const Candidates& c = select(a, n, p);
    if (!c.draw) return c.no_draw;
    float r = rng_uniform(rng_state) * c.sum;
    if (c.ones) {
        // r = fl(r - 1) is exact while r >= 1 (r < 2^24): the walk stops after ceil(r) steps
        // (one when r <= 0), at index ceil(r) - 1 < count since r <= count.
        const int64_t steps = r > 0.0f ? (int64_t)std::ceil(r) : 1;
        return c.id(std::min(steps, c.count) - 1);
    }
    if (c.buckets) {
        const int64_t i = c.buckets->walk(r);
        return i >= 0 ? (int32_t)i : resolve_best(c.after_walk);
    }
    if (c.logits) {
        // r = 0 stops at the first kept token, which the walk over every logit (non-finite
        // ones weighing 0) would not: it would stop at token 0 whatever it is.
        if (!(r > 0.0f)) return (int32_t)first_finite(c.logits, c.count);
        const int64_t i = c.x           ? binade_weight_walk(c.x, c.wa, c.count, r)
                          : c.rcp_rel > 0 ? binade_logit_walk_rcp(c.logits, c.count, c.m, c.t, c.all_finite, c.lowest,
                                                                  c.rcp_rel, c.wa, r)
                                          : binade_logit_walk(c.logits, c.count, c.m, c.t, c.all_finite, c.lowest, c.wa, r);
        return i >= 0 ? (int32_t)i : resolve_best(c.after_walk);
    }
    if (c.x) {
        const int64_t i = binade_weight_walk(c.x, c.wa, c.count, r);
        return i >= 0 ? c.id(i) : resolve_best(c.after_walk);
    }
    const int64_t i = binade_seq_walk(c.w, c.count, r);
    return i >= 0 ? c.id(i) : resolve_best(c.after_walk);
}

void Sampler::probabilities(const float* a, int64_t n, const SamplerParams& p, float* probs) {
    // The whole vocabulary's exact weights go straight into probs (keep_all_finite), then are
    // scaled in place (on the pool, when there is one, both).
    ThreadPool* const pool = sampling_pool();
    exact_into_ = probs;
    struct Reset {
        float*& into;
        ~Reset() { into = nullptr; }   // also if select throws: sample() must never write there
    } reset{exact_into_};
    const Candidates& c = select(a, n, p);
    if (!c.draw || c.ids || c.buckets) std::fill(probs, probs + n, 0.0f);   // else every entry is written below
    if (!c.draw) {
        probs[c.no_draw] = 1.0f;
        return;
    }
    const double inv = 1.0 / (double)c.sum;
    if (c.ones) {
        const float p1 = (float)inv;   // (float)(1.0 * inv), as scale() computes it
        if (c.ids) {
            for (int64_t i = 0; i < c.count; ++i) probs[c.ids[i]] = p1;
        } else {
            fill_floats(probs, c.count, p1);
            std::fill(probs + c.count, probs + n, 0.0f);   // memset
        }
        return;
    }
    // w holds the weights of [i0, i1) (w[0] is token i0's).
    auto scale = [&](const float* w, int64_t i0, int64_t i1) {
        if (c.ids) {
            for (int64_t i = i0; i < i1; ++i) probs[c.ids[i]] = (float)((double)w[i - i0] * inv);
        } else {
            scale_weights(w, i1 - i0, inv, probs + i0);
        }
    };
    if (c.buckets) return c.buckets->probabilities(inv, probs);
    if (c.w == probs && pool && c.count >= (1 << 15)) {   // the whole vocabulary's exact weights, in place
        pool->parallel_for(c.count, [&](int64_t i0, int64_t i1) { scale_weights(probs + i0, i1 - i0, inv, probs + i0); },
                           4096);
        return;
    }
    if (c.w) return scale(c.w, 0, c.count);
    // The min-p survivors, weights not evaluated yet (their arguments in c.x; the whole vocabulary
    // always comes with its exact weights here, above): in pieces (on the pool when allowed), the
    // weights in the caller's stack while in cache.
    constexpr int64_t kPiece = 2048;
    auto piece = [&](int64_t i0, int64_t i1) {
        alignas(64) float wb[kPiece];
        exp_weights(c.x + i0, wb, i1 - i0);
        scale(wb, i0, i1);
    };
    const int64_t pieces = (c.count + kPiece - 1) / kPiece;
    auto run = [&](int64_t p0, int64_t p1) {
        for (int64_t q = p0; q < p1; ++q) piece(q * kPiece, std::min(c.count, (q + 1) * kPiece));
    };
    if (pool && pieces > 8) {
        pool->parallel_for(pieces, run, 4);
    } else {
        run(0, pieces);
    }
}

}  // namespace ds4
