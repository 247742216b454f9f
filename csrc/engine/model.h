// A loaded model: the mapped GGUF file(s), the bound weights and the backend that runs them (the
// file mapping registered with it, zero-copy). Immutable after construction and shared by every
// session of an Engine; each session runs on its own backend stream.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/mapped_file.h"
#include "model/shape.h"
#include "model/tensor.h"
#include "model/weights.h"

namespace ds4 {

struct ModelOptions {
    int threads = 0;                 // <= 0: default_thread_count()
    int64_t prefill_chunk = 0;       // <= 0: 4096 when the prompt is longer, else the whole prompt
    // The layers [layer_begin, layer_end) this model runs (a pipeline stage; layer_end <= 0: to
    // the last layer). Only their tensors are bound, so only their pages of the file are read.
    int layer_begin = 0;
    int layer_end = 0;
    std::string backend = "auto";    // a name of backend::available_backends(), or "auto"
};

class Model {
public:
    Model(const std::string& path, const Shape& shape, const std::vector<TensorDesc>& tensors,
          const ModelOptions& opts);
    // Binds the MTP block from a second file (or the main file when path is empty); last stage only.
    void load_mtp(const std::string& path, const std::vector<TensorDesc>& tensors);

    const Shape& shape() const { return shape_; }
    const ModelWeights& weights() const { return weights_; }
    int layer_begin() const { return weights_.layer_begin; }
    int layer_end() const { return weights_.layer_end; }
    bool first_stage() const { return weights_.first_stage(); }
    bool last_stage() const { return weights_.last_stage(shape_); }
    // The backend is a device handle: allocation and streams are safe from any session.
    backend::Backend& backend() const { return *backend_; }
    int threads() const { return backend_->threads(); }
    int64_t prefill_chunk() const { return prefill_chunk_; }
    void set_prefill_chunk(int64_t n) { prefill_chunk_ = n; }
    // Tokens per prefill chunk for a prompt of n tokens.
    int64_t chunk_for(int64_t n) const;
    uint64_t file_bytes() const { return file_->size(); }
    // Bytes of weights one decode step reads (dense tensors + n_expert_used experts per layer).
    int64_t decode_weight_bytes() const;

private:
    Shape shape_;
    std::unique_ptr<MappedFile> file_;
    std::unique_ptr<TensorTable> table_;
    std::unique_ptr<MappedFile> mtp_file_;
    std::unique_ptr<TensorTable> mtp_table_;
    ModelWeights weights_;
    std::unique_ptr<backend::Backend> backend_;
    std::unique_ptr<backend::Buffer> file_buffer_, mtp_file_buffer_;
    int64_t prefill_chunk_ = 0;
};

}  // namespace ds4
