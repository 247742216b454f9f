#include "layers/fp_quant.h"

#include <cmath>

#include "common/errors.h"
#include "quant/simd.h"

namespace ds4 {

namespace {

float e4m3_value(int i) {
    const int e = (i >> 3) & 15;
    const int m = i & 7;
    if (e == 0) return (float)m * 0.001953125f;
    return (1.0f + (float)m * 0.125f) * std::ldexp(1.0f, e - 7);
}

struct E4m3Table {
    float v[127];
    E4m3Table() { for (int i = 0; i < 127; ++i) v[i] = e4m3_value(i); }
};

const E4m3Table& e4m3_table() {
    static const E4m3Table t;
    return t;
}

constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

}  // namespace

float e4m3_round(float v) {
    const float* tab = e4m3_table().v;
    const float sign = v < 0.0f ? -1.0f : 1.0f;
    const float ax = std::fmin(std::fabs(v), 448.0f);
    int lo = 0, hi = 126;  // largest code <= ax
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (tab[mid] <= ax) lo = mid; else hi = mid - 1;
    }
    int best = lo;
    if (best < 126) {
        const float d0 = std::fabs(ax - tab[best]);
        const float d1 = std::fabs(ax - tab[best + 1]);
        if (d1 < d0 || (d1 == d0 && ((best + 1) & 1) == 0)) ++best;
    }
    return sign * tab[best];
}

float e2m1_round(float v) {
    const float sign = v < 0.0f ? -1.0f : 1.0f;
    const float ax = std::fmin(std::fabs(v), 6.0f);
    int best = 0;
    float best_d = std::fabs(ax - kE2m1[0]);
    for (int i = 1; i < 8; ++i) {
        const float d = std::fabs(ax - kE2m1[i]);
        if (d < best_d || (d == best_d && (i & 1) == 0 && (best & 1) != 0)) {
            best = i;
            best_d = d;
        }
    }
    return sign * kE2m1[best];
}

namespace {

// One block of kBlock values through the format: a power-of-two scale from the block's amax
// (floored), each value divided, clamped to +-max_code, rounded to the format and scaled back.
template <int kBlock, float (*Round)(float)>
void block_roundtrip_scalar(float* x, float amax_floor, float max_code) {
    float amax = 0.0f;
    for (int i = 0; i < kBlock; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const float scale = pow2_block_scale(amax, amax_floor, max_code);
    for (int i = 0; i < kBlock; ++i) {
        float v = x[i] / scale;
        if (v > max_code) v = max_code;
        if (v < -max_code) v = -max_code;
        x[i] = Round(v) * scale;
    }
}

void fp8_kv_roundtrip_scalar(float* x, int64_t head_dim, int64_t n_rot) {
    for (int64_t off = 0; off < head_dim - n_rot; off += 64) {
        block_roundtrip_scalar<64, e4m3_round>(x + off, kFp8AmaxFloor, 448.0f);
    }
}

void fp4_roundtrip_scalar(float* x, int64_t n) {
    for (int64_t off = 0; off < n; off += 32) block_roundtrip_scalar<32, e2m1_round>(x + off, kFp4AmaxFloor, 6.0f);
}

}  // namespace

// The vector round trips (fp_quant_simd.inc) compute the scalar bits; DS4_SIMD=scalar keeps the
// loops above.
void fp8_kv_roundtrip(float* x, int64_t head_dim, int64_t n_rot) {
    switch (simd_path()) {
#if defined(DS4_ARCH_X86)
        case SimdPath::AVX2: fp8_kv_roundtrip_avx2(x, head_dim, n_rot); return;
        case SimdPath::AVX512:
        case SimdPath::AVX512VNNI: fp8_kv_roundtrip_avx512(x, head_dim, n_rot); return;
#endif
        default: fp8_kv_roundtrip_scalar(x, head_dim, n_rot); return;
    }
}

void hadamard128(float* x) {
    for (int stride = 1; stride < 128; stride <<= 1) {
        for (int base = 0; base < 128; base += 2 * stride) {
            for (int i = 0; i < stride; ++i) {
                const float a = x[base + i];
                const float b = x[base + stride + i];
                x[base + i] = a + b;
                x[base + stride + i] = a - b;
            }
        }
    }
    for (int i = 0; i < 128; ++i) x[i] *= 0.08838834764831845f;
}

void fp4_roundtrip(float* x, int64_t n) {
    switch (simd_path()) {
#if defined(DS4_ARCH_X86)
        case SimdPath::AVX2: fp4_roundtrip_avx2(x, n); return;
        case SimdPath::AVX512:
        case SimdPath::AVX512VNNI: fp4_roundtrip_avx512(x, n); return;
#endif
        default: fp4_roundtrip_scalar(x, n); return;
    }
}

void indexer_qat_row(float* x, int64_t n) {
    if (n != 128) fail(ErrorKind::Unsupported, "indexer rows must be 128 wide (Hadamard-128), got " + std::to_string(n));
    hadamard128(x);
    fp4_roundtrip(x, n);
}

}  // namespace ds4
