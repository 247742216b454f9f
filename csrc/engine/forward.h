// The DS4 forward pass over a batch of consecutive tokens, layer-major: projections run batched,
// while RoPE, cache pushes, compressors, indexer and attention run token by token in position
// order exactly like one-token decode. Decode is the batch of one.
#pragma once
#include <cstdint>

#include "engine/model.h"
#include "engine/scratch.h"
#include "state/kv_state.h"

namespace ds4 {

// Evaluates tokens[0..n) at positions pos0.. into kv. If logits is non-null, writes the logits
// of the last token (n_vocab floats). If final_hc is non-null, copies the last token's final HC
// state (hc_dim floats) there (MTP input).
void forward_batch(const Model& model, KvState& kv, Scratch& sc, const int32_t* tokens, int64_t n, int64_t pos0,
                   float* logits, float* final_hc = nullptr);

// One pipeline stage (the model's layer range) over the same batch. The first stage embeds
// `tokens`; a later one starts from hc_in, the previous stage's output (n x hc_dim floats). Every
// stage needs the token ids too: hash-routed layers pick experts by token. A stage before the last
// writes the HC state after its last layer to hc_out (n x hc_dim); the last stage writes logits
// and final_hc as forward_batch does. Chained stages compute exactly what forward_batch computes.
void forward_stage(const Model& model, KvState& kv, Scratch& sc, const int32_t* tokens, int64_t n, int64_t pos0,
                   const float* hc_in, float* hc_out, float* logits, float* final_hc);

// Logits from one final HC state (hc_dim floats) through the model's output head.
void output_logits(const Model& model, Scratch& sc, const float* H, float* logits);

// The MTP block's private state is one ratio-0 layer: the model shape with n_layer 1.
Shape mtp_state_shape(const Shape& s);

// One MTP draft step (docs/model.md §3.12): previous final HC state hprev, token t at position pos.
// Appends a row to mtp_kv's raw window, writes draft logits and (optionally) the block's HC output.
void mtp_forward(const Model& model, KvState& mtp_kv, Scratch& sc, const float* hprev, int32_t token, int64_t pos,
                 float* logits, float* hc_out);

}  // namespace ds4
