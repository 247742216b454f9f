#include "state/kv_rollback.h"

#include <algorithm>
#include <string>

#include "common/errors.h"

namespace ds4 {

namespace {

using backend::DType;
using backend::OwnedTensor;
using backend::Tensor;

// Windows a ratio-r compressor closes among positions pos0 .. pos0+c-1.
int64_t closes(int ratio, int64_t pos0, int64_t c) {
    if (ratio == 0 || c <= 0) return 0;
    return (pos0 + c) / ratio - pos0 / ratio;
}

// t holds at least rows x width floats (grown, never shrunk: the decode loop stops allocating).
void ensure(OwnedTensor& t, backend::Backend& be, int64_t width, int64_t rows) {
    if (!t || t->width() != width || t->rows() < rows) t = OwnedTensor(be, DType::F32, width, rows);
}

// Lane state tensors of a layer: 0 attention, 1 indexer.
const OwnedTensor& state_kv(const LayerKv& L, int lane) { return lane == 0 ? L.attn_state_kv : L.index_state_kv; }
const OwnedTensor& state_score(const LayerKv& L, int lane) {
    return lane == 0 ? L.attn_state_score : L.index_state_score;
}

}  // namespace

void KvRollback::capture(backend::Backend& be, backend::Stream& st, const KvState& kv, int64_t pos0, int64_t n) {
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
        ensure(S.raw, be, D, n);
        for (int64_t b = 0; b < n; ++b) st.copy({L.raw->row((L.raw_next + b) % kv.raw_cap), S.raw->row(b)});
        for (int lane = 0; lane < 2; ++lane) {
            Lane& ln = S.lanes[lane];
            const bool present = L.ratio != 0 && (lane == 0 || L.ratio == 4);
            ln.ratio = present ? L.ratio : 0;
            if (!present) continue;
            ln.head_dim = lane == 0 ? D : kv.shape.indexer_head_dim;
            const Tensor skv = *state_kv(L, lane), ssc = *state_score(L, lane);
            const int64_t w = skv.width();
            ensure(ln.log_kv, be, w, n);
            ensure(ln.log_score, be, w, n);
            if (L.ratio == 4) {
                ensure(ln.kv, be, w, skv.rows());
                ensure(ln.score, be, w, skv.rows());
                st.copy({skv, ln.kv->rows(0, skv.rows())});
                st.copy({ssc, ln.score->rows(0, ssc.rows())});
                continue;
            }
            ensure(ln.kv, be, w, n);
            ensure(ln.score, be, w, n);
            for (int64_t b = 0; b < n; ++b) {
                const int64_t row = Shape::frontier_row(L.ratio, pos0 + b);
                st.copy({skv.row(row), ln.kv->row(b)});
                st.copy({ssc.row(row), ln.score->row(b)});
            }
        }
    }
}

void KvRollback::record(backend::Stream& st, const KvState& kv, int il, int lane, int64_t b) const {
    const LayerKv& L = kv.layer(il);
    const Lane& ln = layers_[(size_t)(il - kv.first_layer)].lanes[lane];
    const int64_t row = Shape::frontier_row(L.ratio, pos0_ + b);
    st.copy({state_kv(L, lane)->row(row), ln.log_kv->row(b)});
    st.copy({state_score(L, lane)->row(row), ln.log_score->row(b)});
}

void KvRollback::restore_lane(backend::Stream& st, const Lane& ln, const Tensor& skv, const Tensor& ssc,
                              int64_t c) const {
    if (ln.ratio == 4) {
        st.copy({ln.kv->rows(0, skv.rows()), skv});
        st.copy({ln.score->rows(0, ssc.rows()), ssc});
    } else {
        for (int64_t b = 0; b < n_; ++b) {
            const int64_t row = Shape::frontier_row(ln.ratio, pos0_ + b);
            st.copy({ln.kv->row(b), skv.row(row)});
            st.copy({ln.score->row(b), ssc.row(row)});
        }
    }
    // Replays the kept tokens' stores (and the window shifts they caused) in order.
    for (int64_t b = 0; b < c; ++b) {
        const int64_t pos = pos0_ + b;
        const int64_t row = Shape::frontier_row(ln.ratio, pos);
        st.copy({ln.log_kv->row(b), skv.row(row)});
        st.copy({ln.log_score->row(b), ssc.row(row)});
        if (ln.ratio == 4 && (pos + 1) % 4 == 0) st.compressor_shift({skv, ssc, ln.head_dim});
    }
}

void KvRollback::rollback(backend::Stream& st, KvState& kv, int64_t c) const {
    if (c < 0 || c > n_) fail(ErrorKind::InvalidArgument, "rollback keeps 0.." + std::to_string(n_) + " tokens");
    if (c == n_) return;
    st.begin();
    for (size_t il = 0; il < kv.layers.size(); ++il) {
        LayerKv& L = kv.layers[il];
        const Layer& S = layers_[il];
        for (int64_t b = c; b < n_; ++b) st.copy({S.raw->row(b), L.raw->row((S.raw_next + b) % kv.raw_cap)});
        L.raw_next = (S.raw_next + c) % kv.raw_cap;
        L.n_raw = std::min(kv.raw_cap, S.n_raw + c);
        L.n_comp = S.n_comp + closes(L.ratio, pos0_, c);
        if (L.ratio == 4) L.n_index_comp = S.n_index_comp + closes(L.ratio, pos0_, c);
        for (int lane = 0; lane < 2; ++lane) {
            if (S.lanes[lane].ratio != 0) restore_lane(st, S.lanes[lane], *state_kv(L, lane), *state_score(L, lane), c);
        }
    }
    st.end();
}

}  // namespace ds4
