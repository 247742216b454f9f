// Run-time choice of the CPU backend's SIMD kernel table (scalar, AVX2, AVX-512, AVX-512 VNNI, NEON).
#pragma once
#include <vector>

namespace ds4 {

// AVX512VNNI: the AVX-512 kernels with VNNI integer dot steps, bit-identical to AVX512.
enum class SimdPath { Scalar = 0, AVX2 = 1, AVX512 = 2, NEON = 3, AVX512VNNI = 4 };
std::vector<SimdPath> available_simd_paths();              // what this CPU + build can run
SimdPath simd_path();                                      // currently active
void set_simd_path(SimdPath p);                            // throws Unsupported if unavailable
const char* simd_path_name(SimdPath p);
// Initial choice: env DS4_SIMD=scalar|avx2|avx512|avx512vnni|neon if set and available, else the best one.

}  // namespace ds4
