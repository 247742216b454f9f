// One inference timeline (docs/runtime.md §4): the checkpoint tokens whose KV state is live, that
// state, and the logits for the next token. Not thread-safe; one caller at a time.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/forward.h"
#include "engine/model.h"
#include "backend/backend.h"
#include "engine/activations.h"
#include "state/kv_state.h"

namespace ds4 {

class Session {
public:
    // Called after every prefill chunk with (tokens done, total); the state is consistent there
    // (pos() == tokens done), so the callback may throw to cancel.
    using ChunkCallback = std::function<void(int64_t, int64_t)>;

    Session(std::shared_ptr<const Model> model, int64_t ctx);

    int64_t pos() const { return (int64_t)tokens_.size(); }
    int64_t ctx() const { return kv_.ctx; }
    const std::vector<int32_t>& tokens() const { return tokens_; }
    const Model& model() const { return *model_; }

    // Logits for the next token (n_vocab floats). The buffer never moves.
    const float* logits();
    bool has_logits() const { return has_logits_; }
    int32_t argmax();

    // Appends one token at pos() (ContextOverflow if pos()+1 >= ctx; the session is unchanged).
    void eval(int32_t token);
    // Brings the live state to exactly `prompt` (0 < len < ctx): reuses the checkpoint when it is
    // a prefix, else rebuilds with a chunked layer-major prefill.
    void sync(const std::vector<int32_t>& prompt, const ChunkCallback& cb = nullptr);
    // Truncates the timeline to pos tokens; the state is rebuilt lazily on the next use.
    void rewind(int64_t pos);
    void reset();
    // Length of the common prefix of the checkpoint and prompt.
    int64_t common_prefix(const std::vector<int32_t>& prompt) const;

    std::vector<uint8_t> save_payload();
    void load_payload(const uint8_t* data, size_t size);
    int64_t payload_size();

    const KvState& kv() const { return kv_; }
    int64_t kv_allocated_bytes() const { return kv_.allocated_bytes(); }

    // MTP draft logits for the token after next: one MTP step from the last evaluated token and
    // its final HC state, computed once per position (needs MTP weights; the MTP window gets a
    // row per step taken).
    const float* mtp_logits();

    // Final HC state of the last evaluated token (hc_dim floats; MTP input).
    const float* last_hidden();

private:
    void check_tokens(const int32_t* t, int64_t n) const;
    void extend(const int32_t* t, int64_t n, const ChunkCallback& cb, bool rebuild, bool reset_frontier);
    void materialize();
    void reset_mtp();

    ForwardContext context() { return {*model_, *stream_, act_}; }

    std::shared_ptr<const Model> model_;
    std::unique_ptr<backend::Stream> stream_;
    KvState kv_;
    Activations act_;
    std::vector<int32_t> tokens_;
    backend::OwnedTensor logits_;   // n_vocab
    backend::OwnedTensor last_hc_;  // hc_dim
    KvState mtp_kv_;
    Activations mtp_act_;
    backend::OwnedTensor mtp_logits_;
    std::vector<float> logits_mirror_, hc_mirror_, mtp_mirror_;   // device-only backends
    int64_t mtp_pos_ = -1;          // position whose draft mtp_logits_ holds
    bool hidden_valid_ = false;     // last_hc_ belongs to the last token (not after a payload load)
    bool has_logits_ = false;
    bool stale_ = false;     // tokens_ is behind the state (after rewind): rebuild before use
};

}  // namespace ds4
