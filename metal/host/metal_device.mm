// The Objective-C++ implementation of the neutral encoder API (csrc/backend/metal/encoder.h) over
// Apple's Metal: what maps to what, and the threading rules, are in docs/metal.md ("The
// Objective-C++ host"). Built on Apple platforms only; on Linux it is syntax-checked against the
// stub headers in metal/host/stub (tests/metal_host/test_objc_syntax.py).
//
// Compiled with ARC (-fobjc-arc): Objective-C object pointers held in C++ members are strong
// references released with their owner. Every entry point runs inside @autoreleasepool because
// the calling threads (Python's, the server's) have no pool of their own.
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/errors.h"
#include "metal_device.h"
#include "source_bundle.h"

namespace ds4 {
namespace backend {
namespace metal {

namespace {

std::string text_of(NSError* error) {
    if (!error) return "no error description";
    NSString* s = error.localizedDescription;
    return s ? std::string([s UTF8String]) : std::string("no error description");
}

NSString* ns_string(const std::string& s) { return [NSString stringWithUTF8String:s.c_str()]; }

uint64_t page_bytes() { return (uint64_t)sysconf(_SC_PAGESIZE); }

uint64_t round_up(uint64_t x, uint64_t m) { return (x + m - 1) / m * m; }

// ---- buffers ------------------------------------------------------------------------------------

class AppleBuffer final : public DeviceBuffer {
public:
    AppleBuffer(id<MTLBuffer> b, uint64_t length) : buffer_(b), length_(length) {}
    void* contents() const override { return [buffer_ contents]; }
    uint64_t length() const override { return length_; }
    id<MTLBuffer> mtl() const { return buffer_; }

private:
    id<MTLBuffer> buffer_;
    uint64_t length_;   // the length asked for (the MTLBuffer spans whole pages)
};

id<MTLBuffer> mtl_of(const DeviceBuffer& b) { return static_cast<const AppleBuffer&>(b).mtl(); }

// ---- pipelines ----------------------------------------------------------------------------------

class ApplePipeline final : public Pipeline {
public:
    ApplePipeline(std::string kernel, id<MTLComputePipelineState> state) : kernel_(std::move(kernel)), state_(state) {}
    const std::string& kernel() const override { return kernel_; }
    uint32_t max_threads_per_threadgroup() const override { return (uint32_t)state_.maxTotalThreadsPerThreadgroup; }
    uint32_t thread_execution_width() const override { return (uint32_t)state_.threadExecutionWidth; }
    id<MTLComputePipelineState> state() const { return state_; }

private:
    std::string kernel_;
    id<MTLComputePipelineState> state_;
};

MTLDataType data_type(FunctionConstant::Kind k) {
    switch (k) {
        case FunctionConstant::Kind::Bool: return MTLDataTypeBool;
        case FunctionConstant::Kind::Int32: return MTLDataTypeInt;
        case FunctionConstant::Kind::UInt32: return MTLDataTypeUInt;
        case FunctionConstant::Kind::Float: return MTLDataTypeFloat;
    }
    return MTLDataTypeUInt;
}

std::string pipeline_key(const std::string& kernel, std::vector<FunctionConstant> constants) {
    std::sort(constants.begin(), constants.end(),
              [](const FunctionConstant& a, const FunctionConstant& b) { return a.index < b.index; });
    std::string key = kernel;
    for (const FunctionConstant& c : constants) {
        key += "|" + std::to_string(c.index) + ":" + std::to_string((int)c.kind) + ":" + std::to_string(c.bits);
    }
    return key;
}

// ---- encoding -----------------------------------------------------------------------------------

// Metal's compute encoder state does not survive an encoder switch, but encoder.h promises that a
// dispatch sees the state set before it even across a copy (which needs a blit encoder). So the
// state is shadowed here and replayed onto each new compute encoder.
struct BoundState {
    const ApplePipeline* pipeline = nullptr;
    std::map<uint32_t, std::pair<id<MTLBuffer>, uint64_t>> buffers;
    std::map<uint32_t, std::vector<uint8_t>> bytes;
    std::map<uint32_t, uint32_t> threadgroup_memory;
};

class AppleEncoder final : public Encoder {
public:
    explicit AppleEncoder(MTLDispatchType dispatch) : dispatch_(dispatch) {}

