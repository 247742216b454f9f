// Top-p over logit-value buckets (docs/sampling.md, "Top-p over buckets"): the sorted branch's
// kept set, sum and walk without sorting the whole top-p prefix. The finite tokens are split into
// buckets of equal logit intervals (consecutive segments of the sorted order that never split a
// tie); a bucket whose every term's rounding at the running value's unit is certain, and whose
// rounded units keep that value inside its binade, is added (or walked) as an integer count of
// units, which is the sorted loop's float result bit for bit; any other bucket is sorted and runs
// the plain loop. select() returns false when it cannot decide (the sorted path then decides).
// Over the whole vocabulary a bucket's ids are collected only when it needs them: the others are
// certified from bounds on their weights alone (docs/sampling.md, "Eighth round").
#pragma once
#include <cstdint>
#include <memory>

namespace ds4 {

namespace binade {
struct Unit;   // binade_sum_impl.h
}

struct BucketTopPInput {
    const float* a = nullptr;   // the logits
    int64_t n = 0;
    float hi = 0.0f, lo = 0.0f;   // the largest and the smallest finite logit
    bool all_finite = false;
    // Every token's weight approximated (by id), within rel relative plus 2^-125 absolute of the
    // exact weight (binade_sum.h's kApproxWeightRel; exact weights fit any rel).
    const float* wa = nullptr;
    float rel = 0.0f;
    // The exact weights: w_exact[i] when given (tests), else exp_weights(fl(fl(a[i] - m) / t)).
    const float* w_exact = nullptr;
    float m = 0.0f, t = 1.0f;
    float total = 0.0f, top_p = 1.0f;   // the stop: the first sorted position with fl(sum / total) >= top_p
    int buckets = 4096;                  // 1..65535
    // A top-p prefix instead of the whole vocabulary (docs/sampling.md, "Sixth round"): the n
    // candidates are the ids sub[0..n), ascending, every finite token with a logit >= lo (so the
    // set is a prefix of the sorted order). lo is then a bound at or below the smallest of them.
    // Null: every token 0..n-1.
    const int32_t* sub = nullptr;
    // Or (sub null) the same prefix as collect_prefix's words (bucket_collect.h): id in the low
    // id_bits, the token's grid level (2^fine_bits of them, fine_bits <= 16) above. The buckets are
    // then ranges of levels; otherwise of fl(fl(hi - l) * scale) as over the whole vocabulary.
    const uint32_t* packed = nullptr;
    int id_bits = 0, fine_bits = 0;
};

class BucketTopP {
public:
    // The kept set and its sequential sum in sorted order; false when no stop was found (top_p
    // unreachable by rounding) or the logits' range cannot be bucketed: the caller's sorted path.
    bool select(const BucketTopPInput& in);
    int64_t count() const { return kept_; }
    float sum() const { return sum_; }
    // The kept tokens (bucket by bucket; in sorted order inside the stop's bucket) into out[0..count).
    void kept_ids(int32_t* out) const;
    int32_t last() const { return ids_[pos_[stop_bucket_] + kept_stop_ - 1]; }   // the stop: the last kept token in sorted order
    // The sorted walk r = fl(r - w) over the kept tokens: the id where r <= 0 first, or -1.
    int64_t walk(float r);
    // probs[id] = (float)((double)w_id * inv) for every kept id; the other entries are left alone
    // (a collected prefix) or set to 0 (the whole vocabulary).
    void probabilities(double inv, float* probs);
    int64_t sorted_tokens() const;   // how many kept tokens sit in sorted buckets (tests, docs)

private:
    // kNone: the bucket's ids are not collected yet (whole vocabulary); kApprox: collected, its
    // weights read from wa by id; kExact/kSorted: exact weights in w_ (kSorted: in sorted order).
    enum State : uint8_t { kNone, kApprox, kExact, kSorted };
    int64_t count(int k) const { return (int64_t)off_[k + 1] - off_[k]; }
    bool units(int k, int64_t m, float inv_u, int64_t& r);   // of the bucket's first m tokens
    bool certified(int k, int64_t m, float inv_u, int64_t& r) const;
    // certified, else units after collecting the ids (S: the running value's unit count; walk: down)
    bool units_at(int k, int64_t m, const binade::Unit& un, int64_t S, bool walk, int64_t& r);
    bool weight_bounds(int nb, float scale);
    bool prefix_too_light(const uint32_t* off, int nb) const;
    void need_ids(int k, float v, bool walk);
    void plan(int k0, float v0, bool walk);
    void collect();
    int64_t stop_units(float u) const;
    void make_exact(int k);
    void sort_bucket(int k);
    void exact_weights(const int32_t* ids, int64_t m, float* out);
    void scatter(int64_t n, int nb, int64_t n_finite);

