// The mapped model file as no-copy device buffers (docs/metal.md, "Weights: views of the mapping").
//
// A Metal buffer is at most Device::max_buffer_length() bytes and a no-copy buffer must start on
// a page and span whole pages, while a GGUF file may be larger than one buffer. So the mapping is
// covered by page-aligned views of equal length, each starting `stride` bytes after the previous
// one and overlapping it by at least the largest tensor's size: every tensor then lies wholly
// inside one view (the one starting at or before it, closest to it), and a kernel binds that view
// at the tensor's offset inside it. Nothing is ever copied: each view wraps the mapped pages.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/metal/encoder.h"

namespace ds4 {
namespace backend {
namespace metal {

// The arithmetic of the views, relative to the first page of the mapping (pure: no device).
struct ViewLayout {
    uint64_t lead = 0;         // bytes from the first page to the mapping's first byte
    uint64_t span = 0;         // bytes from the first page to the end of the mapping's last page
    uint64_t view_bytes = 0;   // length of every view but the last (a multiple of the page)
    uint64_t stride = 0;       // distance between view starts (view_bytes - overlap)
    size_t count = 0;

    uint64_t start(size_t k) const { return (uint64_t)k * stride; }
    uint64_t length(size_t k) const { return k + 1 < count ? view_bytes : span - start(k); }
    // The view holding [at, at + bytes) (relative to the first page); throws InvalidArgument
    // when none does (a range larger than the tensor size the overlap was planned for).
    size_t view_of(uint64_t at, uint64_t bytes) const;
};

// Plans the views of `size` bytes at address `base`. `largest_tensor` is the byte size of the
// largest range that must not straddle two views (0: the whole mapping is one such range).
// Throws Unsupported naming the limits when that range cannot fit in one view.
ViewLayout plan_views(uintptr_t base, uint64_t size, uint64_t largest_tensor, uint64_t page_size,
                      uint64_t max_buffer_length);

// Where a byte range of the mapping lies: the view and the offset inside it.
struct ViewLocation {
    const DeviceBuffer* buffer = nullptr;
    size_t view = 0;
    uint64_t offset = 0;
};

class ModelViews {
public:
    // Wraps [base, base + size) with Device::wrap_no_copy (the memory must stay mapped while the
    // views live). Throws Unsupported when a tensor of `largest_tensor` bytes cannot fit one view.
    ModelViews(Device& dev, const void* base, uint64_t size, uint64_t largest_tensor);

    // The view holding the `bytes` bytes at `offset` from base (offset + bytes <= size).
    ViewLocation locate(uint64_t offset, uint64_t bytes) const;
    // The same for a host address inside the mapping.
    ViewLocation locate(const void* p, uint64_t bytes) const;
    bool contains(const void* p) const;

    const uint8_t* base() const { return base_; }
    uint64_t size() const { return size_; }
    size_t count() const { return views_.size(); }
    const DeviceBuffer& view(size_t k) const { return *views_[k]; }
    const ViewLayout& layout() const { return layout_; }

private:
    const uint8_t* base_;
    uint64_t size_;
    ViewLayout layout_;
    std::vector<std::unique_ptr<DeviceBuffer>> views_;
};

}  // namespace metal
}  // namespace backend
}  // namespace ds4
