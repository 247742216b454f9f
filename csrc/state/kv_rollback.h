// Cutting a KV state back to a prefix of the batch just evaluated (speculative decoding,
// docs/speculative.md). Before the batch, capture() saves what the batch can overwrite: every
// layer's row counts, the raw-ring slots it will reuse and the compressor-frontier rows it can
// touch. During the batch the forward pass hands record() each frontier row it writes. After it,
// rollback(c) leaves exactly the state that evaluating only the first c tokens leaves: counts as
// after c tokens, the other slots and rows restored, and the first c tokens' frontier writes
// replayed (frontier_store, the compressor's own update). Rows past the live counts are dead
// (nothing reads or serialises them), so compressed rows need no copy.
#pragma once
#include <cstdint>
#include <vector>

#include "state/kv_state.h"

namespace ds4 {

class KvRollback {
public:
    // A batch of n tokens at positions pos0.. is about to run on kv (n <= kv.raw_cap).
    void capture(const KvState& kv, int64_t pos0, int64_t n);
    // Frontier row (width floats of kv and of score) written by batch token b in layer il;
    // lane 0 is attention, 1 the indexer.
    void record(int il, int lane, int64_t b, const float* kv_row, const float* score_row, int64_t width);
    // Keeps the first c tokens of the batch (0 <= c <= n).
    void rollback(KvState& kv, int64_t c) const;

    int64_t pos0() const { return pos0_; }
    int64_t size() const { return n_; }

private:
    struct Lane {
        int ratio = 0;
        int64_t width = 0;
        std::vector<float> kv, score;          // saved rows: the whole ratio-4 frontier, or the
                                               // ratio-128 rows of the batch's positions
        std::vector<float> log_kv, log_score;  // n rows each: what batch token b wrote
    };
    struct Layer {
        int64_t n_raw = 0, raw_next = 0, n_comp = 0, n_index_comp = 0;
        std::vector<float> raw;                // the n raw slots from raw_next on, before the batch
        Lane lanes[2];
    };
    void restore_lane(const Lane& L, std::vector<float>& skv, std::vector<float>& ssc, int64_t c) const;

    int64_t pos0_ = 0, n_ = 0;
    std::vector<Layer> layers_;
};

}  // namespace ds4
