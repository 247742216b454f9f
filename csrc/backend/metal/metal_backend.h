// The Metal backend: the DS4 ops as Metal kernel dispatches (metal/*.metal), written once against
// the neutral encoder API (encoder.h) and run by whichever Device it is given: Apple's GPU through
// the Objective-C++ device (metal/host/), or the CPU emulator (emu_device.h) as "metal-emu".
//
// Memory: every Buffer is a DeviceBuffer, used as device memory (Buffer::host() is null), so the
// graph reads and writes it only through Stream::upload/download, which wait for the stream's
// queued work first: the CPU never reads a value before the GPU has written it. The mapped model
// is wrapped without a copy (page-aligned overlapping views, model_views.h) and a weight (TensorRef) is
// found at byte (data - map base) of it.
//
// Threads: the backend (device, pipelines, model views) is shared by the sessions of an engine
// and is thread-safe; a stream (one per session) owns its queue and work memory and is used by
// one thread at a time, like every Stream. docs/metal.md, "Host".
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/metal/encoder.h"

namespace ds4 {
namespace backend {

// A Backend over `dev`, registered under `name` ("metal", "metal-emu").
std::unique_ptr<Backend> make_metal_backend(std::unique_ptr<metal::Device> dev, std::string name, int threads);

namespace metal {

// A device allocation as a backend Buffer.
class MetalBuffer final : public Buffer {
public:
    explicit MetalBuffer(std::unique_ptr<DeviceBuffer> dev, uint64_t size) : Buffer(nullptr, size), dev_(std::move(dev)) {}
    const DeviceBuffer& device() const { return *dev_; }

private:
    std::unique_ptr<DeviceBuffer> dev_;
};

// Where a weight lives: a view of the model mapping and the byte offset inside it.
struct WeightLocation {
    const DeviceBuffer* buffer = nullptr;
    uint64_t offset = 0;
};

class MetalBackend final : public Backend {
public:
    MetalBackend(std::unique_ptr<Device> dev, std::string name, int threads);
    ~MetalBackend() override;

    const char* name() const override { return name_.c_str(); }
    std::unique_ptr<Buffer> alloc(uint64_t bytes) override;
    std::unique_ptr<Buffer> map_model(const void* base, uint64_t size, uint64_t largest_tensor) override;
    bool supports(Op op, GgmlType weight_type) const override;
    std::unique_ptr<Stream> new_stream() override;
    int threads() const override { return threads_; }

    Device& device() { return *dev_; }
    // The view holding bytes [p, p + bytes) of a registered model mapping; throws InvalidArgument
    // naming the tensor when no mapping holds it (a weight that was not mapped).
    WeightLocation locate(const uint8_t* p, uint64_t bytes, const std::string* what) const;

    struct ModelMap;   // one map_model() registration (metal_backend.cpp)
    void unregister(const ModelMap* m);

private:
    std::unique_ptr<Device> dev_;
    std::string name_;
    int threads_;
    mutable std::mutex maps_mutex_;
    std::vector<const ModelMap*> maps_;
};

}  // namespace metal
}  // namespace backend
}  // namespace ds4