    void begin(id<MTLCommandBuffer> cb) {
        cb_ = cb;
        state_ = BoundState();
    }
    // Ends the open encoder (compute or blit) of the command buffer.
    void end() {
        if (compute_) [compute_ endEncoding];
        if (blit_) [blit_ endEncoding];
        compute_ = nil;
        blit_ = nil;
    }
    void finish() {
        end();
        cb_ = nil;
    }

    void set_pipeline(const Pipeline& p) override {
        state_.pipeline = &static_cast<const ApplePipeline&>(p);
        if (compute_) [compute_ setComputePipelineState:state_.pipeline->state()];
    }
    void set_buffer(uint32_t index, const DeviceBuffer& b, uint64_t offset) override {
        state_.buffers[index] = {mtl_of(b), offset};
        state_.bytes.erase(index);
        if (compute_) [compute_ setBuffer:mtl_of(b) offset:(NSUInteger)offset atIndex:index];
    }
    void set_bytes(uint32_t index, const void* data, uint32_t bytes) override {
        if (bytes > 4096) fail(ErrorKind::InvalidArgument, "metal: set_bytes of " + std::to_string(bytes) + " bytes (setBytes takes at most 4096)");
        const uint8_t* p = static_cast<const uint8_t*>(data);
        state_.bytes[index].assign(p, p + bytes);
        state_.buffers.erase(index);
        if (compute_) [compute_ setBytes:data length:bytes atIndex:index];
    }
    void set_threadgroup_memory(uint32_t index, uint32_t bytes) override {
        state_.threadgroup_memory[index] = bytes;
        if (compute_) [compute_ setThreadgroupMemoryLength:bytes atIndex:index];
    }
    void dispatch_threadgroups(Size3 groups, Size3 threads) override {
        [compute() dispatchThreadgroups:MTLSizeMake(groups.x, groups.y, groups.z)
                  threadsPerThreadgroup:MTLSizeMake(threads.x, threads.y, threads.z)];
    }
    void dispatch_threads(Size3 grid, Size3 threads) override {
        [compute() dispatchThreads:MTLSizeMake(grid.x, grid.y, grid.z)
             threadsPerThreadgroup:MTLSizeMake(threads.x, threads.y, threads.z)];
    }
    void barrier() override {
        // A serial encoder already orders its dispatches; encoders of one command buffer run in
        // order with Metal's hazard tracking of the shared buffers.
        if (compute_ && dispatch_ == MTLDispatchTypeConcurrent) [compute_ memoryBarrierWithScope:MTLBarrierScopeBuffers];
    }
    void copy(const DeviceBuffer& src, uint64_t src_off, const DeviceBuffer& dst, uint64_t dst_off,
              uint64_t bytes) override {
        if (!bytes) return;
        if (compute_) {
            [compute_ endEncoding];
            compute_ = nil;
        }
        if (!blit_) {
            @autoreleasepool {   // the encoder is returned autoreleased; blit_ keeps it
                blit_ = [cb_ blitCommandEncoder];
            }
        }
        [blit_ copyFromBuffer:mtl_of(src) sourceOffset:(NSUInteger)src_off toBuffer:mtl_of(dst)
            destinationOffset:(NSUInteger)dst_off size:(NSUInteger)bytes];
    }

private:
    id<MTLComputeCommandEncoder> compute() {
        if (compute_) return compute_;
        if (blit_) {
            [blit_ endEncoding];
            blit_ = nil;
        }
        @autoreleasepool {   // the encoder is returned autoreleased; compute_ keeps it
            compute_ = [cb_ computeCommandEncoderWithDispatchType:dispatch_];
        }
        if (state_.pipeline) [compute_ setComputePipelineState:state_.pipeline->state()];
        for (const auto& b : state_.buffers) [compute_ setBuffer:b.second.first offset:(NSUInteger)b.second.second atIndex:b.first];
        for (const auto& b : state_.bytes) [compute_ setBytes:b.second.data() length:b.second.size() atIndex:b.first];
        for (const auto& t : state_.threadgroup_memory) [compute_ setThreadgroupMemoryLength:t.second atIndex:t.first];
        return compute_;
    }

