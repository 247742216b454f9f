// The seam between the DS4 graph and the hardware. A Backend is a device: it allocates buffers,
// maps the model file without copying, and says which (op, weight type) pairs it runs. A Stream
// is one execution context on it (one per session: it owns the ops' private work memory, so
// sessions never share it): upload/download, a begin/end bracket around a command batch (a GPU
// backend encodes everything in between into one submission and only has to wait at end() or at
// a download), and one method per op of backend/ops.h.
//
// How to add a backend: docs/architecture.md.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "backend/tensor.h"
#include "quant/types.h"

namespace ds4 {

class ThreadPool;

namespace backend {

// Bounds a stream sizes its private work memory for once, so the decode loop never allocates
// (anything else an op needs is grown on first use and kept).
struct StreamLimits {
    int64_t n_head = 0;
    int64_t max_attn_rows = 0;   // raw_cap + the largest compressed-row count an Attention sees
};

class Stream {
public:
    virtual ~Stream() = default;

    // Grows the private work memory for these bounds (the graph calls it before a batch).
    virtual void reserve(const StreamLimits& limits) = 0;

    // Command batch: everything between begin() and end() may be queued; end() waits for it.
    virtual void begin() {}
    virtual void end() {}

    virtual void upload(const Tensor& dst, const void* src, uint64_t bytes) = 0;
    virtual void download(const Tensor& src, void* dst, uint64_t bytes) = 0;

    virtual void embed_tokens_hc(const EmbedTokensHcArgs& a) = 0;
    virtual void rms_norm(const RmsNormArgs& a) = 0;
    virtual void head_rms_norm(const HeadRmsNormArgs& a) = 0;
    virtual void linear(const LinearArgs& a) = 0;
    virtual void linear_group(const LinearGroupArgs& a) = 0;
    virtual void grouped_output_a(const GroupedOutputAArgs& a) = 0;
    virtual void hc_pre(const HcPreArgs& a) = 0;
    virtual void hc_post(const HcPostArgs& a) = 0;
    virtual void hc_collapse_norm(const HcCollapseNormArgs& a) = 0;
    virtual void rope_tail(const RopeTailArgs& a) = 0;
    virtual void fp8_kv_roundtrip(const Fp8KvRoundtripArgs& a) = 0;
    virtual void store_row_f16(const StoreRowF16Args& a) = 0;
    virtual void compressor_store(const CompressorStoreArgs& a) = 0;
    virtual void compressor_pool(const CompressorPoolArgs& a) = 0;
    virtual void compressor_shift(const CompressorShiftArgs& a) = 0;
    virtual void indexer_scores(const IndexerScoresArgs& a) = 0;
    virtual void top_k_mask(const TopKMaskArgs& a) = 0;
    virtual void attention(const AttentionArgs& a) = 0;
    // Backends whose supports(Op::AttentionBlock) is false never get this call (the graph then
    // runs Attention token by token).
    virtual void attention_block(const AttentionBlockArgs& a) = 0;
    virtual void router(const RouterArgs& a) = 0;
    virtual void routed_experts(const RoutedExpertsArgs& a) = 0;
    virtual void swiglu(const SwigluArgs& a) = 0;
    virtual void add(const AddArgs& a) = 0;
    virtual void fill(const FillArgs& a) = 0;
    virtual void copy(const CopyArgs& a) = 0;
    virtual void argmax(const ArgmaxArgs& a) = 0;
};

class Backend {
public:
    virtual ~Backend() = default;

    // Registry name ("cpu", "metal", ...).
    virtual const char* name() const = 0;
    // A zero-filled buffer of `bytes`. Large buffers may be lazily backed (pages on first write).
    virtual std::unique_ptr<Buffer> alloc(uint64_t bytes) = 0;
    // Registers the read-only mapping of a model file (base, size) and returns a zero-copy buffer
    // over it; weights (TensorRef) inside it are then valid op arguments. largest_tensor: the byte
    // size of the largest tensor in it (0: the whole mapping is one tensor); a GPU backend that
    // splits the mapping into several device buffers sizes their overlap from it.
    virtual std::unique_ptr<Buffer> map_model(const void* base, uint64_t size, uint64_t largest_tensor = 0) = 0;
    // Whether `op` runs here with weights of `weight_type` (F32 for ops without weights).
    virtual bool supports(Op op, GgmlType weight_type) const = 0;
    virtual std::unique_ptr<Stream> new_stream() = 0;
    // Worker threads of the backend's CPU side (the CPU backend's pool; 1 elsewhere).
    virtual int threads() const { return 1; }
    // The pool of those threads, for host work between batches such as sampling (which idles
    // them otherwise): the CPU backend's pool; null elsewhere.
    virtual ThreadPool* host_pool() { return nullptr; }
    // Whether every row of a batched `linear` is bit for bit the one-row product (the CPU
    // kernels: yes; Metal's mat-mat tiles: no). forward_decode_mtp shares one head product
    // between two rows only where it is, so decode's logits never change.
    virtual bool batched_rows_exact() const { return false; }
};

// A tensor together with the buffer it owns (state and scratch the graph allocates).
struct OwnedTensor {
    std::unique_ptr<Buffer> buffer;
    Tensor t;

    OwnedTensor() = default;
    OwnedTensor(Backend& be, DType type, int64_t width, int64_t rows)
        : buffer(be.alloc((uint64_t)(width * rows * dtype_size(type)))), t(tensor_of(buffer.get(), type, width, rows)) {}
    explicit operator bool() const noexcept { return buffer != nullptr; }
    const Tensor& operator*() const { return t; }
    const Tensor* operator->() const { return &t; }
};

// Host floats of a tensor: its memory when host-visible (no copy), else a download into mirror.
inline const float* host_floats(Stream& st, const Tensor& t, std::vector<float>& mirror) {
    if (t.buffer->host()) return t.host<float>();
    mirror.resize((size_t)(t.width() * t.rows()));
    st.download(t, mirror.data(), (uint64_t)t.nbytes());
    return mirror.data();
}

// A named backend of the registry and whether this build + machine can create it.
struct BackendInfo {
    std::string name;
    bool available = false;
    std::string reason;          // why not, when unavailable ("not built on this platform")
};

std::vector<BackendInfo> available_backends();
// "auto" picks the first available backend in registry order (a GPU before the CPU).
// Throws UnsupportedModel listing the available names when `name` is unknown or unavailable.
std::unique_ptr<Backend> create_backend(const std::string& name, int threads);

}  // namespace backend
}  // namespace ds4
