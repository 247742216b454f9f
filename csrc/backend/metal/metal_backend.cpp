#include "backend/metal/metal_backend.h"

#include <algorithm>
#include <cstring>

#include "backend/metal/metal_stream.h"
#include "backend/metal/model_views.h"
#include "common/errors.h"

namespace ds4 {
namespace backend {
namespace metal {

// One map_model() registration: the mapping wrapped in no-copy views (model_views.h).
struct MetalBackend::ModelMap final : public Buffer {
    MetalBackend& be;
    ModelViews views;

    ModelMap(MetalBackend& b, const void* p, uint64_t n, uint64_t largest_tensor)
        : Buffer(nullptr, n), be(b), views(b.device(), p, n, largest_tensor) {}
    ~ModelMap() override { be.unregister(this); }
};

MetalBackend::MetalBackend(std::unique_ptr<Device> dev, std::string name, int threads)
    : dev_(std::move(dev)), name_(std::move(name)), threads_(std::max(threads, 1)) {}

MetalBackend::~MetalBackend() = default;

std::unique_ptr<Buffer> MetalBackend::alloc(uint64_t bytes) {
    return std::make_unique<MetalBuffer>(dev_->new_buffer(bytes), bytes);
}

std::unique_ptr<Buffer> MetalBackend::map_model(const void* base, uint64_t size, uint64_t largest_tensor) {
    auto m = std::make_unique<ModelMap>(*this, base, size, largest_tensor);
    std::lock_guard<std::mutex> lock(maps_mutex_);
    maps_.push_back(m.get());
    return m;
}

void MetalBackend::unregister(const ModelMap* m) {
    std::lock_guard<std::mutex> lock(maps_mutex_);
    maps_.erase(std::remove(maps_.begin(), maps_.end(), m), maps_.end());
}

WeightLocation MetalBackend::locate(const uint8_t* p, uint64_t bytes, const std::string* what) const {
    std::lock_guard<std::mutex> lock(maps_mutex_);
    for (const ModelMap* m : maps_) {
        const ModelViews& v = m->views;
        if (p < v.base() || p + bytes > v.base() + v.size()) continue;
        const ViewLocation at = v.locate(p, bytes);
        return {at.buffer, at.offset};
    }
    fail(ErrorKind::InvalidArgument, name_ + ": weight " + (what ? *what : std::string("(unnamed)")) +
                                         " is not inside a mapped model (map_model)");
}

bool MetalBackend::supports(Op op, GgmlType t) const {
    switch (op) {
        case Op::EmbedTokensHc: case Op::Linear: case Op::LinearGroup: case Op::GroupedOutputA:
            return linear_ops_supports(op, t);
        case Op::RmsNorm: case Op::HeadRmsNorm: case Op::StoreRowF16: case Op::Swiglu: case Op::Add: case Op::Fill:
        case Op::Copy: case Op::Argmax:
            return elementwise_ops_supports(op, t);
        case Op::RoutedExperts:
            return moe_ops_supports(op, t);
        case Op::HcPre: case Op::HcPost: case Op::HcCollapseNorm:
            return hc_ops_supports(op, t);
        case Op::RopeTail: case Op::Fp8KvRoundtrip:
            return rope_fp8_ops_supports(op, t);
        case Op::CompressorStore: case Op::CompressorPool: case Op::CompressorShift:
            return compressor_ops_supports(op, t);
        case Op::IndexerScores: case Op::TopKMask:
            return indexer_ops_supports(op, t);
        case Op::Attention:
            return attention_ops_supports(op, t);
        case Op::AttentionBlock:
            return false;   // no kernel yet: the graph runs Attention token by token here
        case Op::Router:
            return router_ops_supports(op, t);
        case Op::kCount:
            break;
    }
    return false;
}

std::unique_ptr<Stream> MetalBackend::new_stream() { return std::make_unique<MetalStream>(*this); }

}  // namespace metal

std::unique_ptr<Backend> make_metal_backend(std::unique_ptr<metal::Device> dev, std::string name, int threads) {
    return std::make_unique<metal::MetalBackend>(std::move(dev), std::move(name), threads);
}

}  // namespace backend
}  // namespace ds4
