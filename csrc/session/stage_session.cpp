#include "session/stage_session.h"

#include <algorithm>
#include <string>

#include "backend/timed_stream.h"
#include "common/errors.h"
#include "engine/forward.h"
#include "session/payload.h"

namespace ds4 {

namespace {
constexpr int64_t kKeepBatchScratch = 256;   // tokens of batch scratch kept between calls (as Session)
}  // namespace

StageSession::StageSession(std::shared_ptr<const Model> model, int64_t ctx) : model_(std::move(model)) {
    if (ctx < 2) fail(ErrorKind::InvalidArgument, "session context must be at least 2 tokens, got " + std::to_string(ctx));
    if (ctx > 0x7fffffff) fail(ErrorKind::InvalidArgument, "session context is too large: " + std::to_string(ctx));
    const Shape& s = model_->shape();
    backend::Backend& be = model_->backend();
    stream_ = backend::maybe_timed(be.new_stream());
    kv_.init(be, *stream_, s, ctx, model_->layer_begin(), model_->layer_end());
    tokens_.reserve((size_t)ctx);
    if (model_->last_stage()) {
        logits_ = backend::OwnedTensor(be, backend::DType::F32, s.n_vocab, 1);
        last_hc_ = backend::OwnedTensor(be, backend::DType::F32, s.hc_dim(), 1);
        if (model_->weights().mtp.present) {
            mtp_kv_.init(be, *stream_, mtp_state_shape(s), ctx);
            mtp_logits_ = backend::OwnedTensor(be, backend::DType::F32, s.n_vocab, 1);
        }
    }
}

int64_t StageSession::out_floats(int64_t n) const {
    return model_->last_stage() ? (int64_t)model_->shape().n_vocab : n * model_->shape().hc_dim();
}

void StageSession::check_usable() const {
    if (broken_) {
        fail(ErrorKind::InvalidArgument, "stage [" + std::to_string(model_->layer_begin()) + ", " +
                                             std::to_string(model_->layer_end()) +
                                             ") failed inside a batch; reset it and replay the timeline");
    }
}

void StageSession::forward(const int32_t* tokens, int64_t n, int64_t pos0, const float* hc_in, float* out,
                           bool prefill) {
    check_usable();
    if (n < 1) fail(ErrorKind::InvalidArgument, "a stage batch needs at least one token");
    if (pos0 != pos()) {
        fail(ErrorKind::InvalidArgument, "stage [" + std::to_string(model_->layer_begin()) + ", " +
                                             std::to_string(model_->layer_end()) + ") holds " + std::to_string(pos()) +
                                             " tokens, asked to continue at position " + std::to_string(pos0));
    }
    if (pos() + n >= ctx()) {
        fail(ErrorKind::ContextOverflow, "context is full: " + std::to_string(pos()) + " + " + std::to_string(n) +
                                             " tokens in a ctx of " + std::to_string(ctx()) + " (one slot stays free)");
    }
    // Input errors are refused before anything changes (a failure inside forward_stage is not).
    if (!model_->first_stage() && !hc_in) {
        fail(ErrorKind::InvalidArgument, "a stage after the first needs the previous stage's HC state");
    }
    const int32_t V = model_->shape().n_vocab;
    for (int64_t i = 0; i < n; ++i) {
        if (tokens[i] < 0 || tokens[i] >= V) {
            fail(ErrorKind::InvalidArgument, "token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                                                 " is outside the vocabulary [0, " + std::to_string(V) + ")");
        }
    }
    const bool last = model_->last_stage();
    try {
        forward_stage({*model_, *stream_, act_}, kv_, tokens, n, pos0, hc_in, last ? nullptr : out,
                      last ? *logits_ : backend::Tensor{}, last ? *last_hc_ : backend::Tensor{});
    } catch (...) {
        broken_ = true;
        throw;
    }
    tokens_.insert(tokens_.end(), tokens, tokens + n);
    if (last) {
        const float* l = backend::host_floats(*stream_, *logits_, logits_mirror_);
        std::copy(l, l + logits_->width(), out);
        hidden_valid_ = true;
    }
    if (prefill) kv_.finish_prefill(*stream_, pos());
    if (act_.rows > kKeepBatchScratch) {
        act_ = Activations();
        stream_ = backend::maybe_timed(model_->backend().new_stream());
    }
}

void StageSession::reset() {
    kv_.reset(*stream_);
    tokens_.clear();
    if (logits_) stream_->fill({*logits_, 0.0f});
    if (!mtp_kv_.layers.empty()) mtp_kv_.reset(*stream_);
    mtp_pos_ = -1;
    hidden_valid_ = false;
    broken_ = false;
}

std::vector<uint8_t> StageSession::save_payload() const {
    check_usable();
    // Before the last stage the payload's logits are zeros (a zero-filled buffer of n_vocab).
    backend::OwnedTensor zeros;
    if (!model_->last_stage()) zeros = backend::OwnedTensor(model_->backend(), backend::DType::F32, model_->shape().n_vocab, 1);
    std::vector<uint8_t> out;
    write_payload(*stream_, kv_, tokens_, model_->last_stage() ? *logits_ : *zeros, out);
    return out;
}

void StageSession::load_payload(const uint8_t* data, size_t size) {
    KvState fresh;
    fresh.init(model_->backend(), *stream_, model_->shape(), ctx(), model_->layer_begin(), model_->layer_end());
    std::vector<int32_t> toks;
    std::vector<float> logits;
    read_payload(*stream_, data, size, fresh, toks, logits);
    kv_ = std::move(fresh);
    tokens_ = std::move(toks);
    if (model_->last_stage()) stream_->upload(*logits_, logits.data(), (uint64_t)logits_->nbytes());
    if (!mtp_kv_.layers.empty()) mtp_kv_.reset(*stream_);
    mtp_pos_ = -1;
    hidden_valid_ = false;
    broken_ = false;
}

const float* StageSession::mtp_logits() {
    if (!model_->weights().mtp.present) fail(ErrorKind::Unsupported, "this stage has no MTP block loaded");
    check_usable();
    if (pos() == 0 || !hidden_valid_) {
        fail(ErrorKind::InvalidArgument, "MTP needs a token evaluated in this session (the hidden state is not saved in payloads)");
    }
    if (mtp_pos_ != pos()) {
        mtp_forward({*model_, *stream_, mtp_act_}, mtp_kv_, *last_hc_, tokens_.back(), pos() - 1, *mtp_logits_);
        mtp_pos_ = pos();
    }
    return backend::host_floats(*stream_, *mtp_logits_, mtp_mirror_);
}

}  // namespace ds4
