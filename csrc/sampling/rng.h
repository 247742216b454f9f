// Upstream's sampling RNG (docs/sampling.md): xorshift64* on a 64-bit state; a uniform float32 in
// [0, 1) from the top 24 bits of each output. A zero state is replaced by a fixed constant.
#pragma once
#include <cstdint>

namespace ds4 {

inline uint64_t rng_next(uint64_t& state) {
    uint64_t x = state ? state : 0x9E3779B97F4A7C15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

inline float rng_uniform(uint64_t& state) {
    return (float)((rng_next(state) >> 40) & 0xFFFFFF) / 16777216.0f;   // exact in float32
}

}  // namespace ds4
