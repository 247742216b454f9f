// Device-neutral memory of a backend: a Buffer is one allocation a backend owns (host memory on
// the CPU, an MTLBuffer on Metal, device memory on CUDA); a Tensor is a typed, shaped window into
// one buffer (buffer + byte offset + dims). Tensors are plain values: making a view of a row or a
// range of rows allocates nothing, so the graph builds its per-token arguments for free.
#pragma once
#include <array>
#include <cstdint>

namespace ds4 {
namespace backend {

// Element types of activations and state (weights keep their GGML type, see model/tensor.h).
enum class DType : uint32_t { F32 = 0, F16 = 1, I32 = 2, U8 = 3 };

inline int64_t dtype_size(DType t) { return t == DType::F32 || t == DType::I32 ? 4 : t == DType::F16 ? 2 : 1; }

class Buffer {
public:
    virtual ~Buffer() = default;
    uint64_t size() const { return size_; }
    // The CPU address of byte 0 when the CPU can read and write this memory directly (CPU backend,
    // Apple unified memory); nullptr for device-only memory (use Stream::upload / download).
    void* host() const { return host_; }

protected:
    Buffer(void* host, uint64_t size) : host_(host), size_(size) {}
    void* host_;
    uint64_t size_;
};

struct Tensor {
    Buffer* buffer = nullptr;
    uint64_t offset = 0;                      // bytes from the start of buffer
    DType type = DType::F32;
    std::array<int64_t, 2> ne{{0, 1}};        // ne[0]: contiguous row width, ne[1]: rows

    explicit operator bool() const noexcept { return buffer != nullptr; }
    int64_t width() const { return ne[0]; }
    int64_t rows() const { return ne[1]; }
    int64_t row_bytes() const { return ne[0] * dtype_size(type); }
    int64_t nbytes() const { return row_bytes() * ne[1]; }

    // Rows [r0, r0 + n) as a tensor of the same width.
    Tensor rows(int64_t r0, int64_t n) const {
        Tensor t = *this;
        t.offset = offset + (uint64_t)(r0 * row_bytes());
        t.ne[1] = n;
        return t;
    }
    Tensor row(int64_t r) const { return rows(r, 1); }
    // Elements [e0, e0 + n) of a tensor read as one flat row.
    Tensor span(int64_t e0, int64_t n) const {
        Tensor t = *this;
        t.offset = offset + (uint64_t)(e0 * dtype_size(type));
        t.ne = {{n, 1}};
        return t;
    }
    // The same bytes read as rows of another width (width must divide the element count).
    Tensor reshape(int64_t width) const {
        Tensor t = *this;
        t.ne = {{width, ne[0] * ne[1] / width}};
        return t;
    }

    // Host address of the first element: only for host-visible buffers (CPU-side code and tests).
    template <class T>
    T* host() const {
        return reinterpret_cast<T*>(static_cast<uint8_t*>(buffer->host()) + offset);
    }
};

// A tensor over a whole buffer.
inline Tensor tensor_of(Buffer* b, DType t, int64_t width, int64_t rows) {
    Tensor x;
    x.buffer = b;
    x.type = t;
    x.ne = {{width, rows}};
    return x;
}

}  // namespace backend
}  // namespace ds4
