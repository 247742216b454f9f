#include "backend/metal/emu_device.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <vector>

#include "common/errors.h"

extern "C" {
#include "../../../metal/emu/ds4_metal_emu.h"
}

namespace ds4 {
namespace backend {
namespace metal {

namespace {

// The entry points of one loaded library. Never unloaded: devices created from it keep using it
// for the life of the process (dlclose under a live device would unmap its kernels).
struct EmuApi {
    std::string path;
    int (*dispatch_run)(const ds4emu_dispatch*, char*, size_t) = nullptr;
    uint32_t (*kernel_count)() = nullptr;
    const char* (*kernel_name)(uint32_t) = nullptr;
    int (*kernel_constant)(const char*, uint32_t, uint32_t*, uint32_t*, const char**) = nullptr;
    uint32_t (*max_threads)() = nullptr;
    uint32_t (*max_tg_memory)() = nullptr;
};

std::mutex g_api_mutex;
const EmuApi* g_api = nullptr;

template <class F>
void bind_symbol(void* handle, const char* name, F& out, const std::string& path) {
    void* sym = dlsym(handle, name);
    if (!sym) fail(ErrorKind::Unsupported, "metal-emu: " + path + " is not a Metal emulator library (no " + name + ")");
    out = reinterpret_cast<F>(sym);
}

const EmuApi& api() {
    std::lock_guard<std::mutex> lock(g_api_mutex);
    if (!g_api) {
        fail(ErrorKind::Unsupported,
             "metal-emu: the emulator library is not loaded (ds4.Engine(..., backend='metal-emu') builds it with "
             "clang and loads it)");
    }
    return *g_api;
}

// ---------------------------------------------------------------------------------------------

class EmuBuffer final : public DeviceBuffer {
public:
    EmuBuffer(void* p, uint64_t n, bool owned) : p_(p), n_(n), owned_(owned) {}
    ~EmuBuffer() override {
        if (owned_) std::free(p_);
    }
    void* contents() const override { return p_; }
    uint64_t length() const override { return n_; }

private:
    void* p_;
    uint64_t n_;
    bool owned_;
};

class EmuPipeline final : public Pipeline {
public:
    EmuPipeline(std::string kernel, std::vector<FunctionConstant> constants, uint32_t max_threads)
        : kernel_(std::move(kernel)), constants_(std::move(constants)), max_threads_(max_threads) {
        values_.resize(constants_.size());
        for (size_t i = 0; i < constants_.size(); ++i) {
            const FunctionConstant& c = constants_[i];
            if (c.kind == FunctionConstant::Kind::Bool) {
                bool_bytes_.push_back(c.bits ? 1 : 0);
            }
        }
        size_t b = 0;
        for (size_t i = 0; i < constants_.size(); ++i) {
            const FunctionConstant& c = constants_[i];
            const void* value = c.kind == FunctionConstant::Kind::Bool ? (const void*)&bool_bytes_[b++]
                                                                        : (const void*)&constants_[i].bits;
            values_[i] = ds4emu_constant{c.index, c.size(), value};
        }
    }
    const std::string& kernel() const override { return kernel_; }
    uint32_t max_threads_per_threadgroup() const override { return max_threads_; }
    uint32_t thread_execution_width() const override { return 32; }
    const std::vector<ds4emu_constant>& values() const { return values_; }

private:
    std::string kernel_;
    std::vector<FunctionConstant> constants_;
    std::vector<uint8_t> bool_bytes_;
    std::vector<ds4emu_constant> values_;
    uint32_t max_threads_;
};

// One recorded command of a command buffer.
struct Command {
    enum class Kind { Dispatch, Copy } kind = Kind::Dispatch;
    const EmuPipeline* pipeline = nullptr;
    std::vector<ds4emu_buffer> buffers;
    std::vector<uint32_t> tg_mem;
    Size3 grid, threads;
    bool grid_is_threads = false;
    // Copy
    const uint8_t* src = nullptr;
    uint8_t* dst = nullptr;
    uint64_t bytes = 0;
};

struct RunOrder {
    int order = DS4EMU_ORDER_FORWARD;
    uint64_t seed = 0;
};

RunOrder order_from_env() {
    RunOrder o;
    const char* e = std::getenv("DS4_METAL_EMU_ORDER");
    if (!e || !*e || !std::strcmp(e, "forward")) return o;
    if (!std::strcmp(e, "reverse")) {
        o.order = DS4EMU_ORDER_REVERSE;
        return o;
    }
    if (!std::strncmp(e, "shuffle", 7)) {
        o.order = DS4EMU_ORDER_SHUFFLE;
        if (e[7] == ':') o.seed = std::strtoull(e + 8, nullptr, 10);
        return o;
    }
    fail(ErrorKind::InvalidArgument,
         std::string("DS4_METAL_EMU_ORDER='") + e + "': expected forward, reverse or shuffle[:seed]");
}

class EmuEncoder final : public Encoder {
public:
    explicit EmuEncoder(std::vector<Command>& cmds, std::vector<std::vector<uint8_t>>& inline_bytes)
        : cmds_(cmds), inline_(inline_bytes) {}

