// The CPU backend: host memory, the mapped model used in place, and the DS4 ops run by the
// kernels of layers/ and quant/ (SIMD table chosen at run time, see quant/simd.h) on its thread
// pool. Its scalar path is upstream's strict CPU build bit for bit.
#pragma once
#include <memory>

#include "backend/backend.h"

namespace ds4 {
namespace backend {

// threads <= 0: one per physical core.
std::unique_ptr<Backend> make_cpu_backend(int threads);

}  // namespace backend
}  // namespace ds4
