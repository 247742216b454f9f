#include "session/payload.h"

#include <cstring>
#include <string>

#include "common/errors.h"

namespace ds4 {

namespace {

class Writer {
public:
    explicit Writer(std::vector<uint8_t>& out) : out_(out) {}
    // A backend tensor's bytes: straight from host-visible memory, else through a download.
    void tensor(backend::Stream& st, const backend::Tensor& t) {
        if (t.nbytes() == 0) return;
        if (t.buffer->host()) {
            bytes(t.host<uint8_t>(), t.nbytes());
            return;
        }
        const size_t at = out_.size();
        out_.resize(at + (size_t)t.nbytes());
        st.download(t, out_.data() + at, (uint64_t)t.nbytes());
    }
    void u32(uint32_t v) { bytes(&v, 4); }
    void floats(const float* p, int64_t n) { bytes(p, n * 4); }
    void bytes(const void* p, int64_t n) {
        const size_t at = out_.size();
        out_.resize(at + (size_t)n);
        if (n) std::memcpy(out_.data() + at, p, (size_t)n);
    }

private:
    std::vector<uint8_t>& out_;
};

class Reader {
public:
    Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
    uint32_t u32() {
        uint32_t v;
        bytes(&v, 4);
        return v;
    }
    void floats(float* dst, int64_t n) { bytes(dst, n * 4); }
    // Fills a backend tensor: straight into host-visible memory, else through an upload.
    void tensor(backend::Stream& st, const backend::Tensor& t) {
        if (t.nbytes() == 0) return;
        if (t.buffer->host()) {
            bytes(t.host<uint8_t>(), t.nbytes());
            return;
        }
        if ((uint64_t)t.nbytes() > n_ - at_) fail(ErrorKind::CacheFormat, "truncated session payload");
        st.upload(t, p_ + at_, (uint64_t)t.nbytes());
        at_ += (size_t)t.nbytes();
    }
    void bytes(void* dst, int64_t n) {
        if (n < 0 || (uint64_t)n > n_ - at_) fail(ErrorKind::CacheFormat, "truncated session payload");
        if (n) std::memcpy(dst, p_ + at_, (size_t)n);
        at_ += (size_t)n;
    }
    size_t left() const { return n_ - at_; }

private:
    const uint8_t* p_;
    size_t n_;
    size_t at_ = 0;
};

int64_t frontier_floats(const LayerKv& L, int64_t width) {
    const int64_t coff = Shape::coff(L.ratio);
    return coff * L.ratio * coff * width;
}

}  // namespace

int64_t payload_bytes(const KvState& kv, int64_t T) {
    const Shape& s = kv.shape;
    const int64_t R = std::min<int64_t>(kv.raw_cap, T);
    int64_t n = 52 + 4 * T + 4 * (int64_t)s.n_vocab + 8 * (int64_t)kv.layers.size();
    for (const LayerKv& L : kv.layers) {
        n += R * 4 * s.head_dim;
        if (L.ratio != 0) n += L.n_comp * 4 * s.head_dim + 2 * 4 * frontier_floats(L, s.head_dim);
        if (L.ratio == 4) n += L.n_index_comp * 4 * s.indexer_head_dim + 2 * 4 * frontier_floats(L, s.indexer_head_dim);
    }
    return n;
}

void write_payload(backend::Stream& st, const KvState& kv, const std::vector<int32_t>& tokens,
                   const backend::Tensor& logits, std::vector<uint8_t>& out) {
    const Shape& s = kv.shape;
    const int64_t T = (int64_t)tokens.size();
    const int64_t R = std::min<int64_t>(kv.raw_cap, T);
    out.clear();
    out.reserve((size_t)payload_bytes(kv, T));
    Writer w(out);
    int64_t comp_cap4 = kv.ctx / 4 + 2;
    for (const LayerKv& L : kv.layers) if (L.ratio == 4) comp_cap4 = L.comp_cap;
    const uint32_t header[13] = {kPayloadMagic, kPayloadVersion, (uint32_t)kv.ctx, (uint32_t)payload_prefill_cap(kv.ctx),
                                 (uint32_t)kv.raw_cap, (uint32_t)kv.raw_cap, (uint32_t)comp_cap4, (uint32_t)T,
                                 (uint32_t)kv.layers.size(), (uint32_t)s.head_dim, (uint32_t)s.indexer_head_dim,
                                 (uint32_t)s.n_vocab, (uint32_t)R};
    for (uint32_t v : header) w.u32(v);
    for (int32_t t : tokens) w.u32((uint32_t)t);
    w.tensor(st, logits);
    for (const LayerKv& L : kv.layers) w.u32((uint32_t)L.n_comp);
    for (const LayerKv& L : kv.layers) w.u32((uint32_t)L.n_index_comp);
    for (size_t k = 0; k < kv.layers.size(); ++k) {
        const LayerKv& L = kv.layers[k];
        const int il = kv.first_layer + (int)k;
        // The live window holds min(n_raw, R) rows; after a rebuild they are exactly the last R.
        for (int64_t i = L.n_raw - R; i < L.n_raw; ++i) w.tensor(st, kv.raw_row(il, i));
        if (L.ratio != 0) {
            w.tensor(st, L.comp->rows(0, L.n_comp));
            w.tensor(st, *L.attn_state_kv);
            w.tensor(st, *L.attn_state_score);
        }
        if (L.ratio == 4) {
            w.tensor(st, L.index_comp->rows(0, L.n_index_comp));
            w.tensor(st, *L.index_state_kv);
            w.tensor(st, *L.index_state_score);
        }
    }
}

void read_payload(backend::Stream& st, const uint8_t* data, size_t size, KvState& kv, std::vector<int32_t>& tokens,
                  std::vector<float>& logits) {
    const Shape& s = kv.shape;
    Reader r(data, size);
    uint32_t h[13];
    for (uint32_t& v : h) v = r.u32();
    if (h[0] != kPayloadMagic || h[1] != kPayloadVersion) fail(ErrorKind::CacheFormat, "unsupported session payload version");
    const int64_t saved_ctx = h[2], T = h[7];
    if (saved_ctx > kv.ctx || T >= kv.ctx) {
        fail(ErrorKind::CacheFormat, "KV checkpoint does not fit current context (saved ctx " + std::to_string(saved_ctx) +
                                         ", " + std::to_string(T) + " tokens; session ctx " + std::to_string(kv.ctx) + ")");
    }
    const int n_layer = (int)kv.layers.size();
    if (h[8] != (uint32_t)n_layer || h[9] != (uint32_t)s.head_dim || h[10] != (uint32_t)s.indexer_head_dim ||
        h[11] != (uint32_t)s.n_vocab) {
        fail(ErrorKind::CacheFormat, "KV checkpoint was written for a different DS4 layout (layers/head dim/indexer dim/vocab " +
                                         std::to_string(h[8]) + "/" + std::to_string(h[9]) + "/" + std::to_string(h[10]) +
                                         "/" + std::to_string(h[11]) + ", model has " + std::to_string(n_layer) + "/" +
                                         std::to_string(s.head_dim) + "/" + std::to_string(s.indexer_head_dim) + "/" +
                                         std::to_string(s.n_vocab) + ")");
    }
    if (h[3] != (uint32_t)payload_prefill_cap(kv.ctx) || h[5] != (uint32_t)kv.raw_cap) {
        fail(ErrorKind::CacheFormat, "KV checkpoint graph chunk layout does not match current runtime");
    }
    const int64_t saved_raw_cap = h[4], saved_window = h[5], R = h[12];
    if (saved_raw_cap == 0 || R != std::min<int64_t>(T, saved_window) || R > saved_raw_cap || R > kv.raw_cap) {
        fail(ErrorKind::CacheFormat, "KV checkpoint raw ring layout does not match current context");
    }
    int64_t cur_comp_cap = kv.ctx / 4 + 2;
    for (const LayerKv& L : kv.layers) if (L.ratio == 4) cur_comp_cap = L.comp_cap;
    const int64_t saved_comp_cap = h[6];
    if (saved_comp_cap > cur_comp_cap) fail(ErrorKind::CacheFormat, "KV checkpoint compressed cache is larger than current context");

    tokens.assign((size_t)T, 0);
    for (int64_t i = 0; i < T; ++i) {
        const uint32_t t = r.u32();
        if (t >= (uint32_t)s.n_vocab) {
            fail(ErrorKind::CacheFormat, "KV checkpoint token " + std::to_string(i) + " has id " + std::to_string(t) +
                                             " outside the vocabulary");
        }
        tokens[(size_t)i] = (int32_t)t;
    }
    logits.assign((size_t)s.n_vocab, 0.0f);
    r.floats(logits.data(), s.n_vocab);
    std::vector<uint32_t> n_comp(n_layer), n_index(n_layer);
    for (uint32_t& v : n_comp) v = r.u32();
    for (uint32_t& v : n_index) v = r.u32();
    kv.reset(st);
    for (int il = 0; il < n_layer; ++il) {
        LayerKv& L = kv.layers[il];
        const int64_t cap = L.ratio != 0 ? L.comp_cap : 0;
        if ((int64_t)n_comp[il] > saved_comp_cap || (int64_t)n_comp[il] > cap) {
            fail(ErrorKind::CacheFormat, "KV checkpoint has invalid compressed row count in layer " + std::to_string(kv.first_layer + il));
        }
        if ((int64_t)n_index[il] > saved_comp_cap || (int64_t)n_index[il] > (L.ratio == 4 ? cap : 0)) {
            fail(ErrorKind::CacheFormat, "KV checkpoint has invalid indexer row count in layer " + std::to_string(kv.first_layer + il));
        }
    }
    for (int il = 0; il < n_layer; ++il) {
        LayerKv& L = kv.layers[il];
        r.tensor(st, L.raw->rows(0, R));
        L.n_raw = R;
        L.raw_next = R % kv.raw_cap;
        if (L.ratio != 0) {
            L.n_comp = n_comp[il];
            r.tensor(st, L.comp->rows(0, L.n_comp));
            r.tensor(st, *L.attn_state_kv);
            r.tensor(st, *L.attn_state_score);
        }
        if (L.ratio == 4) {
            L.n_index_comp = n_index[il];
            r.tensor(st, L.index_comp->rows(0, L.n_index_comp));
            r.tensor(st, *L.index_state_kv);
            r.tensor(st, *L.index_state_score);
        }
    }
    if (r.left() != 0) {
        fail(ErrorKind::CacheFormat, "KV checkpoint has trailing payload bytes (" + std::to_string(r.left()) + " extra)");
    }
}

}  // namespace ds4
