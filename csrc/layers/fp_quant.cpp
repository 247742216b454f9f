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

void fp8_kv_roundtrip_scalar(float* x, int64_t head_dim, int64_t n_rot) {
    const int64_t n_nope = head_dim - n_rot;
    for (int64_t off = 0; off < n_nope; off += 64) {
        float amax = 0.0f;
        for (int i = 0; i < 64; ++i) amax = std::fmax(amax, std::fabs(x[off + i]));
        const float scale = pow2_block_scale(amax, kFp8AmaxFloor, 448.0f);
        for (int i = 0; i < 64; ++i) {
            float v = x[off + i] / scale;
            if (v > 448.0f) v = 448.0f;
            if (v < -448.0f) v = -448.0f;
            x[off + i] = e4m3_round(v) * scale;
        }
    }
}

void fp4_roundtrip_scalar(float* x, int64_t n) {
    for (int64_t off = 0; off < n; off += 32) {
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[off + i]));
        const float scale = pow2_block_scale(amax, kFp4AmaxFloor, 6.0f);
        for (int i = 0; i < 32; ++i) {
            float v = x[off + i] / scale;
            if (v > 6.0f) v = 6.0f;
            if (v < -6.0f) v = -6.0f;
            x[off + i] = e2m1_round(v) * scale;
        }
    }
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
