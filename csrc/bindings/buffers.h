// Reading a Python bytes-like object as one flat byte range. The core reads [ptr, ptr + n): a view
// whose bytes are not contiguous (a reversed or strided memoryview) would be read outside itself,
// so such views are refused.
#pragma once
#include <pybind11/pybind11.h>

#include <cstdint>

#include "common/errors.h"

namespace ds4_bindings {

struct ByteRange {
    pybind11::buffer_info info;   // keeps the exported view alive
    const uint8_t* ptr;
    size_t size;
};

inline ByteRange contiguous_bytes(const pybind11::buffer& data, const char* what) {
    pybind11::buffer_info info = data.request();
    if (!PyBuffer_IsContiguous(info.view(), 'C')) {
        ds4::fail(ds4::ErrorKind::InvalidArgument,
                  std::string(what) + " must be a contiguous buffer (bytes, bytearray or a C-contiguous view)");
    }
    const auto* ptr = static_cast<const uint8_t*>(info.ptr);
    const size_t n = (size_t)(info.size * info.itemsize);
    return ByteRange{std::move(info), ptr, n};
}

}  // namespace ds4_bindings