    void set_pipeline(const Pipeline& p) override { pipeline_ = static_cast<const EmuPipeline*>(&p); }
    void set_buffer(uint32_t index, const DeviceBuffer& b, uint64_t offset) override {
        slot(index) = ds4emu_buffer{b.contents(), offset, b.length(), 0};
    }
    void set_bytes(uint32_t index, const void* data, uint32_t bytes) override {
        if (bytes > 4096) fail(ErrorKind::InvalidArgument, "metal-emu: set_bytes of more than 4 KiB (Metal's limit)");
        // Owned by the command buffer until it has run; a deque-like list keeps addresses stable.
        inline_.emplace_back((const uint8_t*)data, (const uint8_t*)data + bytes);
        inline_.back().resize(std::max<uint32_t>(bytes, 16));
        slot(index) = ds4emu_buffer{inline_.back().data(), 0, bytes, 0};
    }
    void set_threadgroup_memory(uint32_t index, uint32_t bytes) override {
        if (tg_mem_.size() <= index) tg_mem_.resize(index + 1, 0);
        tg_mem_[index] = bytes;
    }
    void dispatch_threadgroups(Size3 groups, Size3 threads_per_group) override {
        record(groups, threads_per_group, false);
    }
    void dispatch_threads(Size3 threads, Size3 threads_per_group) override { record(threads, threads_per_group, true); }
    // Dispatches run one after another in the emulator: every dispatch is ordered already.
    void barrier() override {}
    void copy(const DeviceBuffer& src, uint64_t src_off, const DeviceBuffer& dst, uint64_t dst_off,
              uint64_t bytes) override {
        if (src_off + bytes > src.length() || dst_off + bytes > dst.length()) {
            fail(ErrorKind::InvalidArgument, "metal-emu: copy past the end of a buffer");
        }
        Command c;
        c.kind = Command::Kind::Copy;
        c.src = static_cast<const uint8_t*>(src.contents()) + src_off;
        c.dst = static_cast<uint8_t*>(dst.contents()) + dst_off;
        c.bytes = bytes;
        cmds_.push_back(std::move(c));
    }

private:
    ds4emu_buffer& slot(uint32_t index) {
        if (index >= 31) fail(ErrorKind::InvalidArgument, "metal-emu: buffer index past Metal's 31");
        if (buffers_.size() <= index) buffers_.resize(index + 1, ds4emu_buffer{nullptr, 0, 0, 0});
        return buffers_[index];
    }
    void record(Size3 grid, Size3 threads, bool is_threads) {
        if (!pipeline_) fail(ErrorKind::InvalidArgument, "metal-emu: dispatch without a pipeline");
        Command c;
        c.pipeline = pipeline_;
        c.buffers = buffers_;
        c.tg_mem = tg_mem_;
        c.grid = grid;
        c.threads = threads;
        c.grid_is_threads = is_threads;
        cmds_.push_back(std::move(c));
    }

    std::vector<Command>& cmds_;
    std::vector<std::vector<uint8_t>>& inline_;
    const EmuPipeline* pipeline_ = nullptr;
    std::vector<ds4emu_buffer> buffers_;
    std::vector<uint32_t> tg_mem_;
};

class EmuQueue final : public Queue {
public:
    EmuQueue(const EmuApi& api, RunOrder order) : api_(api), order_(order) {}

    Encoder& encoder() override {
        if (!open_) {
            // A fresh encoder per command buffer: no state (pipeline, bindings) leaks across.
            enc_ = std::make_unique<EmuEncoder>(cmds_, inline_);
            open_ = true;
        }
        return *enc_;
    }

    // Runs the command buffer now (the emulator is synchronous); a failure is kept for wait(),
    // the way a GPU reports a failed command buffer at completion, and the rest of it is skipped.
    void commit() override {
        if (!open_) return;
        open_ = false;
        for (const Command& c : cmds_) {
            if (!error_.empty()) break;
            if (c.kind == Command::Kind::Copy) {
                std::memmove(c.dst, c.src, (size_t)c.bytes);
                continue;
            }
            run(c);
        }
        cmds_.clear();
        inline_.clear();
        enc_.reset();
    }

    void wait() override {
        if (error_.empty()) return;
        const std::string msg = std::move(error_);
        error_.clear();
        fail(ErrorKind::Internal, msg);
    }

private:
    void run(const Command& c) {
        ds4emu_dispatch d{};
        d.kernel = c.pipeline->kernel().c_str();
        d.constants = c.pipeline->values().data();
        d.n_constants = (uint32_t)c.pipeline->values().size();
        d.buffers = c.buffers.data();
        d.n_buffers = (uint32_t)c.buffers.size();
        d.tg_mem = c.tg_mem.data();
        d.n_tg_mem = (uint32_t)c.tg_mem.size();
        d.grid[0] = c.grid.x;
        d.grid[1] = c.grid.y;
        d.grid[2] = c.grid.z;
        d.threads[0] = c.threads.x;
        d.threads[1] = c.threads.y;
        d.threads[2] = c.threads.z;
        d.grid_is_threads = c.grid_is_threads ? 1 : 0;
        d.order = order_.order;
        d.seed = order_.seed;
        char err[1024] = {0};
        if (api_.dispatch_run(&d, err, sizeof err) != 0) {
            error_ = "metal-emu: kernel " + c.pipeline->kernel() + " failed: " + (err[0] ? err : "(no message)");
        }
    }

