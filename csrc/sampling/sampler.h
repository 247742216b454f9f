// Token sampling with upstream's filter order, RNG and float32 arithmetic (docs/sampling.md):
// temperature <= 0 (or NaN) is argmax; otherwise top-k (k clamped to 1024 and the vocabulary) or
// the whole vocabulary, then min-p and top-p over the candidates sorted by logit (ties: lower id
// first), then one uniform draw walked down the kept weights in float32. The same seed picks the
// same token as upstream and as a literal scalar transcription of these rules.
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "sampling/bucket_collect.h"
#include "sampling/bucket_topp.h"

namespace ds4 {

struct SamplerParams {
    float temperature = 1.0f;
    int top_k = 0;
    float top_p = 1.0f;
    float min_p = 0.05f;
};

// The distribution one draw picks from: `count` candidates in walk order (ids, or token i itself
// when ids is null) with float32 weights summing (sequentially, in walk order) to `sum`. The
// weights are w, or (w null) exp_weights(x[i]) not yet evaluated (the whole vocabulary, or the
// min-p survivors, in id order). draw == false: no draw happens and the pick is `no_draw` (argmax, or a degenerate total).
struct Candidates {
    bool draw = false;
    int32_t no_draw = 0;
    int32_t after_walk = 0;     // the pick when rounding lets the walk run off the end (or kBestOnDemand)
    const int32_t* ids = nullptr;
    const float* w = nullptr;
    int64_t count = 0;
    float sum = 0.0f;
    const float* x = nullptr;
    const float* wa = nullptr;   // with x: approximations of those weights (binade_sum.h)
    // The whole vocabulary's weights straight from the logits (neither ids, w nor x): those of
    // the arguments fl(fl(logits[i] - m) / t), -inf where a logit is not finite.
    const float* logits = nullptr;
    float m = 0.0f, t = 1.0f, lowest = 0.0f;   // lowest: the smallest finite logit
    bool all_finite = false;
    float rcp_rel = 0.0f;   // not 0: the total took its approximations by reciprocal (binade_logit_total_rcp)
    // Every kept weight is exactly 1 (all finite logits equal; ids, or token i itself): sums are
    // integers, so the draw's walk is arithmetic.
    bool ones = false;
    // The kept tokens (count, sum; ids null) come from the bucket partition: its walk and weights.
    BucketTopP* buckets = nullptr;
    int32_t id(int64_t i) const { return ids ? ids[i] : (int32_t)i; }
};

// An after_walk that is the first index of the largest finite logit, found only when needed.
constexpr int32_t kBestOnDemand = -2;

// First index of the largest logit; NaN never wins; 0 when no logit exceeds -1e30 (upstream).
int32_t argmax_logits(const float* logits, int64_t n);

// The ids of the finite logits in the sorted branches' order (logit descending, equal logits by
// id ascending), through the same radix sort: for tests (tests/test_sampling.py).
std::vector<int32_t> sorted_finite_ids(const float* logits, int64_t n);

// Owns the scratch buffers (whole-vocabulary arrays are reused between calls); one per thread.
class Sampler {
public:
    // The candidates and weights the parameters select (valid until the next call).
    const Candidates& select(const float* logits, int64_t n, const SamplerParams& p);
    // One pick; consumes exactly one RNG draw when a draw happens, none otherwise.
    int32_t sample(const float* logits, int64_t n, const SamplerParams& p, uint64_t& rng_state);
    // The probability of every token under the draw (weight / sum; 1 at the pick when no draw
    // happens): probs gets n floats. Speculative sampling compares these for target and draft.
    void probabilities(const float* logits, int64_t n, const SamplerParams& p, float* probs);

private:
    void select_knobs(const float* a, int64_t n, const SamplerParams& p);   // select() but for best
    int32_t resolve_best(int32_t pick) const;   // kBestOnDemand: the first index of the largest finite logit
    struct BestOf {
        const float* a = nullptr;
        int64_t n = 0;
        float m = 0.0f;
    } best_of_;
    // A vector whose resize leaves new elements uninitialised (scratch filled right after).
    template <class T>
    struct NoInit : std::allocator<T> {
        template <class U> struct rebind { using other = NoInit<U>; };
        NoInit() = default;
        template <class U> NoInit(const NoInit<U>&) {}
        template <class U> void construct(U* p) { ::new ((void*)p) U; }
        template <class U, class... A> void construct(U* p, A&&... a) { ::new ((void*)p) U(std::forward<A>(a)...); }
    };
    template <class T> using Scratch = std::vector<T, NoInit<T>>;

