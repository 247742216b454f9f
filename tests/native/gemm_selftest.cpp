// Stand-alone check of the prefill GEMM (gemm.h) and the F16/BF16 register tiles (matmul_half.h)
// of every SIMD path this build can run, for builds that cannot load the Python module: the arm64
// NEON kernels are cross-compiled and run under qemu by tests/test_kernels_neon.py. Exit status 0 =
// every check passed.
//
// Every check is bit-for-bit (docs/gemm.md, Numerics): each GEMM output must equal the active
// path's row kernel on that (row, token), over seeded random shapes with ragged row groups, token
// tiles and block counts, one and two threads, the grouped (routed experts) entry and matmul's
// dispatch; on NEON, Q4_K must also equal the scalar kernel (its NEON row kernel keeps the scalar
// order). The F16/BF16 tiles must equal the row kernel for every block shape, and on NEON also an
// independent scalar statement of upstream's NEON float order (so the 1 x 1 tile, which now is the
// row kernel, is pinned to the order it had). Outputs start as NaN, so a tile that forgets a row
// or token fails too.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/thread_pool.h"
#include "quant/dot_kernels.h"
#include "quant/gemm.h"
#include "quant/kernels.h"
#include "quant/matmul_half.h"
#include "quant/simd.h"
#include "selftest_rng.h"

using namespace ds4;
using namespace selftest;

