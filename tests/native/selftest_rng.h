// Seeded randomness shared by the native self-tests (kernels_selftest.cpp, gemm_selftest.cpp,
// logprobs_selftest.cpp):
// splitmix64, so every run draws the same shapes and values and a failure reproduces.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace selftest {

inline uint64_t g_state = 0x9E3779B97F4A7C15ull;
inline uint64_t next_u64() {
    uint64_t z = (g_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
inline double uniform() { return (double)(next_u64() >> 11) / 9007199254740992.0; }
inline float normal() {
    return (float)(std::sqrt(-2.0 * std::log(uniform() + 1e-300)) * std::cos(6.283185307179586 * uniform()));
}
inline int64_t below(int64_t k) { return (int64_t)(next_u64() % (uint64_t)k); }  // uniform in [0, k)

inline uint16_t f32_to_f16_normal(float f) {  // for values well inside the normal f16 range
    uint32_t b;
    std::memcpy(&b, &f, 4);
    const uint32_t sign = (b >> 16) & 0x8000u;
    const int32_t e = (int32_t)((b >> 23) & 0xff) - 127 + 15;
    return (uint16_t)(sign | ((uint32_t)e << 10) | ((b >> 13) & 0x3ffu));
}

}  // namespace selftest
