// A zero-initialised float buffer backed by calloc: large compressed-row caches (GBs at long
// contexts) cost address space at session creation and physical memory only as rows are written.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace ds4 {

class RowBuffer {
public:
    void assign_zeroed(size_t n) {
        float* p = n ? static_cast<float*>(std::calloc(n, sizeof(float))) : nullptr;
        if (n && !p) throw std::bad_alloc();
        ptr_.reset(p);
        size_ = n;
    }
    float* data() noexcept { return ptr_.get(); }
    const float* data() const noexcept { return ptr_.get(); }
    size_t size() const noexcept { return size_; }

private:
    struct Free {
        void operator()(float* p) const noexcept { std::free(p); }
    };
    std::unique_ptr<float, Free> ptr_;
    size_t size_ = 0;
};

}  // namespace ds4
