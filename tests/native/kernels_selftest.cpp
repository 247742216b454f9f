// Stand-alone check of the SIMD row kernels against the scalar reference kernels, for builds that
// cannot load the Python module (e.g. the arm64 NEON kernels cross-compiled and run under qemu by
// tests/test_kernels_neon.py). Exit status 0 = every check passed.
//
// Two kinds of checks per weight type and SIMD path:
//  * exact: unit scales and integer activations make every float operation exact, so any path
//    must return exactly the scalar value (Q4_K: always exact, it keeps the scalar float order);
//  * bounded: random rows, |simd - scalar| <= 2 (K + 6) u S, the bound derived in
//    tests/test_kernels_matvec.py (S = sum |w_i * xa_i| with d and min parts counted apart).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "quant/dot_kernels.h"
#include "quant/kernels.h"
#include "quant/simd.h"
#include "selftest_rng.h"

using namespace ds4;
using namespace selftest;

namespace {

struct Layout { GgmlType t; int block_elems, block_bytes; std::vector<int> d_off, m_off; int summands_per_block; };

const Layout kLayouts[] = {
    {GgmlType::F16, 1, 2, {}, {}, 1},      {GgmlType::BF16, 1, 2, {}, {}, 1},
    {GgmlType::Q8_0, 32, 34, {0}, {}, 1},  {GgmlType::Q2_K, 256, 84, {80}, {82}, 2},
    {GgmlType::Q4_K, 256, 144, {0}, {2}, 2}, {GgmlType::IQ2_XXS, 256, 66, {0}, {}, 9},
};

std::vector<uint8_t> random_row(const Layout& L, int64_t n, bool unit_scales) {
    std::vector<uint8_t> w(n / L.block_elems * L.block_bytes);
    if (L.t == GgmlType::F16 || L.t == GgmlType::BF16) {
        for (int64_t i = 0; i < n; ++i) {
            float v = unit_scales ? (float)((int)(next_u64() % 129) - 64) : normal();
            uint16_t h;
            if (L.t == GgmlType::F16) {
                h = v == 0.0f ? 0 : f32_to_f16_normal(v);
                if (!unit_scales) h = (uint16_t)(next_u64() & 0xffff), h = (h & 0x7c00) == 0x7c00 ? (uint16_t)(h & 0xbfff) : h;
            } else {
                uint32_t b;
                std::memcpy(&b, &v, 4);
                h = (uint16_t)(b >> 16);
            }
            std::memcpy(&w[2 * i], &h, 2);
        }
        return w;
    }
    for (auto& b : w) b = (uint8_t)next_u64();
    for (size_t blk = 0; blk < w.size(); blk += L.block_bytes) {
        for (int off : L.d_off) {
            const uint16_t h = unit_scales ? 0x3C00 : f32_to_f16_normal((float)std::ldexp(1.0 + uniform(), -(int)(next_u64() % 12)));
            std::memcpy(&w[blk + off], &h, 2);
        }
        for (int off : L.m_off) {
            const uint16_t h = unit_scales ? 0x3C00 : f32_to_f16_normal((float)std::ldexp(1.0 + uniform(), -(int)(next_u64() % 12)));
            std::memcpy(&w[blk + off], &h, 2);
        }
    }
    return w;
}

// Activation for weight type L.t; with integer_codes the quantised codes are the inputs themselves.
std::vector<uint8_t> activation(const Layout& L, int64_t n, bool integer_codes, std::vector<double>* xa) {
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = integer_codes ? (float)((int)(next_u64() % 255) - 127) : normal();
    if (integer_codes) {
        const int blk = act_type_for(L.t) == GgmlType::Q8_K ? 256 : 32;
        if (act_type_for(L.t) != GgmlType::F32)
            for (int64_t i = 0; i < n; i += blk) x[i] = act_type_for(L.t) == GgmlType::Q8_K ? -127.0f : 127.0f;
    }
    std::vector<uint8_t> q(act_bytes(L.t, n));
    quantize_act(L.t, x.data(), q.data(), n);
    xa->assign(n, 0.0);
    const GgmlType at = act_type_for(L.t);
    if (at == GgmlType::F32) {
        for (int64_t i = 0; i < n; ++i) (*xa)[i] = x[i];
    } else if (at == GgmlType::Q8_K) {
        std::vector<float> deq(n);
        dequantize_row(GgmlType::Q8_K, q.data(), deq.data(), n);
        for (int64_t i = 0; i < n; ++i) (*xa)[i] = deq[i];
    } else {
        for (int64_t b = 0; b < n / 32; ++b) {
            float d;
            std::memcpy(&d, &q[b * 36], 4);
            for (int i = 0; i < 32; ++i) (*xa)[32 * b + i] = (double)d * (double)(int8_t)q[b * 36 + 4 + i];
        }
    }
    return q;
}

double abs_sum(const Layout& L, std::vector<uint8_t> w, const std::vector<double>& xa, int64_t n) {
    // d part and min part separately (zero the other scale field), as in the Python test.
    auto part = [&](const std::vector<int>& zero_offs) {
        std::vector<uint8_t> c = w;
        for (size_t blk = 0; blk < c.size(); blk += L.block_bytes)
            for (int off : zero_offs) c[blk + off] = c[blk + off + 1] = 0;
        std::vector<float> deq(n);
        dequantize_row(L.t, c.data(), deq.data(), n);
        double s = 0;
        for (int64_t i = 0; i < n; ++i) s += std::fabs((double)deq[i] * xa[i]);
        return s;
    };
    if (L.m_off.empty()) return part({});
    return part(L.m_off) + part(L.d_off);
}

}  // namespace

