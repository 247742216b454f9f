// The DS4 forward pass, written once against the backend interface (backend/backend.h): a batch
// of consecutive tokens, layer-major. Projections run over the whole batch, while the cache
// pushes, compressors, indexer and attention run token by token in position order exactly like
// one-token decode. Decode is the batch of one.
#pragma once
#include <cstdint>

#include "backend/backend.h"
#include "engine/activations.h"
#include "engine/layer_hooks.h"
#include "engine/model.h"
#include "state/kv_state.h"

namespace ds4 {

// What a forward pass runs on: the model, a stream of its backend, and the session's activations.
struct ForwardContext {
    const Model& model;
    backend::Stream& stream;
    Activations& act;
};

// Evaluates tokens[0..n) at positions pos0.. into kv (the whole model). If logits is non-empty,
// writes the logits of the last token there (n_vocab floats). If final_hc is non-empty, copies the
// last token's final HC state there (hc_dim floats; MTP input).
// hooks (optional): steering and activation tap at each layer's attention and FFN outputs
// (engine/layer_hooks.h; the MTP block never gets them).
void forward_batch(const ForwardContext& fc, KvState& kv, const int32_t* tokens, int64_t n, int64_t pos0,
                   const backend::Tensor& logits, const backend::Tensor& final_hc = {},
                   const LayerHooks* hooks = nullptr);

class KvRollback;

// The verification pass of speculative decoding: forward_batch over tokens[0..n) that also writes
// every position's logits (n rows of n_vocab into all_logits) and final HC state (n rows of hc_dim
// into all_hc), and fills `log` so the session can keep any prefix of the batch (KvRollback).
// Whole model only (not a pipeline stage). hooks: as forward_batch (steering applies to the
// verified tokens exactly as to decoded ones).
void forward_verify(const ForwardContext& fc, KvState& kv, const int32_t* tokens, int64_t n, int64_t pos0,
                    const backend::Tensor& all_logits, const backend::Tensor& all_hc, KvRollback& log,
                    const LayerHooks* hooks = nullptr);

// One pipeline stage (the model's layer range) over the same batch. The first stage embeds
// `tokens`; a later one starts from hc_in, the previous stage's output (n x hc_dim host floats,
// uploaded). Every stage needs the token ids too: hash-routed layers pick experts by token. A
// stage before the last downloads the HC state after its last layer to hc_out (n x hc_dim host
// floats); the last stage writes logits and final_hc as forward_batch does. Chained stages compute
// exactly what forward_batch computes: the HC state is the only tensor crossing a stage boundary.
void forward_stage(const ForwardContext& fc, KvState& kv, const int32_t* tokens, int64_t n, int64_t pos0,
                   const float* hc_in, float* hc_out, const backend::Tensor& logits,
                   const backend::Tensor& final_hc = {}, const LayerHooks* hooks = nullptr);

// Logits (n_vocab floats) from one final HC state (hc_dim floats) through the model's output head.
void output_logits(const ForwardContext& fc, const backend::Tensor& hc, const backend::Tensor& logits);

// The MTP block's private state is one ratio-0 layer: the model shape with n_layer 1.
Shape mtp_state_shape(const Shape& s);

// One MTP draft step (docs/model.md §3.12): previous final HC state hprev, token t at position pos.
// Appends a row to mtp_kv's raw window, writes draft logits and (optionally) the block's HC output.
void mtp_forward(const ForwardContext& fc, KvState& mtp_kv, const backend::Tensor& hprev, int32_t token, int64_t pos,
                 const backend::Tensor& logits, const backend::Tensor& hc_out = {});

// Decode of one token (forward_batch with n = 1) followed by MTP step 0 from its final HC state
// (mtp_forward with that state and the same token and position), the two output heads run as
// one two-row product into head_rows (n_vocab x 2 scratch) so the head's weights are read once:
// the MTP gate's guess then costs the MTP layer, not a second pass over the head
// (docs/speculative.md, "Policy"). Only on backends whose batched rows equal one-row products
// (Backend::batched_rows_exact; elsewhere two one-row products), so every output is bit for bit
// what the two separate calls write. mtp_fc: the MTP's activations.
void forward_decode_mtp(const ForwardContext& fc, const ForwardContext& mtp_fc, KvState& kv, KvState& mtp_kv,
                        int32_t token, int64_t pos, const backend::Tensor& logits, const backend::Tensor& final_hc,
                        const backend::Tensor& mtp_logits, const backend::Tensor& mtp_hc,
                        const backend::Tensor& head_rows, const LayerHooks* hooks = nullptr);

}  // namespace ds4
