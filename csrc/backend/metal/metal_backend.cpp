#include "backend/metal/metal_backend.h"

#include <algorithm>
#include <cstring>

#include "backend/metal/metal_stream.h"
#include "common/errors.h"

namespace ds4 {
namespace backend {
namespace metal {

namespace {

// The views a model mapping is wrapped in: [offset, offset + bytes) from the page-aligned base.
// One view while the whole mapping fits under max_buffer_length; the overlapping multi-view plan
// (no tensor straddles two views) is model_views.h's, swapped in here when it lands.
struct ViewSpan {
    uint64_t offset, bytes;
};

std::vector<ViewSpan> plan_model_views(uint64_t bytes, uint64_t max_len) {
    if (bytes > max_len) {
        fail(ErrorKind::Unsupported, "metal: the model mapping (" + std::to_string(bytes) +
                                         " bytes) exceeds the device's max buffer length (" + std::to_string(max_len) +
                                         "); multi-view mapping is not implemented yet");
    }
    return {ViewSpan{0, bytes}};
}

}  // namespace

// One map_model() registration: the mapping's page-aligned range wrapped in views (no copy).
struct MetalBackend::ModelMap final : public Buffer {
    MetalBackend& be;
    const uint8_t* base;        // the caller's base
    uint64_t size;
    const uint8_t* aligned;     // base rounded down to a page
    std::vector<ViewSpan> spans;
    std::vector<std::unique_ptr<DeviceBuffer>> views;

    ModelMap(MetalBackend& b, const void* p, uint64_t n) : Buffer(nullptr, n), be(b), base((const uint8_t*)p), size(n) {
        Device& dev = be.device();
        const uint64_t page = dev.page_size();
        aligned = (const uint8_t*)((uintptr_t)base / page * page);
        // Whole pages around the mapping: the pages that hold its first and last bytes are mapped.
        const uint64_t span = ((uint64_t)(base - aligned) + n + page - 1) / page * page;
        spans = plan_model_views(span, dev.max_buffer_length() / page * page);
        for (const ViewSpan& v : spans) views.push_back(dev.wrap_no_copy(const_cast<uint8_t*>(aligned) + v.offset, v.bytes));
    }
    ~ModelMap() override { be.unregister(this); }
};

MetalBackend::MetalBackend(std::unique_ptr<Device> dev, std::string name, int threads)
    : dev_(std::move(dev)), name_(std::move(name)), threads_(std::max(threads, 1)) {}

MetalBackend::~MetalBackend() = default;

std::unique_ptr<Buffer> MetalBackend::alloc(uint64_t bytes) {
    return std::make_unique<MetalBuffer>(dev_->new_buffer(bytes), bytes);
}

std::unique_ptr<Buffer> MetalBackend::map_model(const void* base, uint64_t size) {
    auto m = std::make_unique<ModelMap>(*this, base, size);
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
        if (p < m->base || p + bytes > m->base + m->size) continue;
        const uint64_t rel = (uint64_t)(p - m->aligned);
        for (size_t i = 0; i < m->spans.size(); ++i) {
            const ViewSpan& v = m->spans[i];
            if (rel >= v.offset && rel + bytes <= v.offset + v.bytes) return {m->views[i].get(), rel - v.offset};
        }
    }
    fail(ErrorKind::InvalidArgument, name_ + ": weight " + (what ? *what : std::string("(unnamed)")) +
                                         " is not inside a mapped model (map_model)");
}

bool MetalBackend::supports(Op op, GgmlType t) const {
    switch (op) {
        case Op::EmbedTokensHc: case Op::Linear: case Op::GroupedOutputA:
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
