// One pipeline stage's share of an inference timeline: the KV state of the stage's layers only,
// the tokens it has seen, and (last stage) the next-token logits and the MTP block's state. A
// coordinator (ds4.stages) chains stages and owns the timeline semantics (sync reuse, rewind,
// rebuilds); a stage only appends batches at its current position, resets, and saves or loads the
// part of the DSV4 payload that covers its layers. Not thread-safe; one caller at a time.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/model.h"
#include "backend/backend.h"
#include "engine/activations.h"
#include "engine/forward.h"
#include "state/kv_state.h"

namespace ds4 {

class StageSession {
public:
    StageSession(std::shared_ptr<const Model> model, int64_t ctx);

    int64_t pos() const { return (int64_t)tokens_.size(); }
    int64_t ctx() const { return kv_.ctx; }
    const Model& model() const { return *model_; }
    const std::vector<int32_t>& tokens() const { return tokens_; }
    // Floats forward() writes for a batch of n: n x hc_dim before the last stage, n_vocab on it.
    int64_t out_floats(int64_t n) const;

    // Appends tokens[0..n) at positions pos0 = pos() ... (a pos0 that differs from pos() is a
    // desynchronised coordinator: InvalidArgument). hc_in: the previous stage's n x hc_dim output
    // (null on the first stage). prefill: reset the frontier rows the current window has not
    // written, as Session::sync does at every chunk boundary (keeps payloads byte-identical).
    void forward(const int32_t* tokens, int64_t n, int64_t pos0, const float* hc_in, float* out, bool prefill);
    void reset();

    // A DSV4 payload over this stage's layers only (header layer count = the stage's layers; the
    // logits are zero before the last stage). ds4.payload merges the stages' parts into the
    // single-engine payload and splits one back.
    std::vector<uint8_t> save_payload() const;
    void load_payload(const uint8_t* data, size_t size);

    // Last stage with an MTP block: the draft logits for the token after next (see Session).
    const float* mtp_logits();
    int64_t kv_allocated_bytes() const { return kv_.allocated_bytes(); }

private:
    void check_usable() const;


    std::shared_ptr<const Model> model_;
    std::unique_ptr<backend::Stream> stream_;
    KvState kv_;
    Activations act_;
    std::vector<int32_t> tokens_;
    backend::OwnedTensor logits_;   // last stage: of the last token (n_vocab)
    backend::OwnedTensor last_hc_;  // last stage: final HC state of the last token (MTP input)
    KvState mtp_kv_;
    Activations mtp_act_;
    backend::OwnedTensor mtp_logits_;
    std::vector<float> logits_mirror_, mtp_mirror_;   // device-only backends
    int64_t mtp_pos_ = -1;
    bool hidden_valid_ = false;
    bool broken_ = false;           // a failed batch left partial rows behind: only reset() recovers
};

}  // namespace ds4