int main() {
    int failures = 0, checks = 0;
    std::vector<std::pair<const char*, const quant::DotKernels*>> paths;
#if defined(DS4_ARCH_ARM64)
    paths.push_back({"neon", &quant::neon_kernels()});
#endif
#if defined(DS4_ARCH_X86)
    paths.push_back({"avx2", &quant::avx2_kernels()});
#endif
    const quant::DotKernels& scalar = quant::scalar_kernels();
    for (const auto& path : paths) {
        for (const Layout& L : kLayouts) {
            const quant::DotFn ref = quant::dot_fn(scalar, L.t), fn = quant::dot_fn(*path.second, L.t);
            const char* name = type_traits(L.t).name;
            for (int trial = 0; trial < 300; ++trial) {
                const bool exact = trial % 2 == 0;
                const int64_t per = L.block_elems == 1 ? 32 : L.block_elems;
                const int64_t n = per * (1 + (int64_t)(next_u64() % 12)) + (L.block_elems == 1 ? (int64_t)(next_u64() % 8) : 0);
                std::vector<double> xa;
                const std::vector<uint8_t> w = random_row(L, n, exact);
                const std::vector<uint8_t> q = activation(L, n, exact, &xa);
                const float a = ref(w.data(), q.data(), n), b = fn(w.data(), q.data(), n);
                ++checks;
                bool ok;
                if (exact || L.t == GgmlType::Q4_K) {
                    ok = a == b;
                } else {
                    const double k = (double)(n / L.block_elems) * L.summands_per_block;
                    const double tol = 2.0 * (k + 6) * std::ldexp(1.0, -24) * abs_sum(L, w, xa, n) + 1e-30;
                    ok = std::fabs((double)a - (double)b) <= tol;
                }
                if (!ok) {
                    if (++failures < 20) std::printf("FAIL %s %s n=%lld exact=%d scalar=%.9g simd=%.9g\n", path.first, name, (long long)n, (int)exact, a, b);
                }
            }
        }
    }
    // The run-time dispatch must offer the compiled path on a CPU that has it.
    const std::vector<SimdPath> avail = available_simd_paths();
    std::printf("paths available:");
    for (SimdPath p : avail) std::printf(" %s", simd_path_name(p));
    std::printf("\n%d checks, %d failures\n", checks, failures);
    return failures == 0 && avail.size() >= 2 ? 0 : 1;
}
