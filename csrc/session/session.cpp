#include "session/session.h"

#include <algorithm>
#include <string>

#include "common/errors.h"
#include "engine/forward.h"
#include "session/payload.h"

namespace ds4 {

namespace {
constexpr int64_t kKeepBatchScratch = 256;   // tokens of batch scratch kept between calls
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
    stream_ = be.new_stream();
    kv_.init(be, *stream_, s, ctx);
    tokens_.reserve((size_t)ctx);   // the decode loop never reallocates the checkpoint
    logits_ = backend::OwnedTensor(be, backend::DType::F32, s.n_vocab, 1);
    last_hc_ = backend::OwnedTensor(be, backend::DType::F32, s.hc_dim(), 1);
    if (model_->weights().mtp.present) {
        mtp_kv_.init(be, *stream_, mtp_state_shape(s), ctx);
        mtp_logits_ = backend::OwnedTensor(be, backend::DType::F32, s.n_vocab, 1);
    }
}

void Session::reset_mtp() {
    if (!mtp_kv_.layers.empty()) mtp_kv_.reset(*stream_);
    mtp_pos_ = -1;
}

const float* Session::mtp_logits() {
    if (!model_->weights().mtp.present) fail(ErrorKind::Unsupported, "this engine has no MTP block loaded");
    materialize();
    if (pos() == 0 || !has_logits_ || !hidden_valid_) {
        fail(ErrorKind::InvalidArgument, "MTP needs a token evaluated in this session (the hidden state is not saved in payloads)");
    }
    if (mtp_pos_ != pos()) {
        mtp_forward({*model_, *stream_, mtp_act_}, mtp_kv_, *last_hc_, tokens_.back(), pos() - 1, *mtp_logits_);
        mtp_pos_ = pos();
    }
    return backend::host_floats(*stream_, *mtp_logits_, mtp_mirror_);
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
    int64_t done = 0;
    while (done < n) {
        const int64_t m = std::min(chunk, n - done);
        const int64_t pos0 = pos();
        try {
            forward_batch(context(), kv_, t + done, m, pos0, *logits_, *last_hc_);
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
        stream_ = model_->backend().new_stream();
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
    materialize();
    return backend::host_floats(*stream_, *logits_, logits_mirror_);
}

int32_t Session::argmax() {
    materialize();
    if (!has_logits_) fail(ErrorKind::InvalidArgument, "the session has no logits yet: evaluate a token first");
    int32_t best = 0;
    stream_->argmax({*logits_, &best});
    return best;
}

void Session::eval(int32_t token) {
    check_tokens(&token, 1);
    if (pos() + 1 >= ctx()) {
        fail(ErrorKind::ContextOverflow, "context is full: " + std::to_string(pos()) + " tokens in a ctx of " +
                                             std::to_string(ctx()) + " (one slot stays free)");
    }
    materialize();
    extend(&token, 1, nullptr, false, false);
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
    if (p == pos()) return;
    tokens_.resize((size_t)p);
    reset_mtp();
    stale_ = true;
    has_logits_ = false;
}

void Session::reset() {
    reset_mtp();
    kv_.reset(*stream_);
    tokens_.clear();
    stream_->fill({*logits_, 0.0f});
    has_logits_ = false;
    stale_ = false;
}

std::vector<uint8_t> Session::save_payload() {
    materialize();
    std::vector<uint8_t> out;
    write_payload(*stream_, kv_, tokens_, *logits_, out);
    return out;
}

int64_t Session::payload_size() {
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
    kv_ = std::move(fresh);
    reset_mtp();
    hidden_valid_ = false;
    tokens_ = std::move(toks);
    stream_->upload(*logits_, logits.data(), (uint64_t)logits_->nbytes());
    has_logits_ = !tokens_.empty();
    stale_ = false;
}

}  // namespace ds4
