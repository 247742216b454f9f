// One inference timeline (docs/runtime.md §4): the checkpoint tokens whose KV state is live, that
// state, and the logits for the next token. Not thread-safe; one caller at a time.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "engine/forward.h"
#include "engine/layer_hooks.h"
#include "engine/model.h"
#include "backend/backend.h"
#include "engine/activations.h"
#include "state/kv_rollback.h"
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
    // eval(token), then MTP step 0 at the new position (what mtp_logits() would compute next) in
    // the same pass, the two output heads sharing one read of the head's weights
    // (forward_decode_mtp). Leaves exactly the state eval() then mtp_logits() leaves.
    void eval_with_mtp(int32_t token);
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

    // Directional steering for every later evaluation (null: off). The live state was computed
    // under the previous setting, so a non-empty timeline is rebuilt on next use.
    void set_steering(std::shared_ptr<const Steering> steering);
    const std::shared_ptr<const Steering>& steering() const { return steering_; }
    // The activation tap: set points (hook_bit mask, 0 = off) and read/clear what it recorded.
    ActivationTap& tap() { return tap_; }
    // ---- speculative decoding (docs/speculative.md) ---------------------------------------------
    // Evaluates tokens[0..n) at pos() in one batched pass and keeps every position's logits; the
    // timeline grows only on accept(). n is at most max_verify(). Any other call discards a
    // pending verification (as accept(0)).
    void verify(const int32_t* t, int64_t n);
    int64_t max_verify() const;                   // min(raw window, room left before ctx-1)
    int64_t verified() const { return pending_; }  // tokens of the pending verification
    const float* verify_logits(int64_t i);        // logits after t[0..i] (n_vocab floats)
    // Commits the first c verified tokens (0 <= c <= n): the state, logits and hidden state are
    // exactly those eval() of the same tokens leaves; the rest is rolled back, and so are the MTP
    // draft rows past the accepted ones.
    void accept(int64_t c);
    // Greedy speculation: verifies [first, drafts...] and commits first plus the longest prefix
    // of the drafts that greedy decode picks (upstream's argmax). Returns the tokens committed
    // (>= 1). Drafts beyond max_verify() are dropped; with none left it is eval(first).
    int64_t speculate_greedy(int32_t first, const int32_t* drafts, int64_t n_drafts);

    // MTP draft chain for the tokens after `first` (the token about to be committed): each step
    // feeds the previous step's HC output and token (docs/model.md's convention, upstream's chain).
    // mtp_draft_step(token) runs the next step and returns its draft logits; the first call after
    // a commit starts from the last committed token's hidden state with token = first.
    const float* mtp_draft_step(int32_t token);
    // n greedy drafts (argmax of each step), stopping after a draft equal to stop_token (>= 0)
    // and before the first draft whose logit margin (top-1 minus top-2 of its step's logits) is
    // below min_margin: upstream's --mtp-margin confidence gate (docs/speculative.md, "Policy").
    std::vector<int32_t> mtp_drafts(int32_t first, int64_t n, int32_t stop_token = -1,
                                    float min_margin = -std::numeric_limits<float>::infinity());
    // Step 0's greedy draft: the MTP block's guess of the token about to be committed (upstream
    // checks it against the target's choice before drafting further).
    int32_t mtp_top();

private:
    void check_tokens(const int32_t* t, int64_t n) const;
    void check_decode_step(int32_t token) const;  // a valid token and a free slot for it
    void extend(const int32_t* t, int64_t n, const ChunkCallback& cb, bool rebuild, bool reset_frontier);
    void materialize();
    void reset_mtp();
    void discard_pending();  // rolls a pending verification back (accept(0))
    void discard_chain();    // drops the draft chain's rows from the MTP window
    void mtp_step0();        // the MTP step from the last committed token (cached per position)

    ForwardContext context() { return {*model_, *stream_, act_}; }

    std::shared_ptr<const Model> model_;
    std::shared_ptr<const Steering> steering_;
    ActivationTap tap_;
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
    backend::OwnedTensor mtp_hc_;   // HC output of that step (the draft chain's first input)
    // Pending verification: its rollback record, per-position logits and HC states (raw_cap rows).
    KvRollback verify_log_;
    backend::OwnedTensor verify_logits_, verify_hc_;
    backend::OwnedTensor head_rows_;   // eval_with_mtp's two head rows (target, MTP step 0)
    std::vector<float> verify_mirror_;
    std::vector<int32_t> verify_tokens_;
    int64_t pending_ = 0;
    // Draft chain since the last commit: rows it added to the MTP window, and the HC to continue from.
    KvRollback chain_log_;
    backend::OwnedTensor chain_hc_, chain_hc_next_, chain_logits_;
    std::vector<float> chain_mirror_;
    int64_t chain_steps_ = 0;
    bool hidden_valid_ = false;     // last_hc_ belongs to the last token (not after a payload load)
    bool has_logits_ = false;
    bool stale_ = false;     // tokens_ is behind the state (after rewind): rebuild before use
};

}  // namespace ds4
