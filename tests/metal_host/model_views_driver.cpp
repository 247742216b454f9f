// Test driver for csrc/backend/metal/model_views.cpp: a fake metal::Device with a small page and
// max buffer length that records every no-copy wrap and counts copies (new_buffer calls), behind
// a C ABI that tests/metal_host/test_model_views.py drives through ctypes. The mapping addresses
// are never dereferenced, so the tests use made-up addresses.
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "backend/metal/model_views.h"

using namespace ds4::backend::metal;

namespace {

class FakeBuffer final : public DeviceBuffer {
public:
    FakeBuffer(void* p, uint64_t n) : p_(p), n_(n) {}
    void* contents() const override { return p_; }
    uint64_t length() const override { return n_; }

private:
    void* p_;
    uint64_t n_;
};

struct Wrap {
    uint64_t ptr, bytes;
};

class FakeDevice final : public Device {
public:
    FakeDevice(uint64_t page, uint64_t max_len) : page_(page), max_(max_len) {}
    const char* name() const override { return "fake"; }
    std::unique_ptr<DeviceBuffer> new_buffer(uint64_t bytes) override {
        ++copies;
        return std::make_unique<FakeBuffer>(nullptr, bytes);
    }
    std::unique_ptr<DeviceBuffer> wrap_no_copy(void* base, uint64_t bytes) override {
        wraps.push_back({(uint64_t)(uintptr_t)base, bytes});
        return std::make_unique<FakeBuffer>(base, bytes);
    }
    uint64_t max_buffer_length() const override { return max_; }
    uint64_t page_size() const override { return page_; }
    const Pipeline& pipeline(const std::string&, const std::vector<FunctionConstant>&) override { throw 0; }
    std::unique_ptr<Queue> new_queue() override { return nullptr; }

    std::vector<Wrap> wraps;
    int copies = 0;

private:
    uint64_t page_, max_;
};

struct Handle {
    FakeDevice dev;
    std::unique_ptr<ModelViews> views;
    Handle(uint64_t page, uint64_t max_len) : dev(page, max_len) {}
};

void put_error(const std::exception& e, char* err, size_t cap) {
    std::strncpy(err, e.what(), cap - 1);
    err[cap - 1] = 0;
}

}  // namespace

extern "C" {

// 0 and *out on success; 1 and the error text otherwise.
int views_build(uint64_t base, uint64_t size, uint64_t largest, uint64_t page, uint64_t max_len, void** out,
                char* err, size_t cap) {
    auto h = std::make_unique<Handle>(page, max_len);
    try {
        h->views = std::make_unique<ModelViews>(h->dev, (const void*)(uintptr_t)base, size, largest);
    } catch (const std::exception& e) {
        put_error(e, err, cap);
        return 1;
    }
    *out = h.release();
    return 0;
}

void views_free(void* h) { delete static_cast<Handle*>(h); }

int views_count(void* h) { return (int)static_cast<Handle*>(h)->views->count(); }
int views_copies(void* h) { return static_cast<Handle*>(h)->dev.copies; }
int views_wraps(void* h) { return (int)static_cast<Handle*>(h)->dev.wraps.size(); }

// What the device was asked to wrap for view k, and what the view buffer reports.
void views_view(void* h, int k, uint64_t* wrap_ptr, uint64_t* wrap_bytes, uint64_t* contents, uint64_t* length) {
    Handle* x = static_cast<Handle*>(h);
    *wrap_ptr = x->dev.wraps[k].ptr;
    *wrap_bytes = x->dev.wraps[k].bytes;
    *contents = (uint64_t)(uintptr_t)x->views->view(k).contents();
    *length = x->views->view(k).length();
}

// by_address: locate by host pointer (base + offset) instead of by offset.
int views_locate(void* h, uint64_t offset, uint64_t bytes, int by_address, uint64_t* view, uint64_t* contents,
                 uint64_t* in_view, char* err, size_t cap) {
    Handle* x = static_cast<Handle*>(h);
    try {
        ViewLocation at = by_address ? x->views->locate(x->views->base() + offset, bytes)
                                     : x->views->locate(offset, bytes);
        *view = at.view;
        *contents = (uint64_t)(uintptr_t)at.buffer->contents();
        *in_view = at.offset;
    } catch (const std::exception& e) {
        put_error(e, err, cap);
        return 1;
    }
    return 0;
}

}  // extern "C"
