#include "backend/metal/model_views.h"

#include <string>

#include "common/errors.h"

namespace ds4 {
namespace backend {
namespace metal {

namespace {

uint64_t round_up(uint64_t x, uint64_t m) { return (x + m - 1) / m * m; }

std::string range_text(uint64_t at, uint64_t bytes) {
    return std::to_string(bytes) + " bytes at offset " + std::to_string(at);
}

}  // namespace

size_t ViewLayout::view_of(uint64_t at, uint64_t bytes) const {
    if (count == 0 || at + bytes > span) {
        fail(ErrorKind::InvalidArgument, "metal model views: " + range_text(at, bytes) +
                                             " is outside the mapping (" + std::to_string(span) + " bytes)");
    }
    // The last view starting at or before `at` is the only candidate: an earlier one ends sooner,
    // a later one starts after it.
    size_t k = (size_t)(at / stride);
    if (k >= count) k = count - 1;
    if (at + bytes > start(k) + length(k)) {
        fail(ErrorKind::InvalidArgument,
             "metal model views: " + range_text(at, bytes) + " straddles two views (views of " +
                 std::to_string(view_bytes) + " bytes overlap by " + std::to_string(view_bytes - stride) +
                 " bytes, planned for a largest tensor no larger than that)");
    }
    return k;
}

ViewLayout plan_views(uintptr_t base, uint64_t size, uint64_t largest_tensor, uint64_t page_size,
                      uint64_t max_buffer_length) {
    if (page_size == 0) fail(ErrorKind::InvalidArgument, "metal model views: the device reports a page size of 0");
    ViewLayout v;
    if (size == 0) return v;
    v.lead = (uint64_t)(base % page_size);
    v.span = round_up(v.lead + size, page_size);
    const uint64_t longest = max_buffer_length / page_size * page_size;   // whole pages only
    if (longest == 0) {
        fail(ErrorKind::Unsupported, "metal model views: the device's max buffer length (" +
                                         std::to_string(max_buffer_length) + " bytes) is below one page (" +
                                         std::to_string(page_size) + " bytes)");
    }
    if (v.span <= longest) {   // one view holds everything
        v.view_bytes = v.stride = v.span;
        v.count = 1;
        return v;
    }
    // Views overlap by the largest tensor rounded up to pages; each next view starts one stride
    // later, so a tensor starting less than a stride into a view ends inside it.
    const uint64_t largest = largest_tensor ? largest_tensor : size;
    const uint64_t overlap = round_up(largest, page_size);
    if (overlap >= longest) {
        fail(ErrorKind::Unsupported,
             "metal: a tensor of " + std::to_string(largest) +
                 " bytes cannot be placed in one Metal buffer: the device's max buffer length is " +
                 std::to_string(max_buffer_length) + " bytes and its page size " + std::to_string(page_size) +
                 " bytes, so a model of " + std::to_string(size) +
                 " bytes is split into views that can each hold a tensor of at most " +
                 std::to_string(longest - page_size) + " bytes");
    }
    v.view_bytes = longest;
    v.stride = longest - overlap;
    v.count = (size_t)(1 + (v.span - longest + v.stride - 1) / v.stride);
    return v;
}

ModelViews::ModelViews(Device& dev, const void* base, uint64_t size, uint64_t largest_tensor)
    : base_(static_cast<const uint8_t*>(base)), size_(size) {
    layout_ = plan_views((uintptr_t)base, size, largest_tensor, dev.page_size(), dev.max_buffer_length());
    // Metal's no-copy wrapper takes a non-const pointer; the weights are only ever read.
    uint8_t* first_page = const_cast<uint8_t*>(base_) - layout_.lead;
    views_.reserve(layout_.count);
    for (size_t k = 0; k < layout_.count; ++k) {
        views_.push_back(dev.wrap_no_copy(first_page + layout_.start(k), layout_.length(k)));
    }
}

ViewLocation ModelViews::locate(uint64_t offset, uint64_t bytes) const {
    if (offset > size_ || bytes > size_ - offset) {
        fail(ErrorKind::InvalidArgument, "metal model views: " + range_text(offset, bytes) +
                                             " is outside the mapped model (" + std::to_string(size_) + " bytes)");
    }
    const uint64_t at = layout_.lead + offset;
    const size_t k = layout_.view_of(at, bytes);
    return {views_[k].get(), k, at - layout_.start(k)};
}

ViewLocation ModelViews::locate(const void* p, uint64_t bytes) const {
    if (!contains(p)) fail(ErrorKind::InvalidArgument, "metal model views: a weight address outside the mapped model");
    return locate((uint64_t)(static_cast<const uint8_t*>(p) - base_), bytes);
}

bool ModelViews::contains(const void* p) const {
    const uint8_t* q = static_cast<const uint8_t*>(p);
    return q >= base_ && q <= base_ + size_;
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