namespace {

int g_checks = 0, g_failures = 0;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

void expect_same(float got, float want, const char* what, const char* path, const char* type, long long a,
                 long long b, long long c) {
    ++g_checks;
    if (same_bits(got, want)) return;
    if (++g_failures <= 20)
        std::printf("FAIL %s %s %s (%lld, %lld, %lld): got %.9g want %.9g\n", path, type, what, a, b, c, got, want);
}

struct QuantLayout { GgmlType t; int block_elems, block_bytes; std::vector<int> scale_off; };

const QuantLayout kQuant[] = {
    {GgmlType::Q8_0, 32, 34, {0}},
    {GgmlType::Q2_K, 256, 84, {80, 82}},
    {GgmlType::Q4_K, 256, 144, {0, 2}},
    {GgmlType::IQ2_XXS, 256, 66, {0}},
};

// Random bytes (every code, sub-block scale, grid index and sign pattern) with finite f16 scales
// of random mantissa and exponent, so a one-ulp change of any factor changes the result.
std::vector<uint8_t> random_matrix(const QuantLayout& L, int64_t rows, int64_t n) {
    std::vector<uint8_t> w((size_t)(rows * (n / L.block_elems) * L.block_bytes));
    for (auto& b : w) b = (uint8_t)next_u64();
    for (size_t blk = 0; blk < w.size(); blk += L.block_bytes) {
        for (int off : L.scale_off) {
            const float v = (float)std::ldexp(1.0 + uniform(), -(int)below(12)) * (below(8) == 0 ? -1.0f : 1.0f);
            const uint16_t h = f32_to_f16_normal(v);
            std::memcpy(&w[blk + off], &h, 2);
        }
    }
    return w;
}

std::vector<uint8_t> random_acts(GgmlType t, int64_t n, int64_t ntok) {
    const int64_t ab = act_bytes(t, n);
    std::vector<uint8_t> q((size_t)(ab * ntok));
    std::vector<float> x((size_t)n);
    for (int64_t k = 0; k < ntok; ++k) {
        const float scale = (float)std::ldexp(1.0, (int)below(6) - 3);
        const int64_t kind = below(8);
        for (auto& v : x) v = scale * normal();
        if (kind == 0) x[(size_t)below(n)] = 40.0f * scale;  // an outlier: other codes shrink
        // Extremes: every code +-127 (largest block sums and int16 bsums), or all of one sign.
        if (kind == 1) for (auto& v : x) v = below(2) ? scale : -scale;
        if (kind == 2) for (auto& v : x) v = scale * (1.0f + 0.001f * (float)below(8));
        quantize_act(t, x.data(), q.data() + k * ab, n);
    }
    return q;
}

// One matrix x batch through gemm() against the path's row kernel (and scalar where stated).
void check_gemm_shape(const char* path, const QuantLayout& L, int64_t rows, int64_t n, int64_t ntok,
                      ThreadPool& pool, bool also_scalar) {
    const char* name = type_traits(L.t).name;
    const std::vector<uint8_t> w = random_matrix(L, rows, n);
    const std::vector<uint8_t> q = random_acts(L.t, n, ntok);
    const int64_t ab = act_bytes(L.t, n), rb = row_bytes(L.t, n);
    std::vector<float> y((size_t)(rows * ntok), NAN);
    std::vector<float*> yrows((size_t)ntok);
    for (int64_t k = 0; k < ntok; ++k) yrows[(size_t)k] = y.data() + k * rows;
    quant::gemm(L.t, w.data(), rows, n, q.data(), ab, ntok, yrows.data(), pool);
    const quant::DotFn row = quant::dot_fn(quant::active_kernels(), L.t);
    const quant::DotFn scalar = quant::dot_fn(quant::scalar_kernels(), L.t);
    for (int64_t k = 0; k < ntok; ++k) {
        for (int64_t r = 0; r < rows; ++r) {
            const float want = row(w.data() + r * rb, q.data() + k * ab, n);
            expect_same(y[(size_t)(k * rows + r)], want, "gemm vs row kernel", path, name, rows, n, ntok);
            if (also_scalar)
                expect_same(want, scalar(w.data() + r * rb, q.data() + k * ab, n), "row kernel vs scalar", path,
                            name, rows, n, ntok);
        }
    }
    // matmul's dispatch (GEMM from gemm_min_tokens, row kernels below) gives the same bits.
    std::vector<float> ym((size_t)(rows * ntok), NAN);
    matmul(L.t, w.data(), rows, n, q.data(), ntok, ym.data(), &pool);
    for (size_t i = 0; i < y.size(); ++i) expect_same(ym[i], y[i], "matmul vs gemm", path, name, rows, n, ntok);
}

// Routed experts: three matrices with 0, 2 and 5 tokens through gemm_grouped.
void check_gemm_grouped(const char* path, const QuantLayout& L, int64_t rows, int64_t n, ThreadPool& pool) {
    const char* name = type_traits(L.t).name;
    const int64_t n_mats = 3, tok0[4] = {0, 0, 2, 7}, ntok = tok0[3];
    const int64_t rb = row_bytes(L.t, n), ab = act_bytes(L.t, n);
    const std::vector<uint8_t> w = random_matrix(L, rows * n_mats, n);
    const std::vector<uint8_t> q = random_acts(L.t, n, ntok);
    const int64_t offsets[3] = {0, rows * rb, 2 * rows * rb};
    std::vector<float> y((size_t)(rows * ntok), NAN);
    std::vector<float*> yrows((size_t)ntok);
    for (int64_t k = 0; k < ntok; ++k) yrows[(size_t)k] = y.data() + k * rows;
    quant::gemm_grouped(L.t, w.data(), offsets, tok0, n_mats, rows, n, q.data(), ab, yrows.data(), pool);
    const quant::DotFn row = quant::dot_fn(quant::active_kernels(), L.t);
    for (int64_t e = 0; e < n_mats; ++e)
        for (int64_t k = tok0[e]; k < tok0[e + 1]; ++k)
            for (int64_t r = 0; r < rows; ++r)
                expect_same(y[(size_t)(k * rows + r)], row(w.data() + offsets[e] + r * rb, q.data() + k * ab, n),
                            "gemm_grouped vs row kernel", path, name, e, r, k);
}

void check_gemm(const char* path, ThreadPool& one, ThreadPool& two) {
    for (const QuantLayout& L : kQuant) {
        size_t pbytes = 0;
        if (!quant::active_gemm(L.t, &pbytes, L.block_elems * 4)) continue;
        const bool also_scalar =
#if defined(DS4_ARCH_ARM64)
            L.t == GgmlType::Q4_K;  // the other NEON row kernels keep upstream's NEON order
#else
            L.t != GgmlType::Q8_0;
#endif
        for (int trial = 0; trial < 24; ++trial) {
            const int64_t rows = 1 + below(trial < 20 ? 20 : 40);
            const int64_t blocks = L.block_elems == 32 ? 1 + below(20) : 1 + below(3);
            const int64_t ntok = 1 + below(11);
            check_gemm_shape(path, L, rows, blocks * L.block_elems, ntok, trial % 2 ? two : one, also_scalar);
        }
        check_gemm_shape(path, L, 9, 4096, 5, two, also_scalar);  // a model-sized row length
        check_gemm_grouped(path, L, 1 + below(20), L.block_elems * (L.block_elems == 32 ? 5 : 2), two);
    }
}

// ---- F16 / BF16 ---------------------------------------------------------------------------------

float half_value(bool bf16, uint16_t h) {
    uint32_t b;
    float f;
    if (bf16) {
        b = (uint32_t)h << 16;
        std::memcpy(&f, &b, 4);
        return f;
    }
    // binary16 -> float, by cases (independent of the kernels' converters)
    const int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? std::ldexp((double)m, -24) : std::ldexp(1024.0 + m, e - 25);
    return (float)(sign ? -v : v);
}

// Upstream's NEON order (half_tile_neon.inc), written with scalars: lanes l < 4 of accumulators A
// (elements 8s + l) and B (8s + 4 + l) by fused multiply-add, vaddvq(A + B) = ((A0+B0) + (A1+B1))
// + ((A2+B2) + (A3+B3)), then the tail one by one, product rounded then added.
[[maybe_unused]] float neon_order_ref(bool bf16, const uint16_t* w, const float* x, int64_t n) {
    float A[4] = {0, 0, 0, 0}, B[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 4; ++l) {
            A[l] = std::fma(half_value(bf16, w[i + l]), x[i + l], A[l]);
            B[l] = std::fma(half_value(bf16, w[i + 4 + l]), x[i + 4 + l], B[l]);
        }
    float s[4];
    for (int l = 0; l < 4; ++l) s[l] = A[l] + B[l];
    float acc = (s[0] + s[1]) + (s[2] + s[3]);
    for (; i < n; ++i) {
        const float p = half_value(bf16, w[i]) * x[i];
        acc = acc + p;
    }
    return acc;
}

std::vector<uint16_t> random_half(bool bf16, int64_t count) {
    std::vector<uint16_t> w((size_t)count);
    for (auto& h : w) {
        if (bf16) {
            const float v = normal() * (float)std::ldexp(1.0, (int)below(8) - 4);
            uint32_t b;
            std::memcpy(&b, &v, 4);
            h = (uint16_t)(b >> 16);
        } else {
            h = (uint16_t)next_u64();
            if ((h & 0x7c00) == 0x7c00) h &= 0xbfff;  // no inf / NaN
        }
    }
    return w;
}

void check_half(const char* path, ThreadPool& one, ThreadPool& two) {
    for (const bool bf16 : {false, true}) {
        const GgmlType t = bf16 ? GgmlType::BF16 : GgmlType::F16;
        const char* name = type_traits(t).name;
        const quant::DotFn row = quant::dot_fn(quant::active_kernels(), t);
        const quant::HalfBlockFn block = quant::active_half_block(t);
        for (int trial = 0; trial < 60; ++trial) {
            const int64_t n = 1 + below(trial < 50 ? 80 : 300), rows = 1 + below(9), ntok = 1 + below(13);
            const std::vector<uint16_t> w = random_half(bf16, rows * n);
            std::vector<float> x((size_t)(ntok * n + 1));
            for (auto& v : x) v = normal();
            const float* xs = x.data() + (trial & 1);  // odd trials: activations 4 bytes off alignment
            const uint8_t* wb = reinterpret_cast<const uint8_t*>(w.data());
            std::vector<float> want((size_t)(rows * ntok));
            for (int64_t k = 0; k < ntok; ++k)
                for (int64_t r = 0; r < rows; ++r) {
                    want[(size_t)(k * rows + r)] = row(wb + 2 * r * n, xs + k * n, n);
#if defined(DS4_ARCH_ARM64)
                    expect_same(want[(size_t)(k * rows + r)], neon_order_ref(bf16, w.data() + r * n, xs + k * n, n),
                                "row kernel vs NEON order", path, name, r, n, k);
#endif
                }
            if (block) {  // the path's block kernel, called directly: every tile shape
                std::vector<float> y((size_t)(rows * ntok), NAN);
                block(wb, 2 * n, rows, xs, n, ntok, n, y.data(), rows);
                for (size_t i = 0; i < y.size(); ++i) expect_same(y[i], want[i], "block vs row kernel", path, name, rows, n, ntok);
            }
            // matmul / matvec (matmul_half's thread split and aligned copies when a block kernel exists)
            std::vector<float> ym((size_t)(rows * ntok), NAN);
            matmul(t, w.data(), rows, n, xs, ntok, ym.data(), trial % 2 ? &two : &one);
            for (size_t i = 0; i < ym.size(); ++i) expect_same(ym[i], want[i], "matmul vs row kernel", path, name, rows, n, ntok);
            std::vector<float> yv((size_t)rows, NAN);
            matvec(t, w.data(), rows, n, xs, yv.data(), &two);
            for (int64_t r = 0; r < rows; ++r) expect_same(yv[(size_t)r], want[(size_t)r], "matvec vs row kernel", path, name, rows, n, 0);
        }
    }
}

// On the scalar path (and on a CPU without dotprod, where it is the only one) no GEMM or tile is
// offered and matmul is the scalar row kernels.
void check_scalar_fallback(ThreadPool& pool) {
    set_simd_path(SimdPath::Scalar);
    for (const QuantLayout& L : kQuant) {
        const char* name = type_traits(L.t).name;
        ++g_checks;
        if (quant::active_gemm(L.t, nullptr, L.block_elems) != nullptr) {
            ++g_failures;
            std::printf("FAIL scalar %s: a GEMM is offered\n", name);
        }
        const int64_t rows = 5, n = 2 * L.block_elems, ntok = 6;
        const std::vector<uint8_t> w = random_matrix(L, rows, n);
        const std::vector<uint8_t> q = random_acts(L.t, n, ntok);
        std::vector<float> y((size_t)(rows * ntok), NAN);
        matmul(L.t, w.data(), rows, n, q.data(), ntok, y.data(), &pool);
        const quant::DotFn row = quant::dot_fn(quant::scalar_kernels(), L.t);
        for (int64_t k = 0; k < ntok; ++k)
            for (int64_t r = 0; r < rows; ++r)
                expect_same(y[(size_t)(k * rows + r)], row(w.data() + r * row_bytes(L.t, n), q.data() + k * act_bytes(L.t, n), n),
                            "matmul vs scalar row kernel", "scalar", name, rows, n, ntok);
    }
    ++g_checks;
    if (quant::active_half_block(GgmlType::F16) || quant::active_half_block(GgmlType::BF16)) {
        ++g_failures;
        std::printf("FAIL scalar: an F16/BF16 tile is offered\n");
    }
}

}  // namespace

int main() {
    ThreadPool one(1), two(2);
    check_scalar_fallback(two);
    int gemm_paths = 0;
    std::printf("paths available:");
    for (SimdPath p : available_simd_paths()) std::printf(" %s", simd_path_name(p));
    std::printf("\n");
    for (SimdPath p : available_simd_paths()) {
        if (p == SimdPath::Scalar) continue;
        set_simd_path(p);
        const char* path = simd_path_name(p);
        bool any = false;
        for (const QuantLayout& L : kQuant) any = any || quant::active_gemm(L.t, nullptr, L.block_elems) != nullptr;
        gemm_paths += any;
        std::printf("%s: gemm %s, half tiles %s\n", path, any ? "yes" : "no",
                    quant::active_half_block(GgmlType::F16) ? "yes" : "no");
        check_gemm(path, one, two);
        check_half(path, one, two);
    }
    std::printf("%d checks, %d failures\n", g_checks, g_failures);
    std::printf("paths with a GEMM: %d\n", gemm_paths);
    return g_failures == 0 ? 0 : 1;
}
