// One-off generator of tests/data/exp_near_window.txt: float arguments in [-87, 0] whose exact
// weight (the double of csrc/sampling/exp_weights.inc) lies between 2^11 and 2^17 double ulps of a
// float rounding midpoint: around the certified exponential's window (2^15 ulps,
// csrc/sampling/exp_certified_avx512.h), where a less accurate evaluation or a narrower window
// would certify a wrong rounding first. A deterministic sample of 3,000 of them, spread over the
// distance (equal counts per binade of distance) and the argument range; hex float bits, one a line.
//   g++ -O2 -std=c++17 -ffp-contract=off -Icsrc scripts/gen_exp_near_window.cpp -o /tmp/gen && /tmp/gen > tests/data/exp_near_window.txt
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "sampling/exp_weights.inc"

int main() {
    const float lim = -87.0f;
    uint32_t hi;
    std::memcpy(&hi, &lim, 4);
    std::vector<uint32_t> by_binade[6];   // distance in [2^(11+b), 2^(12+b))
    uint64_t seen[6] = {};
    const size_t keep = 500;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (uint64_t b = 0x80000000u; b <= hi; ++b) {
        const uint32_t bb = (uint32_t)b;
        float x;
        std::memcpy(&x, &bb, 4);
        const double w = exp_nonpositive((double)x);
        uint64_t wb;
        std::memcpy(&wb, &w, 8);
        const int64_t low = (int64_t)(wb & ((1ull << 29) - 1)) - (1ll << 28);
        const uint64_t d = (uint64_t)(low < 0 ? -low : low);
        if (d < (1u << 11) || d >= (1u << 17)) continue;
        const int k = 63 - __builtin_clzll(d) - 11;
        // reservoir sample per distance binade
        ++seen[k];
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        if (by_binade[k].size() < keep) by_binade[k].push_back(bb);
        else if (rng % seen[k] < keep) by_binade[k][rng % keep] = bb;
    }
    for (auto& v : by_binade)
        for (uint32_t bb : v) std::printf("%08x\n", bb);
    for (int k = 0; k < 6; ++k) std::fprintf(stderr, "distance [2^%d, 2^%d): %llu arguments\n", 11 + k, 12 + k, (unsigned long long)seen[k]);
    return 0;
}
