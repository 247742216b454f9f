// A weight tensor bound in place inside the mapped model file, and the table of tensors the
// Python side read from the GGUF header (name, ggml type, dims in ggml order, absolute offset).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "quant/types.h"

namespace ds4 {

struct TensorDesc {
    std::string name;
    uint32_t type = 0;
    std::vector<int64_t> dims;   // ggml order: dims[0] is the contiguous (input) width
    uint64_t offset = 0;         // absolute byte offset in the file
    uint64_t nbytes = 0;
};

struct TensorRef {
    const uint8_t* data = nullptr;
    GgmlType type = GgmlType::F32;
    std::array<int64_t, 3> ne{{1, 1, 1}};
    int64_t nbytes = 0;
    const std::string* name = nullptr;

    explicit operator bool() const noexcept { return data != nullptr; }
    const float* f32() const noexcept { return reinterpret_cast<const float*>(data); }
    // Bytes of one row (ne[0] elements) and of one expert matrix (ne[0] x ne[1]).
    int64_t row_stride() const { return row_bytes(type, ne[0]); }
    int64_t matrix_stride() const { return row_stride() * ne[1]; }
};

// Name -> tensor over one mapped file; every lookup checks the type and dims it is asked for.
class TensorTable {
public:
    TensorTable(const uint8_t* base, uint64_t file_size, const std::string& file,
                const std::vector<TensorDesc>& descs);

    bool has(const std::string& name) const { return by_name_.count(name) != 0; }
    // Throws ModelFormat naming the tensor if it is missing or its dims differ from `dims`
    // (trailing 1s ignored) or its type is not one of `types` (empty: any type with kernels).
    TensorRef get(const std::string& name, std::vector<int64_t> dims, std::vector<GgmlType> types = {}) const;
    TensorRef get_optional(const std::string& name, std::vector<int64_t> dims, std::vector<GgmlType> types = {}) const;
    const std::string& file() const { return file_; }

private:
    const uint8_t* base_;
    uint64_t size_;
    std::string file_;
    std::unordered_map<std::string, TensorDesc> by_name_;
};

}  // namespace ds4