    const EmuApi& api_;
    RunOrder order_;
    bool open_ = false;
    std::vector<Command> cmds_;
    std::vector<std::vector<uint8_t>> inline_;
    std::unique_ptr<EmuEncoder> enc_;
    std::string error_;
};

class EmuDevice final : public Device {
public:
    EmuDevice(const EmuApi& api, RunOrder order) : api_(api), order_(order) {
        for (uint32_t i = 0; i < api_.kernel_count(); ++i) kernels_.emplace(api_.kernel_name(i));
        page_ = (uint64_t)sysconf(_SC_PAGESIZE);
        const char* e = std::getenv("DS4_METAL_EMU_MAX_BUFFER");   // read per device: tests set it
        max_len_ = e && *e ? std::strtoull(e, nullptr, 10) : (uint64_t)1 << 32;
    }
    const char* name() const override { return "metal-emu"; }

    std::unique_ptr<DeviceBuffer> new_buffer(uint64_t bytes) override {
        // calloc: large caches cost physical pages only as rows are written (as on the CPU backend).
        void* p = std::calloc((size_t)std::max<uint64_t>(bytes, 1), 1);
        if (!p) throw std::bad_alloc();
        return std::make_unique<EmuBuffer>(p, bytes, true);
    }

    // The same rules as newBufferWithBytesNoCopy, so code that passes here passes on a Mac.
    std::unique_ptr<DeviceBuffer> wrap_no_copy(void* base, uint64_t bytes) override {
        if ((uintptr_t)base % page_ || bytes % page_ || bytes == 0) {
            fail(ErrorKind::InvalidArgument, "metal-emu: wrap_no_copy needs a page-aligned base and length");
        }
        if (bytes > max_buffer_length()) fail(ErrorKind::InvalidArgument, "metal-emu: wrap_no_copy past max_buffer_length");
        return std::make_unique<EmuBuffer>(base, bytes, false);
    }

    // Apple Silicon reports about half of the unified memory; a fixed, smaller value here makes
    // the multi-view path of the model mapping run in tests (DS4_METAL_EMU_MAX_BUFFER overrides).
    uint64_t max_buffer_length() const override { return max_len_; }
    uint64_t page_size() const override { return page_; }

    const Pipeline& pipeline(const std::string& kernel, const std::vector<FunctionConstant>& constants) override {
        std::string key = kernel;
        for (const FunctionConstant& c : constants) {
            key += '|' + std::to_string(c.index) + ':' + std::to_string((int)c.kind) + ':' + std::to_string(c.bits);
        }
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = cache_.find(key);
        if (it != cache_.end()) return *it->second;
        if (!kernels_.count(kernel)) {
            fail(ErrorKind::Internal, "metal-emu: no kernel '" + kernel + "' in " + api_.path);
        }
        auto p = std::make_unique<EmuPipeline>(kernel, constants, api_.max_threads());
        const Pipeline& ref = *p;
        cache_.emplace(key, std::move(p));
        return ref;
    }

    std::unique_ptr<Queue> new_queue() override { return std::make_unique<EmuQueue>(api_, order_); }

private:
    const EmuApi& api_;
    RunOrder order_;
    uint64_t page_ = 4096;
    uint64_t max_len_ = 0;
    std::mutex mutex_;
    std::map<std::string, std::unique_ptr<EmuPipeline>> cache_;
    std::set<std::string> kernels_;
};

}  // namespace

void load_emu_library(const std::string& path) {
    std::lock_guard<std::mutex> lock(g_api_mutex);
    if (g_api && g_api->path == path) return;
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char* e = dlerror();
        fail(ErrorKind::Unsupported, "metal-emu: cannot load " + path + ": " + (e ? e : "dlopen failed"));
    }
    auto* a = new EmuApi;   // never freed: see EmuApi
    a->path = path;
    bind_symbol(h, "ds4emu_dispatch_run", a->dispatch_run, path);
    bind_symbol(h, "ds4emu_kernel_count", a->kernel_count, path);
    bind_symbol(h, "ds4emu_kernel_name", a->kernel_name, path);
    bind_symbol(h, "ds4emu_kernel_constant", a->kernel_constant, path);
    bind_symbol(h, "ds4emu_max_threads_per_threadgroup", a->max_threads, path);
    bind_symbol(h, "ds4emu_max_threadgroup_memory", a->max_tg_memory, path);
    g_api = a;
}

std::string emu_library_path() {
    std::lock_guard<std::mutex> lock(g_api_mutex);
    return g_api ? g_api->path : std::string();
}

std::unique_ptr<Device> make_emu_device() { return std::make_unique<EmuDevice>(api(), order_from_env()); }

}  // namespace metal
}  // namespace backend
}  // namespace ds4
