// One-off check of the certified exponential (csrc/sampling/exp_certified_avx512.h) against the
// exact evaluation (csrc/sampling/exp_weights.inc) over every float argument in [-lim, 0] (default
// 105), plus -inf and a few below: every lane the certified path calls certain must give the exact
// path's float bits. Needs an AVX-512 CPU (docs/sampling.md, "A certified exponential").
//   g++ -O2 -std=c++17 -march=x86-64-v4 -ffp-contract=off -Icsrc scripts/check_exp_certified.cpp -o /tmp/chk && /tmp/chk
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <cmath>
#include "sampling/exp_certified_avx512.h"
#include "sampling/exp_weights.inc"
int main(int argc, char** argv) {
    // every float in [-lim, 0] (bits 0x80000000 .. bits(-lim)), plus -inf and +0
    float lim = argc > 1 ? std::atof(argv[1]) : 105.0f;
    uint32_t hi; float nl = -lim; std::memcpy(&hi, &nl, 4);
    ds4::certified_exp::Table tab;
    uint64_t n = 0, unc = 0, bad = 0;
    alignas(32) float xs[8], ys[8];
    auto run8 = [&](){
        __mmask8 u; __m256 y = ds4::certified_exp::eval8(_mm256_load_ps(xs), tab, u);
        _mm256_store_ps(ys, y);
        for (int j = 0; j < 8; ++j) {
            ++n;
            if (u >> j & 1) { ++unc; continue; }
            float e = (float)exp_nonpositive((double)xs[j]);
            if (std::memcmp(&e, &ys[j], 4) != 0) { if (bad < 10) printf("DIFF x=%a exact=%a cert=%a\n", xs[j], e, ys[j]); ++bad; }
        }
    };
    int k = 0;
    for (uint64_t b = 0x80000000u; b <= hi; ++b) {
        uint32_t bb = (uint32_t)b; std::memcpy(&xs[k], &bb, 4);
        if (++k == 8) { run8(); k = 0; }
    }
    float extra[] = {0.0f, -INFINITY, -105.0001f, -106.f, -120.f, -1e30f, -87.0f, -86.99999f};
    for (float e : extra) { xs[k] = e; if (++k == 8) { run8(); k = 0; } }
    while (k) { xs[k] = 0.0f; if (++k == 8) { run8(); k = 0; } }
    printf("checked %llu arguments, %llu uncertain (%.3g), %llu differ\n", (unsigned long long)n, (unsigned long long)unc, (double)unc / n, (unsigned long long)bad);
    return bad != 0;
}
