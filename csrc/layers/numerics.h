// Scalar numerics shared by the DS4 layers: f16 round trips, RMSNorms with a double sum of squares,
// the stable sigmoid family. Each follows upstream's CPU float order (docs/model.md §4.3, §4.4) so
// logits stay within upstream's build-to-build noise.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace ds4 {

constexpr float kNeg = -1.0e30f;          // finite "minus infinity" of upstream
constexpr float kNegSkip = -5.0e29f;      // anything at or below this counts as masked

inline float f16_bits_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // subnormal: renormalise
            int e = -1;
            do { ++e; mant <<= 1; } while ((mant & 0x400u) == 0);
            bits = sign | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// IEEE round-to-nearest-even, subnormals included; NaN -> 0x7e00, overflow -> inf.
inline uint16_t f32_to_f16_bits(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return 0x7e00;
    if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);        // rounds to >= 65520 -> inf
    if (ax < 0x38800000u) {                                        // below the smallest normal f16
        if (ax < 0x33000000u) return sign;                         // < 2^-25: rounds to zero
        const uint32_t e = ax >> 23;
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e;                            // 14..24 -> mantissa for 2^-24 units
        uint32_t half = m >> (shift);
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
        return uint16_t(sign | half);
    }
    uint32_t half = ((ax >> 13) - (112u << 10));
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
    return uint16_t(sign | half);
}

inline float f16_round(float x) { return f16_bits_to_f32(f32_to_f16_bits(x)); }
inline void f16_round_inplace(float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = f16_round(x[i]);
}

inline float rms_scale(const float* x, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += (double)x[i] * x[i];
    return 1.0f / std::sqrt((float)(ss / (double)n) + eps);
}

inline void rms_norm_no_weight(float* out, const float* x, int64_t n, float eps) {
    const float s = rms_scale(x, n, eps);
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * s;
}

inline void rms_norm_weight(float* out, const float* x, const float* w, int64_t n, float eps) {
    const float s = rms_scale(x, n, eps);
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * s * w[i];
}

// rms_scale of four rows at once. Each row keeps its own sequential double sum (the same bits as
// rms_scale); the four independent chains overlap, where one row alone waits on every add.
inline void rms_scale4(const float* x0, const float* x1, const float* x2, const float* x3, int64_t n, float eps,
                       float* s) {
    double a = 0.0, b = 0.0, c = 0.0, d = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        a += (double)x0[i] * x0[i];
        b += (double)x1[i] * x1[i];
        c += (double)x2[i] * x2[i];
        d += (double)x3[i] * x3[i];
    }
    const double ss[4] = {a, b, c, d};
    for (int k = 0; k < 4; ++k) s[k] = 1.0f / std::sqrt((float)(ss[k] / (double)n) + eps);
}

// RMSNorm of nrows rows of n floats (row r at x + r*n, written to out + r*n; out may be x), with
// weight w or none: rms_norm_weight / rms_norm_no_weight per row, rows four at a time.
inline void rms_norm_rows(float* out, const float* x, const float* w, int64_t nrows, int64_t n, float eps) {
    int64_t r = 0;
    for (; r < nrows; r += 4) {
        float s[4];
        const int64_t m = nrows - r < 4 ? nrows - r : 4;
        if (m == 4) {
            rms_scale4(x + r * n, x + (r + 1) * n, x + (r + 2) * n, x + (r + 3) * n, n, eps, s);
        } else {
            for (int64_t k = 0; k < m; ++k) s[k] = rms_scale(x + (r + k) * n, n, eps);
        }
        for (int64_t k = 0; k < m; ++k) {
            const float* xr = x + (r + k) * n;
            float* o = out + (r + k) * n;
            if (w) {
                for (int64_t i = 0; i < n; ++i) o[i] = xr[i] * s[k] * w[i];
            } else {
                for (int64_t i = 0; i < n; ++i) o[i] = xr[i] * s[k];
            }
        }
    }
}

inline void head_rms_norm_inplace(float* x, int64_t n_head, int64_t head_dim, float eps) {
    rms_norm_rows(x, x, nullptr, n_head, head_dim, eps);
}

inline float sigmoid_stable(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
    const float e = std::exp(x);
    return e / (1.0f + e);
}

inline float silu(float x) { return x * sigmoid_stable(x); }

inline float softplus_stable(float x) {
    if (x > 20.0f) return x;
    if (x < -20.0f) return std::exp(x);
    return std::log1p(std::exp(x));
}

// Sequential float dot (upstream's scalar dot_f32 order).
inline float dot_f32(const float* a, const float* b, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
    return acc;
}

// Float dot in 8 interleaved partial sums combined pairwise: a fixed order (identical on every
// machine and thread count) that the compiler can vectorise, used when a SIMD kernel path is
// active. The scalar path keeps upstream's sequential order (dot_f32).
inline float dot_f32_lanes(const float* a, const float* b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
    }
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

using DotF32 = float (*)(const float*, const float*, int64_t);

}  // namespace ds4
