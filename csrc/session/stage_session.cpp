#include "session/stage_session.h"

#include <algorithm>
#include <string>

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
    kv_.init(s, ctx, model_->layer_begin(), model_->layer_end());
    tokens_.reserve((size_t)ctx);
    if (model_->last_stage()) {
        logits_.assign((size_t)s.n_vocab, 0.0f);
        last_hc_.assign((size_t)s.hc_dim(), 0.0f);
        if (model_->weights().mtp.present) {
            mtp_kv_.init(mtp_state_shape(s), ctx);
            mtp_logits_.assign((size_t)s.n_vocab, 0.0f);
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
        forward_stage(*model_, kv_, scratch_, tokens, n, pos0, hc_in, last ? nullptr : out,
                      last ? logits_.data() : nullptr, last ? last_hc_.data() : nullptr);
    } catch (...) {
        broken_ = true;
        throw;
    }
    tokens_.insert(tokens_.end(), tokens, tokens + n);
    if (last) {
        std::copy(logits_.begin(), logits_.end(), out);
        hidden_valid_ = true;
    }
    if (prefill) kv_.finish_prefill(pos());
    if (scratch_.tokens > kKeepBatchScratch) scratch_ = Scratch();
}

void StageSession::reset() {
    kv_.reset();
    tokens_.clear();
    std::fill(logits_.begin(), logits_.end(), 0.0f);
    if (!mtp_kv_.layers.empty()) mtp_kv_.reset();
    mtp_pos_ = -1;
    hidden_valid_ = false;
    broken_ = false;
}

std::vector<uint8_t> StageSession::save_payload() const {
    check_usable();
    std::vector<float> zeros;
    const float* logits = logits_.data();
    if (!model_->last_stage()) {
        zeros.assign((size_t)model_->shape().n_vocab, 0.0f);
        logits = zeros.data();
    }
    std::vector<uint8_t> out;
    write_payload(kv_, tokens_, logits, out);
    return out;
}

void StageSession::load_payload(const uint8_t* data, size_t size) {
    KvState fresh;
    fresh.init(model_->shape(), ctx(), model_->layer_begin(), model_->layer_end());
    std::vector<int32_t> toks;
    std::vector<float> logits;
    read_payload(data, size, fresh, toks, logits);
    kv_ = std::move(fresh);
    tokens_ = std::move(toks);
    if (model_->last_stage()) std::copy(logits.begin(), logits.end(), logits_.begin());
    if (!mtp_kv_.layers.empty()) mtp_kv_.reset();
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
        mtp_forward(*model_, mtp_kv_, mtp_scratch_, last_hc_.data(), tokens_.back(), pos() - 1, mtp_logits_.data(),
                    nullptr);
        mtp_pos_ = pos();
    }
    return mtp_logits_.data();
}

}  // namespace ds4