    MTLDispatchType dispatch_;
    id<MTLCommandBuffer> cb_ = nil;
    id<MTLComputeCommandEncoder> compute_ = nil;
    id<MTLBlitCommandEncoder> blit_ = nil;
    BoundState state_;
};

// One command queue per stream (a session's work never shares a queue with another's). A Queue
// is used by one thread at a time: the stream that owns it is entered by one caller at a time.
class AppleQueue final : public Queue {
public:
    AppleQueue(id<MTLCommandQueue> q, MTLDispatchType dispatch) : queue_(q), encoder_(dispatch) {}
    ~AppleQueue() override {
        // Buffers the in-flight work uses may be freed right after this: wait for it first. Work
        // encoded but never committed is dropped (its results could not be read any more); its
        // encoder is ended first, as Metal requires before a release.
        @autoreleasepool {
            encoder_.finish();
            cb_ = nil;
            for (id<MTLCommandBuffer> cb : in_flight_) [cb waitUntilCompleted];
        }
    }

    Encoder& encoder() override {
        if (!cb_) {
            @autoreleasepool {
                cb_ = [queue_ commandBuffer];
            }
            if (!cb_) fail(ErrorKind::Io, "metal: the command queue returned no command buffer");
            encoder_.begin(cb_);
        }
        return encoder_;
    }
    void commit() override {
        if (!cb_) return;
        @autoreleasepool {
            encoder_.finish();
            [cb_ commit];
            in_flight_.push_back(cb_);
            cb_ = nil;
        }
    }
    void wait() override {
        std::string failures;
        @autoreleasepool {
            for (id<MTLCommandBuffer> cb : in_flight_) {
                [cb waitUntilCompleted];
                if (cb.status == MTLCommandBufferStatusError) {
                    failures += (failures.empty() ? "" : "; ") + text_of(cb.error);
                }
            }
            in_flight_.clear();
        }
        if (!failures.empty()) fail(ErrorKind::Internal, "metal: a command buffer failed on the GPU: " + failures);
    }

private:
    id<MTLCommandQueue> queue_;
    id<MTLCommandBuffer> cb_ = nil;
    std::vector<id<MTLCommandBuffer>> in_flight_;
    AppleEncoder encoder_;
};

// ---- the device ---------------------------------------------------------------------------------

// Where the .metal sources are at run time: $DS4_METAL_DIR, else ds4/metal/ next to the
// extension module (the wheel's package data), else the checkout this module was built from.
std::vector<std::string> source_dirs() {
    std::vector<std::string> dirs;
    if (const char* env = std::getenv("DS4_METAL_DIR")) {
        dirs.push_back(env);
        return dirs;
    }
    Dl_info info;
    if (dladdr((const void*)&make_apple_metal_device, &info) && info.dli_fname) {
        std::string so = info.dli_fname;
        const size_t slash = so.rfind('/');
        if (slash != std::string::npos) dirs.push_back(so.substr(0, slash) + "/metal");
    }
#ifdef DS4_METAL_SOURCE_DIR
    dirs.push_back(DS4_METAL_SOURCE_DIR);
#endif
    return dirs;
}

class AppleDevice final : public Device {
public:
    AppleDevice(id<MTLDevice> dev, MTLDispatchType dispatch) : dev_(dev), dispatch_(dispatch), page_(page_bytes()) {}

    // Compiles every .metal file into its own library (the files are separate translation units,
    // as in the emulator: file-local helpers and function-constant indices never collide).
    void compile(const std::string& dir) {
        const std::vector<MetalSource> sources = load_metal_sources(dir);
        std::string why;   // thrown after the pool is drained
        @autoreleasepool {
            MTLCompileOptions* options = [MTLCompileOptions new];
            // IEEE division and no denormal flushing: the bit-exact kernels rely on both; precise
            // exp/sin/cos: the float kernels' tolerances assume ulp-level functions (docs/metal.md,
            // "Math mode"). Without fast-math (before macOS 15) the precise functions are the default.
            if (@available(macOS 15.0, iOS 18.0, *)) {
                options.mathMode = MTLMathModeSafe;
                options.mathFloatingPointFunctions = MTLMathFloatingPointFunctionsPrecise;
            } else {
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
                options.fastMathEnabled = NO;   // deprecated by mathMode from macOS 15 on
#pragma clang diagnostic pop
            }
            for (const MetalSource& src : sources) {
                NSError* error = nil;
                id<MTLLibrary> lib = [dev_ newLibraryWithSource:ns_string(src.text) options:options error:&error];
                if (!lib) {
                    why = "compiling " + dir + "/" + src.file + " failed: " + text_of(error);
                    break;
                }
                NSArray<NSString*>* names = lib.functionNames;
                for (NSUInteger i = 0; i < names.count && why.empty(); ++i) {
                    const std::string name = [names[i] UTF8String];
                    if (libraries_.count(name)) why = "kernel '" + name + "' is defined in two .metal files (" + src.file + ")";
                    libraries_[name] = lib;
                }
                if (!why.empty()) break;
            }
        }
        if (!why.empty()) fail(ErrorKind::Unsupported, "metal: " + why);
    }

