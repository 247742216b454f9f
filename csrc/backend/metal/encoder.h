// The neutral encoder API the Metal dispatch layer is written against (docs/metal.md, "host").
//
// It is the subset of Metal's compute API that the DS4 graph needs, with nothing Metal-specific
// in its types, so the same dispatch code drives two implementations:
//   * the Objective-C++ one over MTLDevice / MTLCommandQueue / MTLComputeCommandEncoder
//     (metal/host/, Apple only), and
//   * the emulator's (emu_device.cpp), which runs the kernels compiled as C++ on the CPU through
//     the C ABI of metal/emu/ds4_metal_emu.h.
// Same pipelines, argument bytes, buffer offsets, threadgroup memory and grid sizes on both.
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace ds4 {
namespace backend {
namespace metal {

// A device allocation. Storage is shared (CPU-visible: Apple unified memory, host memory in the
// emulator), but the CPU may only touch contents() while no command buffer that uses the buffer
// is in flight (Queue::wait()).
class DeviceBuffer {
public:
    virtual ~DeviceBuffer() = default;
    virtual void* contents() const = 0;
    virtual uint64_t length() const = 0;
};

// A function constant value, by [[function_constant(index)]]. Metal's bool, int/uint and float.
struct FunctionConstant {
    enum class Kind : uint8_t { Bool, Int32, UInt32, Float };
    uint32_t index = 0;
    Kind kind = Kind::UInt32;
    uint32_t bits = 0;   // the value's bytes (bool: 0/1)

    static FunctionConstant boolean(uint32_t i, bool v) { return {i, Kind::Bool, v ? 1u : 0u}; }
    static FunctionConstant u32(uint32_t i, uint32_t v) { return {i, Kind::UInt32, v}; }
    static FunctionConstant i32(uint32_t i, int32_t v) { return {i, Kind::Int32, (uint32_t)v}; }
    static FunctionConstant f32(uint32_t i, float v) {
        uint32_t b;
        std::memcpy(&b, &v, 4);
        return {i, Kind::Float, b};
    }
    uint32_t size() const { return kind == Kind::Bool ? 1u : 4u; }
};

// A compiled kernel specialised by its function constants. Built once per engine and cached by
// the Device (pipeline creation is slow on Apple GPUs).
class Pipeline {
public:
    virtual ~Pipeline() = default;
    virtual const std::string& kernel() const = 0;
    // maxTotalThreadsPerThreadgroup: may be below 1024 for register-heavy kernels; the dispatch
    // layer must size threadgroups within it.
    virtual uint32_t max_threads_per_threadgroup() const = 0;
    virtual uint32_t thread_execution_width() const = 0;   // simd width (32 on Apple GPUs)
};

struct Size3 {
    uint32_t x = 1, y = 1, z = 1;
};

// One compute encoder of one command buffer. Calls are recorded in order; a dispatch sees the
// state (pipeline, bindings, threadgroup memory) set before it.
class Encoder {
public:
    virtual ~Encoder() = default;
    virtual void set_pipeline(const Pipeline& p) = 0;
    virtual void set_buffer(uint32_t index, const DeviceBuffer& b, uint64_t offset) = 0;
    // Small argument structs (setBytes: ≤ 4 KiB), copied at the call.
    virtual void set_bytes(uint32_t index, const void* data, uint32_t bytes) = 0;
    // [[threadgroup(index)]] length in bytes (a multiple of 16).
    virtual void set_threadgroup_memory(uint32_t index, uint32_t bytes) = 0;
    virtual void dispatch_threadgroups(Size3 groups, Size3 threads_per_group) = 0;
    // dispatchThreads: a grid of threads; edge threadgroups may be partial.
    virtual void dispatch_threads(Size3 threads, Size3 threads_per_group) = 0;
    // Orders every later dispatch after every earlier one on buffer memory (memoryBarrier with
    // buffer scope). Without it, dispatches of one encoder may overlap on a GPU.
    virtual void barrier() = 0;
    // Blit: bytes from src+src_off to dst+dst_off, ordered like a dispatch.
    virtual void copy(const DeviceBuffer& src, uint64_t src_off, const DeviceBuffer& dst, uint64_t dst_off,
                      uint64_t bytes) = 0;
};

// A command queue. One per stream: a session's dispatches never share a queue with another's.
class Queue {
public:
    virtual ~Queue() = default;
    // The encoder of the current command buffer (a new command buffer is opened when none is).
    virtual Encoder& encoder() = 0;
    // Ends encoding and submits the current command buffer (no-op when none is open).
    virtual void commit() = 0;
    // Waits until every committed command buffer has completed; throws ds4 errors (Internal)
    // with the device's message if one failed.
    virtual void wait() = 0;
};

class Device {
public:
    virtual ~Device() = default;
    virtual const char* name() const = 0;
    // A zero-filled shared-storage buffer.
    virtual std::unique_ptr<DeviceBuffer> new_buffer(uint64_t bytes) = 0;
    // A buffer over existing memory, never copied (newBufferWithBytesNoCopy): base must be
    // page-aligned and bytes a multiple of the page size, bytes ≤ max_buffer_length().
    virtual std::unique_ptr<DeviceBuffer> wrap_no_copy(void* base, uint64_t bytes) = 0;
    virtual uint64_t max_buffer_length() const = 0;
    virtual uint64_t page_size() const = 0;
    // Cached by (kernel, constants): the same object for the same key.
    virtual const Pipeline& pipeline(const std::string& kernel, const std::vector<FunctionConstant>& constants) = 0;
    virtual std::unique_ptr<Queue> new_queue() = 0;
};

}  // namespace metal
}  // namespace backend
}  // namespace ds4
