#include "state/kv_rollback.h"

#include <algorithm>
#include <cstring>

#include "common/errors.h"
#include "layers/compressor.h"

namespace ds4 {

namespace {

// Windows a ratio-r compressor closes among positions pos0 .. pos0+c-1.
int64_t closes(int ratio, int64_t pos0, int64_t c) {
    if (ratio == 0 || c <= 0) return 0;
    return (pos0 + c) / ratio - pos0 / ratio;
}

void save_lane(int ratio, int64_t width, const std::vector<float>& skv,
               const std::vector<float>& ssc, int64_t pos0, int64_t n, std::vector<float>& kv_out,
               std::vector<float>& sc_out) {
    if (ratio == 4) {
        kv_out = skv;
        sc_out = ssc;
        return;
    }
    kv_out.resize((size_t)(n * width));
    sc_out.resize((size_t)(n * width));
    for (int64_t b = 0; b < n; ++b) {
        const int64_t row = frontier_row(ratio, pos0 + b);
        std::memcpy(&kv_out[b * width], &skv[row * width], (size_t)width * sizeof(float));
        std::memcpy(&sc_out[b * width], &ssc[row * width], (size_t)width * sizeof(float));
    }
}

}  // namespace

void KvRollback::capture(const KvState& kv, int64_t pos0, int64_t n) {
    if (n < 1 || n > kv.raw_cap) {
        fail(ErrorKind::InvalidArgument, "a speculative batch holds 1.." + std::to_string(kv.raw_cap) +
                                             " tokens (the raw window), got " + std::to_string(n));
    }
    pos0_ = pos0;
    n_ = n;
    const int64_t D = kv.shape.head_dim;
    layers_.resize(kv.layers.size());
    for (size_t il = 0; il < kv.layers.size(); ++il) {
        const LayerKv& L = kv.layers[il];
        Layer& S = layers_[il];
        S.n_raw = L.n_raw;
        S.raw_next = L.raw_next;
        S.n_comp = L.n_comp;
        S.n_index_comp = L.n_index_comp;
        S.raw.resize((size_t)(n * D));
        for (int64_t b = 0; b < n; ++b) {
            const int64_t slot = (L.raw_next + b) % kv.raw_cap;
            std::memcpy(&S.raw[b * D], &L.raw[slot * D], (size_t)D * sizeof(float));
        }
        const int64_t widths[2] = {Shape::coff(L.ratio) * D, Shape::coff(L.ratio) * kv.shape.indexer_head_dim};
        for (int lane = 0; lane < 2; ++lane) {
            Lane& ln = S.lanes[lane];
            const bool present = L.ratio != 0 && (lane == 0 || L.ratio == 4);
            ln.ratio = present ? L.ratio : 0;
            ln.width = widths[lane];
            if (!present) continue;
            const auto& skv = lane == 0 ? L.attn_state_kv : L.index_state_kv;
            const auto& ssc = lane == 0 ? L.attn_state_score : L.index_state_score;
            save_lane(L.ratio, ln.width, skv, ssc, pos0, n, ln.kv, ln.score);
            ln.log_kv.resize((size_t)(n * ln.width));
            ln.log_score.resize((size_t)(n * ln.width));
        }
    }
}

void KvRollback::record(int il, int lane, int64_t b, const float* kv_row, const float* score_row, int64_t width) {
    Lane& ln = layers_[il].lanes[lane];
    std::memcpy(&ln.log_kv[b * width], kv_row, (size_t)width * sizeof(float));
    std::memcpy(&ln.log_score[b * width], score_row, (size_t)width * sizeof(float));
}

void KvRollback::restore_lane(const Lane& ln, std::vector<float>& skv, std::vector<float>& ssc, int64_t c) const {
    const int64_t w = ln.width;
    if (ln.ratio == 4) {
        skv = ln.kv;
        ssc = ln.score;
    } else {
        for (int64_t b = 0; b < n_; ++b) {
            const int64_t row = frontier_row(ln.ratio, pos0_ + b);
            std::memcpy(&skv[row * w], &ln.kv[b * w], (size_t)w * sizeof(float));
            std::memcpy(&ssc[row * w], &ln.score[b * w], (size_t)w * sizeof(float));
        }
    }
    for (int64_t b = 0; b < c; ++b) {
        frontier_store(ln.ratio, w, skv.data(), ssc.data(), &ln.log_kv[b * w], &ln.log_score[b * w], pos0_ + b);
    }
}

void KvRollback::rollback(KvState& kv, int64_t c) const {
    if (c < 0 || c > n_) fail(ErrorKind::InvalidArgument, "rollback keeps 0.." + std::to_string(n_) + " tokens");
    if (c == n_) return;
    const int64_t D = kv.shape.head_dim;
    for (size_t il = 0; il < kv.layers.size(); ++il) {
        LayerKv& L = kv.layers[il];
        const Layer& S = layers_[il];
        for (int64_t b = c; b < n_; ++b) {
            const int64_t slot = (S.raw_next + b) % kv.raw_cap;
            std::memcpy(&L.raw[slot * D], &S.raw[b * D], (size_t)D * sizeof(float));
        }
        L.raw_next = (S.raw_next + c) % kv.raw_cap;
        L.n_raw = std::min(kv.raw_cap, S.n_raw + c);
        L.n_comp = S.n_comp + closes(L.ratio, pos0_, c);
        if (L.ratio == 4) L.n_index_comp = S.n_index_comp + closes(L.ratio, pos0_, c);
        if (S.lanes[0].ratio != 0) restore_lane(S.lanes[0], L.attn_state_kv, L.attn_state_score, c);
        if (S.lanes[1].ratio != 0) restore_lane(S.lanes[1], L.index_state_kv, L.index_state_score, c);
    }
}

}  // namespace ds4
