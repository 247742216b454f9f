// Run-time hooks on the two per-layer vectors that feed an HC post (docs/steering.md): the
// attention output after the output projection and the FFN output (routed + shared experts).
// Directional steering edits them; an activation tap records them (after any edit). A forward
// pass without hooks runs exactly the plain model math.
#pragma once
#include <cstdint>
#include <vector>

namespace ds4 {

// The two hook points of every layer, in evaluation order.
enum class HookPoint : int { AttnOut = 0, FfnOut = 1 };
constexpr int kHookPoints = 2;
constexpr int hook_bit(HookPoint p) { return 1 << (int)p; }

// The steering edit itself, on nb consecutive rows of n_embd floats: y -= scale*(d.y)*d, with one
// float accumulator in index order (upstream's CPU order). A backend op can wrap it as it is.
void project_out_rows(float* rows, int64_t nb, int64_t n_embd, const float* dir, float scale);

// One direction per layer ([n_layer][n_embd] floats) and a scale per hook point. At a point with
// a non-zero scale s, every token row y becomes y - s*(d.y)*d with d that layer's direction.
struct Steering {
    int64_t n_layer = 0, n_embd = 0;
    std::vector<float> dirs;
    float scale[kHookPoints] = {0.0f, 0.0f};

    // Validates sizes, finiteness and scale range; InvalidArgument naming what is wrong.
    Steering(int64_t n_layer, int64_t n_embd, std::vector<float> dirs, float attn_scale, float ffn_scale);

    bool active(HookPoint p) const { return scale[(int)p] != 0.0f; }
    // Edits nb consecutive rows of n_embd floats in place.
    void apply(HookPoint p, int il, float* rows, int64_t nb) const;
};

// Records the hooked vectors of every evaluated token (or only the last one) while enabled.
// Layout per point: [token][layer][n_embd], tokens in evaluation order, their positions alongside.
struct ActivationTap {
    int points = 0;            // hook_bit mask; 0 = off
    bool last_only = false;    // keep only the most recent token (bounded memory on long prompts)
    int64_t n_layer = 0, n_embd = 0;
    std::vector<int64_t> positions;
    std::vector<float> rows[kHookPoints];

    bool on(HookPoint p) const { return (points & hook_bit(p)) != 0; }
    // Makes room for a batch of nb tokens at positions pos0.. (the last one only with last_only).
    void begin_batch(int64_t pos0, int64_t nb);
    void record(HookPoint p, int il, const float* batch_rows, int64_t nb);
    void clear();

private:
    int64_t slot0_ = 0;        // slot of the current batch's first token
    int64_t first_kept_ = 0;   // index within the batch of the first recorded token
};

// What a forward pass applies at each hook point (either member may be null).
struct LayerHooks {
    const Steering* steering = nullptr;
    ActivationTap* tap = nullptr;

    bool empty() const { return steering == nullptr && (tap == nullptr || tap->points == 0); }
    // Steering first, then the tap: the tap sees what HC post consumes.
    void at(HookPoint p, int il, float* rows, int64_t nb) const;
};

}  // namespace ds4
