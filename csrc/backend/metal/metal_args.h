// The kernels' argument structs (metal/ds4_metal_args.h, shared with the .metal files and the
// Python host) in C++, inside ds4::backend::metal. The MSL spelling `uint` is uint32_t here; the
// fields are plain 32-bit values, so the layout is the kernels'.
#pragma once
#include <cstdint>

namespace ds4 {
namespace backend {
namespace metal {
using uint = uint32_t;
#include "../../../metal/ds4_metal_args.h"
}  // namespace metal
}  // namespace backend
}  // namespace ds4
