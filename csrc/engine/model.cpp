#include "engine/model.h"

#include "common/errors.h"

namespace ds4 {

namespace {

// The overlap a GPU backend needs between the device buffers it wraps the file in.
uint64_t largest_tensor(const std::vector<TensorDesc>& tensors) {
    uint64_t m = 0;
    for (const TensorDesc& d : tensors) m = d.nbytes > m ? d.nbytes : m;
    return m;
}

}  // namespace

Model::Model(const std::string& path, const Shape& shape, const std::vector<TensorDesc>& tensors,
             const ModelOptions& opts)
    : shape_(shape), prefill_chunk_(opts.prefill_chunk) {
    shape_.validate();
    backend_ = backend::create_backend(opts.backend, opts.threads);
    file_ = std::make_unique<MappedFile>(path);
    table_ = std::make_unique<TensorTable>(file_->data(), file_->size(), path, tensors);
    weights_.bind(shape_, *table_, opts.layer_begin, opts.layer_end > 0 ? opts.layer_end : shape_.n_layer);
    file_buffer_ = backend_->map_model(file_->data(), file_->size(), largest_tensor(tensors));
}

void Model::load_mtp(const std::string& path, const std::vector<TensorDesc>& tensors) {
    if (!last_stage()) fail(ErrorKind::InvalidArgument, "the MTP block runs on the last pipeline stage only");
    if (!weights_.token_embd) weights_.bind_embedding(shape_, *table_);
    if (path.empty()) {
        mtp_table_ = std::make_unique<TensorTable>(file_->data(), file_->size(), file_->path(), tensors);
    } else {
        mtp_file_ = std::make_unique<MappedFile>(path);
        mtp_table_ = std::make_unique<TensorTable>(mtp_file_->data(), mtp_file_->size(), path, tensors);
        mtp_file_buffer_ = backend_->map_model(mtp_file_->data(), mtp_file_->size(), largest_tensor(tensors));
    }
    weights_.bind_mtp(shape_, *mtp_table_);
}

int64_t Model::chunk_for(int64_t n) const {
    int64_t cap = prefill_chunk_ > 0 ? prefill_chunk_ : (n > 4096 ? 4096 : n);
    if (cap < 1) cap = 1;
    return cap < n ? cap : n;
}

int64_t Model::decode_weight_bytes() const {
    int64_t total = weights_.output.nbytes + weights_.head.hc_fn.nbytes;
    if (first_stage()) total += weights_.token_embd.row_stride();
    auto add = [&](const TensorRef& t) { if (t) total += t.nbytes; };
    for (int il = layer_begin(); il < layer_end(); ++il) {
        const LayerWeights& L = weights_.layers[il];
        const AttentionWeights& a = L.attn;
        for (const TensorRef* t : {&a.hc_attn_fn, &a.attn_q_a, &a.attn_q_b, &a.attn_kv, &a.attn_output_a,
                                   &a.attn_output_b, &L.comp.kv, &L.comp.gate, &L.indexer.q_b, &L.indexer.proj,
                                   &L.indexer.comp.kv, &L.indexer.comp.gate, &L.ffn.hc_ffn_fn, &L.ffn.gate_inp,
                                   &L.ffn.gate_shexp, &L.ffn.up_shexp, &L.ffn.down_shexp}) {
            add(*t);
        }
        const int64_t used = shape_.n_expert_used;
        total += used * (L.ffn.gate_exps.matrix_stride() + L.ffn.up_exps.matrix_stride() +
                         L.ffn.down_exps.matrix_stride());
    }
    return total;
}

}  // namespace ds4
