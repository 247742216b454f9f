// Cutting a KV state back to a prefix of the batch just evaluated (speculative decoding,
// docs/speculative.md). Before the batch, capture() saves what the batch can overwrite: every
// layer's row counts, the raw-ring slots it will reuse and the compressor-frontier rows it can
// touch. During the batch the graph hands record() each frontier row right after the token's
// compressor_store. After it, rollback(c) leaves exactly the state that evaluating only the first
// c tokens leaves: counts as after c tokens, the other slots and rows restored, and the first c
// tokens' frontier writes replayed (the stored rows, plus compressor_shift where a ratio-4 window
// closed). Rows past the live counts are dead (nothing reads or serialises them), so compressed
// rows need no copy. Everything moves through backend tensors and stream ops (copy,
// compressor_shift): it runs on any backend.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "state/kv_state.h"

namespace ds4 {

class KvRollback {
public:
    // A batch of n tokens at positions pos0.. is about to run on kv (n <= kv.raw_cap). Queues the
    // saving copies on st (buffers are allocated on be, grown only).
    void capture(backend::Backend& be, backend::Stream& st, const KvState& kv, int64_t pos0, int64_t n);
    // Batch token b of layer il (model-wide index) has just stored its frontier row in lane 0
    // (attention) or 1 (indexer) of kv: log it.
    void record(backend::Stream& st, const KvState& kv, int il, int lane, int64_t b) const;
    // Keeps the first c tokens of the batch (0 <= c <= n).
    void rollback(backend::Stream& st, KvState& kv, int64_t c) const;

    int64_t pos0() const { return pos0_; }
    int64_t size() const { return n_; }

private:
    struct Lane {
        int ratio = 0;
        int64_t head_dim = 0;
        backend::OwnedTensor kv, score;          // saved rows: the whole ratio-4 frontier, or the
                                                 // ratio-128 rows of the batch's positions
        backend::OwnedTensor log_kv, log_score;  // row b: what batch token b stored
    };
    struct Layer {
        int64_t n_raw = 0, raw_next = 0, n_comp = 0, n_index_comp = 0;
        backend::OwnedTensor raw;                // the n raw slots from raw_next on, before the batch
        Lane lanes[2];
    };
    void restore_lane(backend::Stream& st, const Lane& ln, const backend::Tensor& skv, const backend::Tensor& ssc,
                      int64_t c) const;

    int64_t pos0_ = 0, n_ = 0;
    std::vector<Layer> layers_;
};

}  // namespace ds4
