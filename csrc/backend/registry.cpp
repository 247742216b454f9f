// The backend registry: every backend ds4 knows, in "auto" preference order (GPUs first), with
// whether this build on this machine can create it.
#include <string>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/metal/emu_device.h"
#include "backend/metal/metal_backend.h"
#include "common/errors.h"
#if defined(DS4_HAVE_APPLE_METAL)
#include "metal_device.h"   // metal/host: the Objective-C++ device (Apple builds, metal/metal.cmake)
#endif

namespace ds4 {
namespace backend {

std::vector<BackendInfo> available_backends() {
    std::vector<BackendInfo> out;
#if defined(DS4_HAVE_APPLE_METAL)
    const std::string& why = metal::apple_metal_unavailable_reason();
    out.push_back({"metal", why.empty(), why});
#elif defined(__APPLE__)
    out.push_back({"metal", false, "metal: this build has no Metal host (metal/metal.cmake was not included)"});
#else
    out.push_back({"metal", false, "metal: not built on this platform (Apple only)"});
#endif
    out.push_back({"cuda", false, "cuda: not built (no CUDA backend in this version)"});
    out.push_back({"cpu", true, ""});
    // The Metal kernels on the CPU emulator (tests; docs/metal.md). After the CPU so that "auto"
    // never picks it; available once ds4.metal_emu has built the library and handed its path over.
    const bool emu = !metal::emu_library_path().empty();
    out.push_back({"metal-emu", emu,
                   emu ? "" : "metal-emu: the Metal emulator library is not loaded (asking for backend='metal-emu' "
                              "from Python builds it with clang and loads it)"});
    return out;
}

std::unique_ptr<Backend> create_backend(const std::string& name, int threads) {
    const std::vector<BackendInfo> all = available_backends();
    std::string avail;
    for (const BackendInfo& b : all) {
        if (b.available) avail += (avail.empty() ? "" : ", ") + b.name;
    }
    const BackendInfo* pick = nullptr;
    for (const BackendInfo& b : all) {
        if (name == "auto" ? b.available : b.name == name) {
            pick = &b;
            break;
        }
    }
    if (!pick) fail(ErrorKind::Unsupported, "unknown backend '" + name + "' (available: " + avail + ")");
    if (!pick->available) fail(ErrorKind::Unsupported, pick->reason + " (available: " + avail + ")");
    if (pick->name == "cpu") return make_cpu_backend(threads);
#if defined(DS4_HAVE_APPLE_METAL)
    if (pick->name == "metal") {
        std::string why;
        std::unique_ptr<metal::Device> dev = metal::make_apple_metal_device(&why);
        if (!dev) fail(ErrorKind::Unsupported, why + " (available: " + avail + ")");
        return make_metal_backend(std::move(dev), "metal", threads);
    }
#endif
    if (pick->name == "metal-emu") return make_metal_backend(metal::make_emu_device(), "metal-emu", threads);
    fail(ErrorKind::Unsupported, "backend '" + pick->name + "' has no constructor (available: " + avail + ")");
}

}  // namespace backend
}  // namespace ds4