    const char* name() const override { return name_.c_str(); }

    std::unique_ptr<DeviceBuffer> new_buffer(uint64_t bytes) override {
        // Anonymous memory: zero-filled by the kernel and backed only where written, wrapped
        // without a copy; the deallocator unmaps it once Metal has released the buffer (after
        // the last command buffer using it completed).
        const uint64_t span = round_up(bytes ? bytes : 1, page_);
        if (span > max_buffer_length()) fail(ErrorKind::Unsupported, too_long(bytes));
        void* p = mmap(nullptr, (size_t)span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANON, -1, 0);
        if (p == MAP_FAILED) fail(ErrorKind::Io, "metal: cannot allocate a buffer of " + std::to_string(bytes) + " bytes");
        id<MTLBuffer> b = nil;
        @autoreleasepool {
            b = [dev_ newBufferWithBytesNoCopy:p
                                        length:(NSUInteger)span
                                       options:MTLResourceStorageModeShared
                                   deallocator:^(void* pointer, NSUInteger length) { munmap(pointer, length); }];
        }
        if (!b) {
            munmap(p, (size_t)span);
            fail(ErrorKind::Io, "metal: the device refused a buffer of " + std::to_string(bytes) + " bytes");
        }
        return std::make_unique<AppleBuffer>(b, bytes);
    }

    std::unique_ptr<DeviceBuffer> wrap_no_copy(void* base, uint64_t bytes) override {
        if ((uintptr_t)base % page_ || bytes % page_ || bytes == 0) {
            fail(ErrorKind::InvalidArgument, "metal: a no-copy buffer must start on a page and span whole pages (" +
                                                 std::to_string(bytes) + " bytes, page " + std::to_string(page_) + ")");
        }
        if (bytes > max_buffer_length()) fail(ErrorKind::Unsupported, too_long(bytes));
        id<MTLBuffer> b = nil;
        @autoreleasepool {
            // No deallocator: the memory (the model's mapping) belongs to the caller.
            b = [dev_ newBufferWithBytesNoCopy:base length:(NSUInteger)bytes options:MTLResourceStorageModeShared deallocator:nil];
        }
        if (!b) fail(ErrorKind::Io, "metal: the device refused to wrap " + std::to_string(bytes) + " mapped bytes");
        return std::make_unique<AppleBuffer>(b, bytes);
    }

    uint64_t max_buffer_length() const override { return (uint64_t)dev_.maxBufferLength; }
    uint64_t page_size() const override { return page_; }

    const Pipeline& pipeline(const std::string& kernel, const std::vector<FunctionConstant>& constants) override {
        const std::string key = pipeline_key(kernel, constants);
        std::lock_guard<std::mutex> lock(pipelines_mu_);
        auto hit = pipelines_.find(key);
        if (hit != pipelines_.end()) return *hit->second;
        auto lib = libraries_.find(kernel);
        if (lib == libraries_.end()) fail(ErrorKind::Unsupported, "metal: no kernel named '" + kernel + "' in metal/*.metal");
        id<MTLComputePipelineState> state = nil;
        std::string why;   // thrown after the pool is drained
        @autoreleasepool {
            MTLFunctionConstantValues* values = [MTLFunctionConstantValues new];
            for (const FunctionConstant& c : constants) {
                const bool flag = c.bits != 0;
                const void* value = c.kind == FunctionConstant::Kind::Bool ? (const void*)&flag : (const void*)&c.bits;
                [values setConstantValue:value type:data_type(c.kind) atIndex:c.index];
            }
            NSError* error = nil;
            id<MTLFunction> fn = [lib->second newFunctionWithName:ns_string(kernel) constantValues:values error:&error];
            if (!fn) {
                why = "specialising kernel '" + kernel + "' failed: " + text_of(error);
            } else {
                state = [dev_ newComputePipelineStateWithFunction:fn error:&error];
                if (!state) why = "building the pipeline of '" + kernel + "' failed: " + text_of(error);
            }
        }
        if (!state) fail(ErrorKind::Unsupported, "metal: " + why);
        auto p = std::make_unique<ApplePipeline>(kernel, state);
        const Pipeline& out = *p;
        pipelines_.emplace(key, std::move(p));
        return out;
    }

