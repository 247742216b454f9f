#include "engine/layer_hooks.h"

#include <cmath>
#include <cstring>
#include <string>

#include "common/errors.h"

namespace ds4 {

namespace {
constexpr float kMaxSteeringScale = 100.0f;   // upstream's accepted range is [-100, 100]
}  // namespace

Steering::Steering(int64_t nl, int64_t ne, std::vector<float> d, float attn_scale, float ffn_scale)
    : n_layer(nl), n_embd(ne), dirs(std::move(d)) {
    if (n_layer <= 0 || n_embd <= 0) fail(ErrorKind::InvalidArgument, "steering needs a positive layer count and width");
    if ((int64_t)dirs.size() != n_layer * n_embd) {
        fail(ErrorKind::InvalidArgument, "steering directions have " + std::to_string(dirs.size()) + " floats, expected " +
                                             std::to_string(n_layer) + " x " + std::to_string(n_embd));
    }
    for (size_t i = 0; i < dirs.size(); ++i) {
        if (!std::isfinite(dirs[i])) {
            fail(ErrorKind::InvalidArgument, "steering direction of layer " + std::to_string((int64_t)i / n_embd) +
                                                 " has a non-finite value at index " + std::to_string((int64_t)i % n_embd));
        }
    }
    const float scales[kHookPoints] = {attn_scale, ffn_scale};
    const char* names[kHookPoints] = {"attn", "ffn"};
    for (int p = 0; p < kHookPoints; ++p) {
        if (!std::isfinite(scales[p]) || std::fabs(scales[p]) > kMaxSteeringScale) {
            fail(ErrorKind::InvalidArgument, std::string("steering ") + names[p] + " scale " + std::to_string(scales[p]) +
                                                 " is outside [-100, 100]");
        }
        scale[p] = scales[p];
    }
}

void project_out_rows(float* rows, int64_t nb, int64_t n_embd, const float* d, float scale) {
    for (int64_t b = 0; b < nb; ++b) {
        float* y = rows + b * n_embd;
        float dot = 0.0f;
        for (int64_t i = 0; i < n_embd; ++i) dot += y[i] * d[i];
        const float coeff = scale * dot;
        for (int64_t i = 0; i < n_embd; ++i) y[i] -= coeff * d[i];
    }
}

void Steering::apply(HookPoint p, int il, float* rows, int64_t nb) const {
    const float s = scale[(int)p];
    if (s == 0.0f) return;
    project_out_rows(rows, nb, n_embd, dirs.data() + (int64_t)il * n_embd, s);
}

void ActivationTap::begin_batch(int64_t pos0, int64_t nb) {
    if (points == 0 || nb <= 0) return;
    const int64_t keep = last_only ? 1 : nb;
    first_kept_ = nb - keep;
    slot0_ = last_only ? 0 : (int64_t)positions.size();
    positions.resize((size_t)(slot0_ + keep));
    for (int64_t k = 0; k < keep; ++k) positions[(size_t)(slot0_ + k)] = pos0 + first_kept_ + k;
    const size_t per_token = (size_t)(n_layer * n_embd);
    for (int p = 0; p < kHookPoints; ++p) {
        if (points & (1 << p)) rows[p].resize(positions.size() * per_token);
    }
}

void ActivationTap::record(HookPoint p, int il, const float* batch_rows, int64_t nb) {
    if (!on(p)) return;
    std::vector<float>& out = rows[(int)p];
    for (int64_t b = first_kept_; b < nb; ++b) {
        const int64_t slot = slot0_ + (b - first_kept_);
        std::memcpy(&out[(size_t)((slot * n_layer + il) * n_embd)], batch_rows + b * n_embd, (size_t)n_embd * sizeof(float));
    }
}

void ActivationTap::clear() {
    positions.clear();
    for (std::vector<float>& r : rows) r.clear();
    slot0_ = first_kept_ = 0;
}

void LayerHooks::at(HookPoint p, int il, float* rows, int64_t nb) const {
    if (steering != nullptr) steering->apply(p, il, rows, nb);
    if (tap != nullptr) tap->record(p, il, rows, nb);
}

}  // namespace ds4
