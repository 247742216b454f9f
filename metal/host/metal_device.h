// The Apple GPU behind the neutral encoder API (csrc/backend/metal/encoder.h): the Objective-C++
// implementation over MTLDevice / MTLCommandQueue / MTLComputeCommandEncoder lives in
// metal_device.mm and is built on Apple platforms only (docs/metal.md, "The Objective-C++ host").
#pragma once
#include <memory>
#include <string>

#include "backend/metal/encoder.h"

namespace ds4 {
namespace backend {
namespace metal {

// The system's default Metal device with the ds4 kernels compiled from their .metal sources, or
// nullptr with *why_not saying why (no Metal device, a GPU older than Apple family 7, the
// sources not found or not compiling).
std::unique_ptr<Device> make_apple_metal_device(std::string* why_not);

// Why make_apple_metal_device would fail, checked cheaply (device, GPU family, sources found;
// nothing compiled), or "" when it should succeed. Computed once per process.
const std::string& apple_metal_unavailable_reason();

}  // namespace metal
}  // namespace backend
}  // namespace ds4