    std::unique_ptr<Queue> new_queue() override {
        id<MTLCommandQueue> q = nil;
        @autoreleasepool {
            q = [dev_ newCommandQueue];
        }
        if (!q) fail(ErrorKind::Io, "metal: the device returned no command queue");
        return std::make_unique<AppleQueue>(q, dispatch_);
    }

    void set_name(const std::string& n) { name_ = n; }

private:
    std::string too_long(uint64_t bytes) const {
        return "metal: a buffer of " + std::to_string(bytes) + " bytes exceeds the device's max buffer length of " +
               std::to_string(max_buffer_length()) + " bytes";
    }

    id<MTLDevice> dev_;
    MTLDispatchType dispatch_;
    uint64_t page_;
    std::string name_;
    std::map<std::string, id<MTLLibrary>> libraries_;   // kernel name -> the library defining it
    std::mutex pipelines_mu_;
    std::map<std::string, std::unique_ptr<ApplePipeline>> pipelines_;
};

}  // namespace

namespace {

// The Metal device, if it can run the kernels; else nil with *why set.
id<MTLDevice> usable_device(std::string* why) {
    id<MTLDevice> dev = MTLCreateSystemDefaultDevice();
    if (!dev) {
        *why = "metal: no Metal device on this machine";
        return nil;
    }
    // simdgroup_matrix and the simd collectives the kernels use need Apple family 7 (M1) or later.
    if (![dev supportsFamily:MTLGPUFamilyApple7]) {
        *why = std::string("metal: the GPU '") + [dev.name UTF8String] +
               "' is not Apple GPU family 7 or later (Apple Silicon M1+)";
        return nil;
    }
    return dev;
}

// The first folder of source_dirs() that exists, or "" with *why listing those tried.
std::string find_source_dir(std::string* why) {
    std::string tried;
    for (const std::string& dir : source_dirs()) {
        std::error_code ec;
        if (std::filesystem::is_directory(dir, ec)) return dir;
        tried += (tried.empty() ? "" : ", ") + dir;
    }
    *why = "metal: the kernel sources (ds4/metal/*.metal) were not found (looked in: " + tried +
           "; set DS4_METAL_DIR to a folder holding them)";
    return "";
}

}  // namespace

const std::string& apple_metal_unavailable_reason() {
    static const std::string reason = [] {
        std::string why;
        @autoreleasepool {
            if (usable_device(&why)) find_source_dir(&why);
        }
        return why;
    }();
    return reason;
}

std::unique_ptr<Device> make_apple_metal_device(std::string* why_not) {
    std::string why;
    std::unique_ptr<AppleDevice> device;
    @autoreleasepool {
        id<MTLDevice> dev = usable_device(&why);
        const std::string dir = dev ? find_source_dir(&why) : std::string();
        if (!dir.empty()) {
            // Serial encoders unless DS4_METAL_CONCURRENT=1 asks for concurrent ones ordered by the
            // dispatch layer's barriers (docs/metal.md).
            const char* conc = std::getenv("DS4_METAL_CONCURRENT");
            const MTLDispatchType dispatch =
                conc && std::string(conc) == "1" ? MTLDispatchTypeConcurrent : MTLDispatchTypeSerial;
            device = std::make_unique<AppleDevice>(dev, dispatch);
            device->set_name(std::string("metal (") + [dev.name UTF8String] + ")");
            try {
                device->compile(dir);
            } catch (const Error& e) {
                why = e.what();
                device.reset();
            }
        }
    }
    if (!device && why_not) *why_not = why;
    return device;
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
