#include "engine/forward.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/errors.h"
#include "engine/cancel.h"
#include "layers/indexer.h"
#include "model/rope_params.h"
#include "state/kv_rollback.h"

namespace ds4 {

namespace {

// Attention runs token by token: a cancellation point every this many tokens (engine/cancel.h;
// a throw there is safe: CommandBatch waits for queued work as it unwinds).
constexpr int64_t kCancelTokenGroup = 64;

using backend::OwnedTensor;
using backend::Tensor;

// The first nb rows of an activation.
Tensor rows_of(const OwnedTensor& t, int64_t nb) { return t->rows(0, nb); }
// nb packed rows of `width` floats at the start of an activation allocated wider.
Tensor packed(const OwnedTensor& t, int64_t width, int64_t nb) { return t->span(0, width * nb).reshape(width); }

const TensorRef* optional(const TensorRef& t) { return t ? &t : nullptr; }

// Closes the stream's command batch on every exit from a forward pass.
class CommandBatch {
public:
    explicit CommandBatch(backend::Stream& st) : st_(st) { st_.begin(); }
    ~CommandBatch() { st_.end(); }
    CommandBatch(const CommandBatch&) = delete;
    CommandBatch& operator=(const CommandBatch&) = delete;

private:
    backend::Stream& st_;
};

// One compressor lane (attention or indexer) for the token at pos: store it in the frontier and,
// when it closes a window, pool the window into the next cache row.
struct CompressorLane {
    const CompressorWeights& w;
    const OwnedTensor& state_kv;
    const OwnedTensor& state_score;
    int64_t head_dim;
    bool fp8;
};

// log (a speculative batch) records the frontier row just stored; see attention_layer.
template <class PushSlot, class Log>
void compressor_token(const ForwardContext& fc, const Shape& s, const CompressorLane& lane, int ratio,
                      const RopeParams& rope, const Tensor& kv_cur, const Tensor& score_cur, int64_t pos,
                      PushSlot push_slot, Log log) {
    backend::Stream& st = fc.stream;
    st.compressor_store({&lane.w.ape, kv_cur, score_cur, *lane.state_kv, *lane.state_score, ratio, lane.head_dim, pos});
    log();
    if ((pos + 1) % ratio != 0) return;
    const Tensor row = fc.act.comp_row->span(0, lane.head_dim);
    st.compressor_pool({&lane.w.norm, *lane.state_kv, *lane.state_score, row, ratio, lane.head_dim, s.n_rot, s.rms_eps,
                        rope, pos + 1 - ratio, lane.fp8});
    if (ratio == 4) st.compressor_shift({*lane.state_kv, *lane.state_score, lane.head_dim});
    st.store_row_f16({row, push_slot()});
}

// Runs the steering edit and the activation tap (engine/layer_hooks.h) on nb rows of n_embd floats.
// They work on host memory: the rows go through a download (and, when edited, an upload back),
// which on the CPU backend is a memcpy; nothing happens without hooks.
void apply_hooks(const ForwardContext& fc, const LayerHooks* hooks, HookPoint p, int il, const Tensor& rows,
                 int64_t nb) {
    if (!hooks) return;
    thread_local std::vector<float> host;
    const int64_t E = fc.model.shape().n_embd;
    host.resize((size_t)(nb * E));
    const uint64_t bytes = (uint64_t)rows.nbytes();
    fc.stream.download(rows, host.data(), bytes);
    hooks->at(p, il, host.data(), nb);
    if (hooks->steering && hooks->steering->active(p)) fc.stream.upload(rows, host.data(), bytes);
}

// Attention sublayer of layer il of kv.shape (its ratio and RoPE), with weights L: hc -> hc_mid.
// log: where a speculative batch records the frontier rows it stores (null otherwise).
void attention_layer(const ForwardContext& fc, const LayerWeights& L, KvState& kv, int il, int64_t nb, int64_t pos0,
                     const LayerHooks* hooks = nullptr, const KvRollback* log = nullptr) {
    const Shape& s = kv.shape;
    const AttentionWeights& w = L.attn;
    backend::Stream& st = fc.stream;
    Activations& A = fc.act;
    const int64_t D = s.head_dim, I = s.indexer_head_dim;
    const int ratio = s.ratio(il);
    const RopeParams rope = rope_params_for_layer(s, il);

    st.hc_pre({&w.hc_attn_fn, &w.hc_attn_scale, &w.hc_attn_base, rows_of(A.hc, nb), rows_of(A.sub_in, nb),
               rows_of(A.hc_split, nb), s.n_hc, s.sinkhorn_iters, s.rms_eps, s.hc_eps});
    st.rms_norm({rows_of(A.sub_in, nb), rows_of(A.normed, nb), &w.attn_norm, s.rms_eps});

    const int64_t cw = Shape::coff(ratio) * D, icw = Shape::coff(ratio) * I;
    const Tensor comp_kv = packed(A.comp_kv, cw, nb), comp_score = packed(A.comp_score, cw, nb);
    const Tensor index_kv = packed(A.index_kv, icw, nb), index_score = packed(A.index_score, icw, nb);
    // Upper bound of the rows any token of this batch can see (one new row per 4 tokens at most),
    // from the live count so a loaded state with unusual counts is covered too.
    const bool need_indexer = ratio == 4 && indexer_needed(s, kv.layer(il).n_index_comp + (nb + 3) / 4);
    // Every projection of the normed input is one LinearGroup (the input prepared once per
    // activation type, docs/architecture.md); likewise the two of the normed low-rank query.
    backend::LinearGroupArgs from_normed(rows_of(A.normed, nb));
    from_normed.add(&w.attn_q_a, rows_of(A.q_low, nb)).add(&w.attn_kv, rows_of(A.kv_proj, nb));
    if (ratio != 0) from_normed.add(&L.comp.kv, comp_kv).add(&L.comp.gate, comp_score);
    if (ratio == 4) from_normed.add(&L.indexer.comp.kv, index_kv).add(&L.indexer.comp.gate, index_score);
    if (need_indexer) from_normed.add(&L.indexer.proj, rows_of(A.index_w, nb));
    st.linear_group(from_normed);
    st.rms_norm({rows_of(A.q_low, nb), rows_of(A.q_low_normed, nb), &w.attn_q_a_norm, s.rms_eps});
    backend::LinearGroupArgs from_q_low(rows_of(A.q_low_normed, nb));
    from_q_low.add(&w.attn_q_b, rows_of(A.q, nb));
    if (need_indexer) from_q_low.add(&L.indexer.q_b, rows_of(A.index_q, nb));
    st.linear_group(from_q_low);
    st.head_rms_norm({rows_of(A.q, nb), s.n_head, D, s.rms_eps});
    st.rms_norm({rows_of(A.kv_proj, nb), rows_of(A.kv_row, nb), &w.attn_kv_a_norm, s.rms_eps});

    // Row-wise steps that do not read the cache run over the whole batch.
    st.rope_tail({rows_of(A.q, nb), s.n_head, D, s.n_rot, pos0, rope, false});
    st.rope_tail({rows_of(A.kv_row, nb), 1, D, s.n_rot, pos0, rope, false});
    st.fp8_kv_roundtrip({rows_of(A.kv_row, nb), D, s.n_rot});

    LayerKv& C = kv.layer(il);
    const CompressorLane attn_lane{L.comp, C.attn_state_kv, C.attn_state_score, D, true};
    const CompressorLane index_lane{L.indexer.comp, C.index_state_kv, C.index_state_score, I, false};
    // The cache work of token b before its attention: its compressor lanes, then the indexer's
    // keep-mask over the rows it can see (written to `mask`, left empty when every row is visible).
    auto compress_and_index = [&](int64_t b, const Tensor& mask_row, Tensor& mask) {
        const int64_t pos = pos0 + b;
        if (ratio != 0) {
            compressor_token(fc, s, attn_lane, ratio, rope, comp_kv.row(b), comp_score.row(b), pos,
                             [&] { return kv.push_comp_slot(il); },
                             [&] { if (log) log->record(st, kv, il, 0, b); });
        }
        if (ratio == 4) {
            compressor_token(fc, s, index_lane, ratio, rope, index_kv.row(b), index_score.row(b), pos,
                             [&] { return kv.push_index_comp_slot(il); },
                             [&] { if (log) log->record(st, kv, il, 1, b); });
            if (indexer_needed(s, C.n_index_comp)) {
                if (!need_indexer) fail(ErrorKind::InvalidArgument, "internal: indexer inputs were not prepared");
                const int64_t n = C.n_index_comp;
                const Tensor scores = A.index_scores->span(0, n);
                mask = mask_row.span(0, n);
                st.indexer_scores({A.index_q->row(b), A.index_w->row(b), *C.index_comp, n, s.indexer_heads, I, s.n_rot,
                                   pos, rope, scores});
                st.top_k_mask({scores, n, s.indexer_top_k, mask});
            }
        }
    };
    const Tensor comp_rows = ratio != 0 ? *C.comp : Tensor{};
    if (nb > 1 && fc.model.backend().supports(backend::Op::AttentionBlock, GgmlType::F32)) {
        // Prefill: blocks of queries share each K/V row load (backend AttentionBlock). A block's own
        // rows are read from kv_row (f16-rounded in place, as the ring stores them) and pushed onto
        // the ring after its attention, so the ring still holds what the block's first query sees.
        st.store_row_f16({rows_of(A.kv_row, nb), rows_of(A.kv_row, nb)});
        for (int64_t b0 = 0; b0 < nb; b0 += Activations::kAttnBlock) {
            const int64_t n = std::min(Activations::kAttnBlock, nb - b0);
            int64_t n_comp[Activations::kAttnBlock];
            int64_t mask_first = n;   // the indexer starts masking at most once: never again unmasked
            for (int64_t k = 0; k < n; ++k) {
                if ((b0 + k) % kCancelTokenGroup == kCancelTokenGroup - 1) poll_cancel();   // engine/cancel.h
                Tensor mask;
                compress_and_index(b0 + k, A.index_mask->row(k), mask);
                n_comp[k] = ratio != 0 ? C.n_comp : 0;
                if (mask && mask_first == n) mask_first = k;
            }
            st.attention_block({A.q->rows(b0, n), *C.raw, kv.raw_cap, C.n_raw, C.raw_first(kv.raw_cap),
                                A.kv_row->rows(b0, n), comp_rows, n_comp,
                                mask_first < n ? A.index_mask->rows(0, n) : Tensor{}, A.index_mask->width(),
                                mask_first, &w.attn_sinks, s.n_head, D, A.heads->rows(b0, n)});
            for (int64_t k = 0; k < n; ++k) st.store_row_f16({A.kv_row->row(b0 + k), kv.push_raw_slot(il)});
        }
    } else {
        for (int64_t b = 0; b < nb; ++b) {
            if (b % kCancelTokenGroup == kCancelTokenGroup - 1) poll_cancel();   // engine/cancel.h
            st.store_row_f16({A.kv_row->row(b), kv.push_raw_slot(il)});
            Tensor mask;
            compress_and_index(b, A.index_mask->row(0), mask);
            st.attention({A.q->row(b), *C.raw, kv.raw_cap, C.n_raw, C.raw_first(kv.raw_cap), comp_rows,
                          ratio != 0 ? C.n_comp : 0, mask, &w.attn_sinks, s.n_head, D, A.heads->row(b)});
        }
    }
    st.rope_tail({rows_of(A.heads, nb), s.n_head, D, s.n_rot, pos0, rope, true});

    st.grouped_output_a({&w.attn_output_a, rows_of(A.heads, nb), rows_of(A.out_low, nb), s.n_out_group, s.o_lora_rank});
    st.linear({&w.attn_output_b, rows_of(A.out_low, nb), rows_of(A.attn_out, nb)});
    apply_hooks(fc, hooks, HookPoint::AttnOut, il, rows_of(A.attn_out, nb), nb);
    st.hc_post({rows_of(A.attn_out, nb), rows_of(A.hc, nb), rows_of(A.hc_split, nb), rows_of(A.hc_mid, nb), s.n_hc});
}

// FFN sublayer: hc_mid -> hc.
void ffn_layer(const ForwardContext& fc, const FfnWeights& w, const int32_t* tokens, int64_t nb, int il = 0,
               const LayerHooks* hooks = nullptr) {
    const Shape& s = fc.model.shape();
    backend::Stream& st = fc.stream;
    Activations& A = fc.act;

    st.hc_pre({&w.hc_ffn_fn, &w.hc_ffn_scale, &w.hc_ffn_base, rows_of(A.hc_mid, nb), rows_of(A.sub_in, nb),
               rows_of(A.hc_split, nb), s.n_hc, s.sinkhorn_iters, s.rms_eps, s.hc_eps});
    st.rms_norm({rows_of(A.sub_in, nb), rows_of(A.normed, nb), &w.ffn_norm, s.rms_eps});
    backend::LinearGroupArgs from_normed(rows_of(A.normed, nb));
    from_normed.add(&w.gate_inp, rows_of(A.router_logits, nb))
        .add(&w.gate_shexp, rows_of(A.shared_gate, nb))
        .add(&w.up_shexp, rows_of(A.shared_up, nb));
    st.linear_group(from_normed);
    st.swiglu({rows_of(A.shared_gate, nb), rows_of(A.shared_up, nb), rows_of(A.shared_mid, nb), s.swiglu_clamp, 1.0f});
    st.linear({&w.down_shexp, rows_of(A.shared_mid, nb), rows_of(A.shared_out, nb)});

    st.router({rows_of(A.router_logits, nb), tokens, optional(w.exp_probs_b), optional(w.tid2eid), s.n_expert,
               s.n_expert_used, s.expert_weights_scale, rows_of(A.expert_ids, nb), rows_of(A.expert_weights, nb)});
    st.routed_experts({&w.gate_exps, &w.up_exps, &w.down_exps, rows_of(A.normed, nb), rows_of(A.expert_ids, nb),
                       rows_of(A.expert_weights, nb), s.n_expert, s.n_expert_used, s.n_ff_exp, s.swiglu_clamp,
                       rows_of(A.ffn_out, nb)});
    st.add({rows_of(A.ffn_out, nb), rows_of(A.shared_out, nb), rows_of(A.ffn_out, nb)});
    apply_hooks(fc, hooks, HookPoint::FfnOut, il, rows_of(A.ffn_out, nb), nb);
    st.hc_post({rows_of(A.ffn_out, nb), rows_of(A.hc_mid, nb), rows_of(A.hc_split, nb), rows_of(A.hc, nb), s.n_hc});
}

void head_logits(const ForwardContext& fc, const OutputHeadWeights& head, const Tensor& hc, const Tensor& logits) {
    const Shape& s = fc.model.shape();
    const Tensor y = fc.act.head_in->row(0);
    fc.stream.hc_collapse_norm({&head.hc_fn, &head.hc_scale, &head.hc_base, &head.norm, hc, y, s.n_hc, s.rms_eps,
                                s.hc_eps});
    fc.stream.linear({&fc.model.weights().output, y, logits});
}

void check_token(const Shape& s, int32_t t) {
    if (t < 0 || t >= s.n_vocab) {
        fail(ErrorKind::InvalidArgument, "token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                             std::to_string(s.n_vocab) + ")");
    }
}

void prepare(const ForwardContext& fc, const KvState& kv, int64_t n) {
    int64_t max_comp = 0;
    for (const LayerKv& L : kv.layers) max_comp = std::max(max_comp, L.comp_cap);
    fc.act.ensure(fc.model.backend(), fc.model.shape(), n, max_comp);
    fc.stream.reserve({fc.model.shape().n_head, kv.raw_cap + max_comp});
}

}  // namespace

void output_logits(const ForwardContext& fc, const Tensor& hc, const Tensor& logits) {
    head_logits(fc, fc.model.weights().head, hc, logits);
}

namespace {

// The stage's checks, then its layers over the batch inside the open command batch (the
// embedding first on the first stage, else hc_in uploaded); leaves every token's HC state after
// the stage's last layer in act.hc. hooks: steering / tap (null: none). log: see attention_layer.
void run_layers(const ForwardContext& fc, KvState& kv, const int32_t* tokens, int64_t n, int64_t pos0,
                const float* hc_in, const LayerHooks* hooks, const KvRollback* log) {
    const Shape& s = fc.model.shape();
    const ModelWeights& W = fc.model.weights();
    const int l0 = fc.model.layer_begin(), l1 = fc.model.layer_end();
    if (kv.first_layer != l0 || kv.first_layer + (int)kv.layers.size() != l1) {
        fail(ErrorKind::InvalidArgument, "internal: KV state layers do not match the stage's layer range");
    }
    for (int64_t b = 0; b < n; ++b) check_token(s, tokens[b]);
    if (!fc.model.first_stage() && !hc_in) {
        fail(ErrorKind::InvalidArgument, "a stage after the first needs the previous stage's HC state");
    }
    const Tensor hc = rows_of(fc.act.hc, n);
    if (fc.model.first_stage()) {
        fc.stream.embed_tokens_hc({&W.token_embd, tokens, n, s.n_hc, hc});
    } else {
        fc.stream.upload(hc, hc_in, (uint64_t)hc.nbytes());
    }
    if (hooks && hooks->empty()) hooks = nullptr;
    if (hooks && hooks->tap) hooks->tap->begin_batch(pos0, n);
    for (int il = l0; il < l1; ++il) {
        attention_layer(fc, W.layers[il], kv, il, n, pos0, hooks, log);
        poll_cancel();   // a cancellation point between sublayers (engine/cancel.h)
        ffn_layer(fc, W.layers[il].ffn, tokens, n, il, hooks);
        poll_cancel();
    }
}

}  // namespace

void forward_stage(const ForwardContext& fc, KvState& kv, const int32_t* tokens, int64_t n, int64_t pos0,
                   const float* hc_in, float* hc_out, const Tensor& logits, const Tensor& final_hc,
                   const LayerHooks* hooks) {
    if (!fc.model.last_stage() && !hc_out) {
        fail(ErrorKind::InvalidArgument, "a stage before the last needs somewhere to put its HC state");
    }
    prepare(fc, kv, n);
    CommandBatch batch(fc.stream);
    run_layers(fc, kv, tokens, n, pos0, hc_in, hooks, nullptr);
    const Tensor hc = rows_of(fc.act.hc, n);
    if (!fc.model.last_stage()) {
        fc.stream.download(hc, hc_out, (uint64_t)hc.nbytes());
        return;
    }
    const Tensor last = fc.act.hc->row(n - 1);
    if (final_hc) fc.stream.copy({last, final_hc});
    if (logits) output_logits(fc, last, logits);
}

void forward_batch(const ForwardContext& fc, KvState& kv, const int32_t* tokens, int64_t n, int64_t pos0,
                   const Tensor& logits, const Tensor& final_hc, const LayerHooks* hooks) {
    forward_stage(fc, kv, tokens, n, pos0, nullptr, nullptr, logits, final_hc, hooks);
}

void forward_verify(const ForwardContext& fc, KvState& kv, const int32_t* tokens, int64_t n, int64_t pos0,
                    const Tensor& all_logits, const Tensor& all_hc, KvRollback& log, const LayerHooks* hooks) {
    if (!fc.model.first_stage() || !fc.model.last_stage()) {
        fail(ErrorKind::Unsupported, "speculative verification needs the whole model (not a pipeline stage)");
    }
    const Shape& s = fc.model.shape();
    const OutputHeadWeights& head = fc.model.weights().head;
    prepare(fc, kv, n);
    CommandBatch batch(fc.stream);
    log.capture(fc.model.backend(), fc.stream, kv, pos0, n);
    run_layers(fc, kv, tokens, n, pos0, nullptr, hooks, &log);
    backend::Stream& st = fc.stream;
    st.copy({rows_of(fc.act.hc, n), all_hc});
    // The head for every position: n collapsed rows, then one batched product (its rows equal
    // n single-row products, so each row is what decode computes).
    const Tensor ys = rows_of(fc.act.head_in, n);
    for (int64_t b = 0; b < n; ++b) {
        st.hc_collapse_norm({&head.hc_fn, &head.hc_scale, &head.hc_base, &head.norm, fc.act.hc->row(b), ys.row(b),
                             s.n_hc, s.rms_eps, s.hc_eps});
    }
    st.linear({&fc.model.weights().output, ys, all_logits});
}

Shape mtp_state_shape(const Shape& s) {
    Shape m = s;
    m.n_layer = 1;
    m.compress_ratios = {0};
    return m;
}

namespace {

// The MTP block up to its output head, inside the caller's command batch: leaves the block's HC
// output in fc.act.hc row 0.
void mtp_block(const ForwardContext& fc, KvState& mtp_kv, const Tensor& hprev, int32_t token, int64_t pos) {
    const Shape& s = fc.model.shape();
    const ModelWeights& W = fc.model.weights();
    const MtpWeights& M = W.mtp;
    backend::Stream& st = fc.stream;
    Activations& A = fc.act;
    const int64_t E = s.n_embd;
    const Tensor x = A.sub_in->row(0), e = A.normed->row(0), h = A.attn_out->row(0);
    st.embed_tokens_hc({&W.token_embd, &token, 1, 1, *A.mtp_embed});
    st.rms_norm({*A.mtp_embed, x, &M.enorm, s.rms_eps});
    st.linear({&M.e_proj, x, e});
    for (int k = 0; k < s.n_hc; ++k) {
        st.rms_norm({hprev.span(k * E, E), x, &M.hnorm, s.rms_eps});
        st.linear({&M.h_proj, x, h});
        st.add({e, h, A.hc->row(0).span(k * E, E)});
    }
    // The draft block is not steered: steering directions are per main-model layer.
    attention_layer(fc, M.block, mtp_kv, 0, 1, pos);
    ffn_layer(fc, M.block.ffn, &token, 1);
}

void check_mtp(const ForwardContext& fc, int32_t token) {
    if (!fc.model.weights().mtp.present) fail(ErrorKind::Unsupported, "this model has no MTP block loaded");
    check_token(fc.model.shape(), token);
}

}  // namespace

void mtp_forward(const ForwardContext& fc, KvState& mtp_kv, const Tensor& hprev, int32_t token, int64_t pos,
                 const Tensor& logits, const Tensor& hc_out) {
    check_mtp(fc, token);
    prepare(fc, mtp_kv, 1);
    CommandBatch batch(fc.stream);
    mtp_block(fc, mtp_kv, hprev, token, pos);
    const Tensor out = fc.act.hc->row(0);
    if (hc_out) fc.stream.copy({out, hc_out});
    head_logits(fc, fc.model.weights().mtp.head, out, logits);
}

void forward_decode_mtp(const ForwardContext& fc, const ForwardContext& mtp_fc, KvState& kv, KvState& mtp_kv,
                        int32_t token, int64_t pos, const Tensor& logits, const Tensor& final_hc,
                        const Tensor& mtp_logits, const Tensor& mtp_hc, const Tensor& head_rows,
                        const LayerHooks* hooks) {
    if (!fc.model.first_stage() || !fc.model.last_stage()) {
        fail(ErrorKind::Unsupported, "the fused MTP step needs the whole model (not a pipeline stage)");
    }
    check_mtp(mtp_fc, token);
    const Shape& s = fc.model.shape();
    const ModelWeights& W = fc.model.weights();
    prepare(fc, kv, 2);   // two head rows
    prepare(mtp_fc, mtp_kv, 1);
    CommandBatch batch(fc.stream);
    backend::Stream& st = fc.stream;
    run_layers(fc, kv, &token, 1, pos, nullptr, hooks, nullptr);
    const Tensor last = fc.act.hc->row(0);
    st.copy({last, final_hc});
    mtp_block(mtp_fc, mtp_kv, last, token, pos);
    const Tensor draft = mtp_fc.act.hc->row(0);
    st.copy({draft, mtp_hc});
    if (!fc.model.backend().batched_rows_exact()) {   // two one-row products: decode's bits
        head_logits(fc, W.head, last, logits);
        head_logits(mtp_fc, W.mtp.head, draft, mtp_logits);
        return;
    }
    const Tensor ys = rows_of(fc.act.head_in, 2);
    const OutputHeadWeights& head = W.head;
    const OutputHeadWeights& mhead = W.mtp.head;
    st.hc_collapse_norm({&head.hc_fn, &head.hc_scale, &head.hc_base, &head.norm, last, ys.row(0), s.n_hc, s.rms_eps,
                         s.hc_eps});
    st.hc_collapse_norm({&mhead.hc_fn, &mhead.hc_scale, &mhead.hc_base, &mhead.norm, draft, ys.row(1), s.n_hc,
                         s.rms_eps, s.hc_eps});
    st.linear({&W.output, ys, head_rows});
    st.copy({head_rows.row(0), logits});
    st.copy({head_rows.row(1), mtp_logits});
}

}  // namespace ds4
