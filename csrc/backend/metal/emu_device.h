// The emulator's implementation of the neutral encoder API (encoder.h): the Metal kernels
// compiled as C++ and run on the CPU by the SIMT runtime of metal/emu, through the C ABI of
// metal/emu/ds4_metal_emu.h. The library is loaded with dlopen from a path (ds4.metal_emu builds
// it with clang and hands the path over), so the core has no link-time dependency on it.
//
// Buffers are host memory. A command buffer is recorded and, at commit(), run dispatch by
// dispatch in order; the runtime is one per process and serialises callers itself.
#pragma once
#include <memory>
#include <string>

#include "backend/metal/encoder.h"

namespace ds4 {
namespace backend {
namespace metal {

// Loads the emulator library at `path` (once per path; a later call with another path switches
// the devices created afterwards to it). Throws ds4 errors (Unsupported) when it cannot be
// loaded or lacks the emulator's entry points.
void load_emu_library(const std::string& path);
// The loaded library's path, or "" when none was loaded.
std::string emu_library_path();

// The thread orders a device runs its dispatches under (ds4emu_order): forward by default;
// DS4_METAL_EMU_ORDER=reverse|shuffle[:seed] changes it for a whole run (a race in a kernel
// shows as a different result).
std::unique_ptr<Device> make_emu_device();

}  // namespace metal
}  // namespace backend
}  // namespace ds4