    template <class T>
    struct Buf {   // scratch that grows and is never initialised (filled right after)
        std::unique_ptr<T[]> p;
        int64_t cap = 0;
        T* get(int64_t n) {
            if (n > cap) {
                p.reset(new T[(size_t)n]);
                cap = n;
            }
            return p.get();
        }
        T& operator[](int64_t i) { return p[(size_t)i]; }
        const T& operator[](int64_t i) const { return p[(size_t)i]; }
    };

    BucketTopPInput in_;
    Buf<uint16_t> bix_;     // each token's bucket (buckets: not finite)
    Buf<int32_t> sub_;      // a packed prefix's ids
    Buf<uint32_t> off_;     // bucket k holds sorted positions [off_[k], off_[k + 1])
    Buf<uint32_t> pos_;     // its ids and weights: ids_/w_ from pos_[k] (collected buckets only, when lazy_)
    Buf<uint8_t> state_;
    Buf<int32_t> ids_;      // from pos_[k]: bucket k's ids, ascending unless sorted
    Buf<float> w_;          // from pos_[k]: their exact weights (kExact, kSorted; kApprox reads wa by id)
    Buf<float> vals_, x_;
    Buf<uint64_t> keys_;
    Buf<uint32_t> cur_;
    Buf<float> wlo_, whi_;  // bounds on every weight of bucket k (bounds_: valid)
    Buf<uint8_t> want_;     // buckets the next collection pass fills
    Buf<int> wanted_;       // the buckets marked in want_
    Buf<int32_t> hits_;     // the collection pass's scratch
    int64_t next_ = 0, exact_end_ = 0;   // the next free entry of ids_/w_ (lazy_); scratch of collect()
    int n_wanted_ = 0;
    bool lazy_ = false, bounds_ = false;
    int stop_bucket_ = 0;
    int64_t kept_ = 0, kept_stop_ = 0;   // kept tokens, and of them in the stop's bucket
    float sum_ = 0.0f;
};

// Whether the sampler takes the bucket branch: when at least this many tokens are kept (default
// 40,000; below that, sorting the prefix costs less). Certain when top_p * total exceeds it (every
// weight is at most 1), else estimated from the top-p weight threshold (estimate_count_at_least).
// Tests set 0 (always), inf switches the branch off.
float bucket_top_p_min_kept();
void set_bucket_top_p_min_kept(float v);

// The same for a collected top-p prefix (BucketTopPInput::sub; default 1,024 tokens, below which
// the radix sort costs less). Tests and measurements set 0 (always) or inf (never).
float bucket_top_p_prefix_min();
void set_bucket_top_p_prefix_min(float v);

// The top-p prefix is collected right after the max pass (docs/sampling.md, "Sixth round") only
// when a sample (estimate_count_at_least on the logits) puts it at no more than this many tokens
// (default 50,000). Where the guessed floor lies far below the stop (narrow logits: the bundled
// small model's N(0, 1.5) keeps 8,800 of a 91,000-token prefix at top_p .5) the prefix is not
// collected; the mass threshold on the total's approximate weights then chooses a tighter floor,
// or the whole-vocabulary partition ("Ninth round"). Tests set inf (always collect) or 0 (never).
float bucket_top_p_early_max();
void set_bucket_top_p_early_max(float v);

// How many selections the bucket partition has decided in this process (tests: that a branch ran):
// over the whole vocabulary, and over a collected top-p prefix (BucketTopPInput::sub).
int64_t bucket_top_p_selections();
int64_t bucket_top_p_prefix_selections();

// How many collection passes over the vocabulary the whole-vocabulary branch has run in this
// process (tests, docs). Tests may set the plan to 1: each pass then collects only the bucket that
// asked for it, so every other bucket that needs its ids later takes a pass of its own.
int64_t bucket_top_p_collections();
int bucket_top_p_plan();
void set_bucket_top_p_plan(int v);

// About how many w[i] >= c: every `every`-th block of 16 counted, times `every` (a guide only).
int64_t estimate_count_at_least(const float* w, int64_t n, float c, int every = 4);

}  // namespace ds4
