// The backend registry: every backend ds4 knows, in "auto" preference order (GPUs first), with
// whether this build on this machine can create it.
#include <string>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "common/errors.h"

namespace ds4 {
namespace backend {

std::vector<BackendInfo> available_backends() {
    std::vector<BackendInfo> out;
#if defined(__APPLE__)
    out.push_back({"metal", false, "metal: the Metal backend is not implemented yet (see metal/README.md)"});
#else
    out.push_back({"metal", false, "metal: not built on this platform (Apple only)"});
#endif
    out.push_back({"cuda", false, "cuda: not built (no CUDA backend in this version)"});
    out.push_back({"cpu", true, ""});
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
    fail(ErrorKind::Unsupported, "backend '" + pick->name + "' has no constructor (available: " + avail + ")");
}

}  // namespace backend
}  // namespace ds4
