#include "session/session.h"

#include <algorithm>
#include <limits>
#include <string>

#include "backend/timed_stream.h"
#include "common/errors.h"
#include "engine/forward.h"
#include "sampling/sampler.h"
#include "session/payload.h"

namespace ds4 {

namespace {
constexpr int64_t kKeepBatchScratch = 256;   // tokens of batch scratch kept between calls
constexpr int64_t kMaxDraftSteps = 16;       // MTP draft chain length (upstream's cap)

// t holds at least rows rows of width floats (grown only).
void ensure_rows(backend::OwnedTensor& t, backend::Backend& be, int64_t width, int64_t rows) {
    if (!t || t->rows() < rows) t = backend::OwnedTensor(be, backend::DType::F32, width, rows);
}

// Top-1 minus top-2 logit, upstream's single pass (NaN never ranks; a maximum reached twice gives
// 0; with every logit -inf the result is NaN, which fails any margin test).
float logit_margin(const float* a, int64_t n) {
    float v0 = -std::numeric_limits<float>::infinity(), v1 = v0;
    for (int64_t i = 0; i < n; ++i) {
        const float v = a[i];
        if (v > v0) {
            v1 = v0;
            v0 = v;
        } else if (v > v1) {
            v1 = v;
        }
    }
    return v0 - v1;
}
}  // namespace

Session::Session(std::shared_ptr<const Model> model, int64_t ctx) : model_(std::move(model)) {
    if (ctx < 2) fail(ErrorKind::InvalidArgument, "session context must be at least 2 tokens, got " + std::to_string(ctx));
    if (ctx > 0x7fffffff) fail(ErrorKind::InvalidArgument, "session context is too large: " + std::to_string(ctx));
    if (!model_->first_stage() || !model_->last_stage()) {
        fail(ErrorKind::InvalidArgument, "this engine runs only layers [" + std::to_string(model_->layer_begin()) + ", " +
                                             std::to_string(model_->layer_end()) +
                                             ") of the model: chain it with the other stages (ds4.stages)");
    }
    backend::Backend& be = model_->backend();
    const Shape& s = model_->shape();
    stream_ = backend::maybe_timed(be.new_stream());
    kv_.init(be, *stream_, s, ctx);
    tokens_.reserve((size_t)ctx);   // the decode loop never reallocates the checkpoint
    logits_ = backend::OwnedTensor(be, backend::DType::F32, s.n_vocab, 1);
    last_hc_ = backend::OwnedTensor(be, backend::DType::F32, s.hc_dim(), 1);
    tap_.n_layer = s.n_layer;
    tap_.n_embd = s.n_embd;
    if (model_->weights().mtp.present) {
        mtp_kv_.init(be, *stream_, mtp_state_shape(s), ctx);
        mtp_logits_ = backend::OwnedTensor(be, backend::DType::F32, s.n_vocab, 1);
        mtp_hc_ = backend::OwnedTensor(be, backend::DType::F32, s.hc_dim(), 1);
    }
}

void Session::reset_mtp() {
    if (!mtp_kv_.layers.empty()) mtp_kv_.reset(*stream_);
    mtp_pos_ = -1;
    chain_steps_ = 0;
}

void Session::mtp_step0() {
    if (!model_->weights().mtp.present) fail(ErrorKind::Unsupported, "this engine has no MTP block loaded");
    materialize();
    if (pos() == 0 || !has_logits_ || !hidden_valid_) {
        fail(ErrorKind::InvalidArgument, "MTP needs a token evaluated in this session (the hidden state is not saved in payloads)");
    }
    if (mtp_pos_ != pos()) {
        mtp_forward({*model_, *stream_, mtp_act_}, mtp_kv_, *last_hc_, tokens_.back(), pos() - 1, *mtp_logits_,
                    *mtp_hc_);
        mtp_pos_ = pos();
    }
}

const float* Session::mtp_logits() {
    discard_pending();
    mtp_step0();
    return backend::host_floats(*stream_, *mtp_logits_, mtp_mirror_);
}

int32_t Session::mtp_top() { return argmax_logits(mtp_logits(), model_->shape().n_vocab); }

void Session::discard_pending() {
    if (pending_ == 0) return;
    verify_log_.rollback(*stream_, kv_, 0);
    pending_ = 0;
}

void Session::discard_chain() {
    if (chain_steps_ == 0) return;
    chain_log_.rollback(*stream_, mtp_kv_, 0);
    chain_steps_ = 0;
}

int64_t Session::max_verify() const {
    return std::max<int64_t>(0, std::min(kv_.raw_cap, ctx() - 1 - pos()));
}

void Session::verify(const int32_t* t, int64_t n) {
    discard_pending();
    check_tokens(t, n);
    materialize();
    if (n < 1 || n > max_verify()) {
        fail(ErrorKind::ContextOverflow, "cannot verify " + std::to_string(n) + " tokens at position " +
                                             std::to_string(pos()) + ": at most " + std::to_string(max_verify()) +
                                             " fit (raw window, one context slot stays free)");
    }
    const Shape& s = model_->shape();
    backend::Backend& be = model_->backend();
    ensure_rows(verify_logits_, be, s.n_vocab, n);
    ensure_rows(verify_hc_, be, s.hc_dim(), n);
    try {
        // Steering edits verified tokens as it edits decoded ones; the tap records only committed
        // work (eval/sync), not tokens that may be rolled back.
        const LayerHooks hooks{steering_.get(), nullptr};
        forward_verify(context(), kv_, t, n, pos(), verify_logits_->rows(0, n), verify_hc_->rows(0, n), verify_log_,
                       &hooks);
    } catch (...) {
        stale_ = true;   // rows of a partial batch: rebuild from the checkpoint on next use
        has_logits_ = false;
        throw;
    }
    verify_tokens_.assign(t, t + n);
    pending_ = n;
}

const float* Session::verify_logits(int64_t i) {
    if (i < 0 || i >= pending_) {
        fail(ErrorKind::InvalidArgument, "verified row " + std::to_string(i) + " is outside [0, " +
                                             std::to_string(pending_) + ")");
    }
    return backend::host_floats(*stream_, verify_logits_->row(i), verify_mirror_);
}

void Session::accept(int64_t c) {
    if (c < 0 || c > pending_) {
        fail(ErrorKind::InvalidArgument, "accept " + std::to_string(c) + " of " + std::to_string(pending_) +
                                             " verified tokens");
    }
    verify_log_.rollback(*stream_, kv_, c);
    pending_ = 0;
    if (c == 0) {
        discard_chain();
        return;
    }
    tokens_.insert(tokens_.end(), verify_tokens_.begin(), verify_tokens_.begin() + c);
    stream_->begin();
    stream_->copy({verify_logits_->row(c - 1), *logits_});
    stream_->copy({verify_hc_->row(c - 1), *last_hc_});
    stream_->end();
    has_logits_ = true;
    hidden_valid_ = true;
    // The chain's steps fed tokens pos0.., so the first c-1 of them saw committed tokens; the
    // next step 0 (from the last committed token's own hidden state) writes position pos()-1.
    if (chain_steps_ > 0) {
        chain_log_.rollback(*stream_, mtp_kv_, std::min(chain_steps_, c - 1));
        chain_steps_ = 0;
    }
    mtp_pos_ = -1;
}

int64_t Session::speculate_greedy(int32_t first, const int32_t* drafts, int64_t n_drafts) {
    check_tokens(&first, 1);
    discard_pending();
    materialize();
    const int64_t k = std::min(n_drafts, max_verify() - 1);
    if (k <= 0) {
        eval(first);
        return 1;
    }
    std::vector<int32_t> seq;
    seq.reserve((size_t)(k + 1));
    seq.push_back(first);
    seq.insert(seq.end(), drafts, drafts + k);
    verify(seq.data(), k + 1);
    const int64_t V = model_->shape().n_vocab;
    int64_t c = 1;
    while (c <= k && argmax_logits(verify_logits(c - 1), V) == drafts[c - 1]) ++c;
    accept(c);
    return c;
}

const float* Session::mtp_draft_step(int32_t token) {
    check_tokens(&token, 1);
    discard_pending();
    if (chain_steps_ == 0) {
        mtp_step0();
        backend::Backend& be = model_->backend();
        const Shape& s = model_->shape();
        chain_log_.capture(be, *stream_, mtp_kv_, pos(), std::min(kMaxDraftSteps, mtp_kv_.raw_cap));
        ensure_rows(chain_hc_, be, s.hc_dim(), 1);
        ensure_rows(chain_hc_next_, be, s.hc_dim(), 1);
        ensure_rows(chain_logits_, be, s.n_vocab, 1);
        stream_->copy({*mtp_hc_, *chain_hc_});
    }
    if (chain_steps_ >= chain_log_.size()) {
        fail(ErrorKind::InvalidArgument, "the MTP draft chain holds at most " + std::to_string(chain_log_.size()) +
                                             " steps per commit");
    }
    mtp_forward({*model_, *stream_, mtp_act_}, mtp_kv_, *chain_hc_, token, pos() + chain_steps_, *chain_logits_,
                *chain_hc_next_);
    std::swap(chain_hc_, chain_hc_next_);
    ++chain_steps_;
    return backend::host_floats(*stream_, *chain_logits_, chain_mirror_);
}

std::vector<int32_t> Session::mtp_drafts(int32_t first, int64_t n, int32_t stop_token, float min_margin) {
    discard_pending();
    discard_chain();
    std::vector<int32_t> out;
    int32_t tok = first;
    const int64_t V = model_->shape().n_vocab;
    for (int64_t i = 0; i < std::min(n, kMaxDraftSteps); ++i) {
        const float* logits = mtp_draft_step(tok);
        // "not >=" so that a NaN margin stops the chain too
        if (!(logit_margin(logits, V) >= min_margin)) break;
        const int32_t d = argmax_logits(logits, V);
        out.push_back(d);
        if (d == stop_token) break;
        tok = d;
    }
    return out;
}

const float* Session::last_hidden() { return backend::host_floats(*stream_, *last_hc_, hc_mirror_); }

void Session::check_tokens(const int32_t* t, int64_t n) const {
    const int64_t V = model_->shape().n_vocab;
    for (int64_t i = 0; i < n; ++i) {
        if (t[i] < 0 || t[i] >= V) {
            fail(ErrorKind::InvalidArgument, "token id " + std::to_string(t[i]) + " at index " + std::to_string(i) +
                                                 " is outside the vocabulary [0, " + std::to_string(V) + ")");
        }
    }
}

void Session::extend(const int32_t* t, int64_t n, const ChunkCallback& cb, bool rebuild, bool reset_frontier) {
    if (rebuild) {
        reset_mtp();
        kv_.reset(*stream_);
        tokens_.clear();
        has_logits_ = false;
        stale_ = false;
    }
    const int64_t chunk = model_->chunk_for(n);
    const LayerHooks hooks{steering_.get(), &tap_};
    int64_t done = 0;
    while (done < n) {
        const int64_t m = std::min(chunk, n - done);
        const int64_t pos0 = pos();
        try {
            forward_batch(context(), kv_, t + done, m, pos0, *logits_, *last_hc_, &hooks);
        } catch (...) {
            // A failure inside a chunk leaves rows of a partial chunk behind: rebuild from the
            // consistent checkpoint on next use.
            stale_ = true;
            has_logits_ = false;
            throw;
        }
        tokens_.insert(tokens_.end(), t + done, t + done + m);
        has_logits_ = true;
        hidden_valid_ = true;
        done += m;
        // A prefill (sync) leaves the frontier as upstream's prefill does, at every chunk
        // boundary: rows the current window has not written yet are reset. Numerically inert,
        // but it makes sync's state independent of how the prompt was split (rebuild, extend,
        // cancelled and resumed): a checkpoint taken from the progress callback equals a fresh
        // prefill of the same tokens byte for byte. Token-by-token eval leaves them, as upstream.
        if (reset_frontier) kv_.finish_prefill(*stream_, pos());
        if (cb) cb(done, n);
    }
    // A long prefill's batch buffers (GBs on Flash) are not kept for the decode that follows:
    // neither the activations nor the stream's private work memory.
    if (act_.rows > kKeepBatchScratch) {
        act_ = Activations();
        stream_ = backend::maybe_timed(model_->backend().new_stream());
    }
}

void Session::materialize() {
    if (!stale_) return;
    std::vector<int32_t> toks;
    toks.swap(tokens_);
    kv_.reset(*stream_);
    stale_ = false;
    has_logits_ = false;
    if (!toks.empty()) extend(toks.data(), (int64_t)toks.size(), nullptr, true, true);
}

const float* Session::logits() {
    discard_pending();
    materialize();
    return backend::host_floats(*stream_, *logits_, logits_mirror_);
}

int32_t Session::argmax() {
    discard_pending();
    materialize();
    if (!has_logits_) fail(ErrorKind::InvalidArgument, "the session has no logits yet: evaluate a token first");
    int32_t best = 0;
    stream_->argmax({*logits_, &best});
    return best;
}

void Session::check_decode_step(int32_t token) const {
    check_tokens(&token, 1);
    if (pos() + 1 >= ctx()) {
        fail(ErrorKind::ContextOverflow, "context is full: " + std::to_string(pos()) + " tokens in a ctx of " +
                                             std::to_string(ctx()) + " (one slot stays free)");
    }
}

void Session::eval(int32_t token) {
    check_decode_step(token);
    discard_pending();
    discard_chain();
    materialize();
    extend(&token, 1, nullptr, false, false);
}

void Session::eval_with_mtp(int32_t token) {
    if (!model_->weights().mtp.present) fail(ErrorKind::Unsupported, "this engine has no MTP block loaded");
    check_decode_step(token);
    discard_pending();
    discard_chain();
    materialize();
    const Shape& s = model_->shape();
    ensure_rows(head_rows_, model_->backend(), s.n_vocab, 2);
    const LayerHooks hooks{steering_.get(), &tap_};
    try {
        forward_decode_mtp(context(), {*model_, *stream_, mtp_act_}, kv_, mtp_kv_, token, pos(), *logits_, *last_hc_,
                           *mtp_logits_, *mtp_hc_, head_rows_->rows(0, 2), &hooks);
    } catch (...) {
        stale_ = true;   // as extend(): rebuild from the checkpoint on next use (that resets the MTP too)
        has_logits_ = false;
        mtp_pos_ = -1;
        throw;
    }
    tokens_.push_back(token);
    has_logits_ = true;
    hidden_valid_ = true;
    mtp_pos_ = pos();
}

int64_t Session::common_prefix(const std::vector<int32_t>& prompt) const {
    const size_t n = std::min(prompt.size(), tokens_.size());
    size_t i = 0;
    while (i < n && prompt[i] == tokens_[i]) ++i;
    return (int64_t)i;
}

void Session::sync(const std::vector<int32_t>& prompt, const ChunkCallback& cb) {
    const int64_t n = (int64_t)prompt.size();
    if (n == 0) fail(ErrorKind::InvalidArgument, "sync needs at least one token");
    if (n >= ctx()) {
        fail(ErrorKind::ContextOverflow, "prompt of " + std::to_string(n) + " tokens does not fit a context of " +
                                             std::to_string(ctx()) + " (at most ctx-1 tokens)");
    }
    check_tokens(prompt.data(), n);
    discard_pending();
    discard_chain();
    const int64_t common = common_prefix(prompt);
    // An empty timeline has no valid checkpoint to extend (upstream): a full prefill, whose
    // finishing frontier reset keeps saved payloads byte-comparable.
    if (!stale_ && pos() > 0 && common == pos()) {
        if (n > pos()) extend(prompt.data() + pos(), n - pos(), cb, false, true);
        return;
    }
    extend(prompt.data(), n, cb, true, true);
}

void Session::rewind(int64_t p) {
    if (p < 0 || p > pos()) {
        fail(ErrorKind::InvalidArgument, "rewind position " + std::to_string(p) + " is outside [0, " +
                                             std::to_string(pos()) + "]");
    }
    discard_pending();
    discard_chain();
    if (p == pos()) return;
    tokens_.resize((size_t)p);
    reset_mtp();
    stale_ = true;
    has_logits_ = false;
}

void Session::set_steering(std::shared_ptr<const Steering> steering) {
    if (steering) {
        const Shape& s = model_->shape();
        if (steering->n_layer != s.n_layer || steering->n_embd != s.n_embd) {
            fail(ErrorKind::InvalidArgument, "steering directions are " + std::to_string(steering->n_layer) + " x " +
                                                 std::to_string(steering->n_embd) + ", the model needs " +
                                                 std::to_string(s.n_layer) + " x " + std::to_string(s.n_embd));
        }
    }
    if (!steering && !steering_) return;
    steering_ = std::move(steering);
    if (pos() > 0) {
        reset_mtp();
        stale_ = true;
        has_logits_ = false;
    }
}

void Session::reset() {
    pending_ = 0;   // the whole state is cleared: nothing to roll back
    reset_mtp();
    kv_.reset(*stream_);
    tokens_.clear();
    stream_->fill({*logits_, 0.0f});
    has_logits_ = false;
    stale_ = false;
}

std::vector<uint8_t> Session::save_payload() {
    discard_pending();
    materialize();
    std::vector<uint8_t> out;
    write_payload(*stream_, kv_, tokens_, *logits_, out);
    return out;
}

int64_t Session::payload_size() {
    discard_pending();
    materialize();
    return payload_bytes(kv_, pos());
}

void Session::load_payload(const uint8_t* data, size_t size) {
    // Parse into a copy so a rejected payload leaves the session untouched.
    KvState fresh;
    fresh.init(model_->backend(), *stream_, model_->shape(), ctx());
    std::vector<int32_t> toks;
    std::vector<float> logits;
    read_payload(*stream_, data, size, fresh, toks, logits);
    pending_ = 0;   // the state is replaced wholesale
    kv_ = std::move(fresh);
    reset_mtp();
    hidden_valid_ = false;
    tokens_ = std::move(toks);
    stream_->upload(*logits_, logits.data(), (uint64_t)logits_->nbytes());
    has_logits_ = !tokens_.empty();
    stale_ = false;
}

}  // namespace ds4