    void select_full(const float* a, int64_t n, float t, float top_p, float min_p);
    // finite_max (the largest finite logit; n_finite, lowest), then every finite logit >=
    // *floor_out = fl(max - d) into packed_ (collect_prefix's words, ascending ids, on prefix_grid_);
    // *floor_out = -inf when none was
    // collected (no finite logit, or every finite logit within d: nothing to cut).
    float max_and_prefix(const float* a, int64_t n, float d, int64_t* n_finite, float* lowest, float* floor_out);
    void select_min_p(const float* a, int64_t n, float m, float lowest, bool all_finite, float t, float min_p);
    // The bucket partition's kept set (bucket_topp.h); false when it does not decide.
    bool select_buckets(const float* a, int64_t n, float m, float lowest, bool all_finite, float t, float total, float top_p);
    // The top-p prefix in packed_ (every finite logit >= floor) through the bucket partition;
    // false when too short for it or when the prefix does not hold the stop.
    bool select_prefix_buckets(const float* a, float m, float floor, float t, float total, float top_p);
    // packed_ = every finite logit >= floor (floor finite, below m: the largest finite logit) as
    // collect_prefix's words on prefix_grid_; unpack_packed: their ids and logits into ids_/vals_.
    void collect_packed(const float* a, int64_t n, float m, float floor, bool all_finite);
    void unpack_packed(const float* a);
    void keep_all_finite(const float* a, int64_t n, float m, float lowest, float t, bool all_finite);
    // All finite logits equal (n_finite of them, fewer than 2^24): every weight is exp(0) = 1.
    void select_equal(const float* a, int64_t n, int64_t n_finite, float top_p, float min_p);
    void select_top_k(const float* a, int64_t n, float t, int64_t k, float top_p, float min_p);
    // Keeps the prefix of the sorted candidates (ids_, weights w_) that min-p and top-p let
    // through; false when neither filter stopped inside the list.
    bool filter_sorted(float total, float top_p, float min_p, bool list_is_everything);
    void top_sorted(const float* a, int64_t n, int64_t m);   // ids_/vals_ = m best finite, sorted
    void weights_of_sorted(float m, float t);                 // w_ = exp_weights(fl(fl(vals_ - m) / t))
    void collect_logits_at_least(const float* a, int64_t n, float floor);   // ids_/vals_: finite, >= floor
    void sort_candidates(const float* a);                     // ids_/vals_ by logit desc, id asc

    Candidates c_;
    // probabilities() of the whole vocabulary: keep_all_finite writes the exact weights here and
    // sums them (instead of the approximate total a draw needs); null for sample().
    float* exact_into_ = nullptr;
    Scratch<float> x_, wall_, w_, vals_;
    Scratch<int32_t> ids_, tmp_ids_;
    Scratch<uint32_t> packed_;   // the top-p prefix collected after the max pass (max_and_prefix)
    PrefixGrid prefix_grid_;
    Scratch<uint64_t> keys_, tmp_keys_;
    std::vector<float> maxima_, chunk_sums_;
    std::vector<uint32_t> radix_count_;
    BucketTopP bucket_;   // high-temperature top-p (bucket_topp.h)
};

}  // namespace ds4
