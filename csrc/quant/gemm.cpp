// The portable half of the prefill GEMM (gemm.h): which per-ISA group kernel runs (avx512vnni,
// avx512, avx2, neon), the activation-side corrections, the per-thread panel scratch and the split of row
// groups over threads. The ISA files only decode panels and run micro-kernels.
#include "quant/gemm.h"

#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/thread_pool.h"
#include "quant/formats.h"
#include "quant/simd.h"

namespace ds4::quant {

bool gemm_disabled() {
    static const bool off = [] {
        const char* v = std::getenv("DS4_GEMM");
        return v && (std::strcmp(v, "off") == 0 || std::strcmp(v, "0") == 0);
    }();
    return off;
}

namespace {

const GemmKernels* table_for_active_path() {
    if (gemm_disabled()) return nullptr;
#if defined(DS4_ARCH_X86)
    if (simd_path() == SimdPath::AVX512VNNI) return &avx512vnni_gemm();
    if (simd_path() == SimdPath::AVX512) return &avx512_gemm();
    if (simd_path() == SimdPath::AVX2) return &avx2_gemm();
#endif
#if defined(DS4_ARCH_ARM64)
    if (simd_path() == SimdPath::NEON) return &neon_gemm();
#endif
    return nullptr;
}

GemmGroupFn pick(const GemmKernels& k, GgmlType t) {
    switch (t) {
        case GgmlType::Q8_0: return k.q8_0;
        case GgmlType::Q2_K: return k.q2_k;
        case GgmlType::Q4_K: return k.q4_k;
        case GgmlType::IQ2_XXS: return k.iq2_xxs;
        default: return nullptr;
    }
}

// The activation-side data a kernel asks for (GemmKernels::*_corr), computed once per call for
// every token (n/32 int32 per token, a few KiB) and shared by all row groups:
//  * OffsetSum: vpdpbusd multiplies unsigned bytes, so the VNNI panels hold code + 128 and each
//    group of 32 activation codes needs -128 * (their sum) added back;
//  * MinCodeMask: the AVX2 / plain AVX-512 Q8_0 tiles multiply |w| by the activation code with w's
//    sign moved onto it, which wraps for a code of -128 (only in blocks with a subnormal scale,
//    quantize_act.cpp); the mask of those codes (almost always 0) lets the tile correct them.
GemmCorr corr_kind(const GemmKernels& k, GgmlType t) {
    return t == GgmlType::Q8_0 ? k.q8_0_corr : t == GgmlType::IQ2_XXS ? k.iq2_xxs_corr : GemmCorr::None;
}

std::vector<int32_t> corrections(GemmCorr kind, GgmlType t, const uint8_t* xq, int64_t act_bytes, int64_t ntok,
                                 int64_t n, ThreadPool& pool) {
    const int64_t groups = n / 32;
    std::vector<int32_t> corr((size_t)(ntok * groups));
    // Split over tokens: a routed-experts call has thousands of (token, slot) rows, which the
    // calling thread alone would otherwise sum while the others wait (docs/gemm.md, "Prefill profile").
    pool.parallel_for(ntok, [&](int64_t tok0, int64_t tok1) {
    for (int64_t tok = tok0; tok < tok1; ++tok) {
        const uint8_t* x = xq + tok * act_bytes;
        for (int64_t g = 0; g < groups; ++g) {
            // Q8_0 activation blocks: 4-byte scale + 32 codes; Q8_K: 4-byte scale, 256 codes, bsums.
            const int8_t* q = reinterpret_cast<const int8_t*>(
                t == GgmlType::Q8_0 ? x + g * (int64_t)sizeof(BlockQ8_0Act) + 4
                                    : x + (g / 8) * (int64_t)sizeof(BlockQ8K) + 4 + (g % 8) * 32);
            int32_t s = 0;
            if (kind == GemmCorr::OffsetSum) {
                for (int i = 0; i < 32; ++i) s += q[i];
                s *= -128;
            } else {
                uint32_t m = 0;
                for (int i = 0; i < 32; ++i) m |= (uint32_t)(q[i] == -128) << i;
                s = (int32_t)m;
            }
            corr[(size_t)(tok * groups + g)] = s;
        }
    }
    }, 16);
    return corr;
}

// One thread's panel scratch, kept between calls (grows to the largest panel seen).
uint8_t* panel_scratch(size_t bytes) {
    thread_local std::vector<uint8_t> buf;
    if (buf.size() < bytes + 64) buf.resize(bytes + 64);
    const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
    return reinterpret_cast<uint8_t*>((p + 63) & ~uintptr_t(63));
}

}  // namespace

int64_t gemm_min_tokens(GgmlType t) {
    // CPU time per token, 2048 x 4096, 2 threads (avx512vnni): the GEMM is ahead from 3-4 tokens
    // on Q8_0 / Q4_K / IQ2_XXS and from about 6 on Q2_K, whose panel takes the most gathers.
    // (Dense Q8_0 matmul sends batches below 16 to the prepared small-batch kernel first where
    // the path has one, matvec.cpp; this value still decides Q8_0 routed experts.) IQ2_XXS: per
    // path (GemmKernels::iq2_xxs_min_tokens; 8 on avx2 / avx512, one thread, docs/gemm.md).
    if (t == GgmlType::IQ2_XXS)
        if (const GemmKernels* k = table_for_active_path()) return k->iq2_xxs_min_tokens;
    return t == GgmlType::Q2_K ? 6 : 4;
}

GemmGroupFn active_gemm(GgmlType t, size_t* panel_bytes, int64_t n, int* rows_per_group) {
    const GemmKernels* k = table_for_active_path();
    if (!k) return nullptr;
    GemmGroupFn fn = pick(*k, t);
    if (fn && panel_bytes) *panel_bytes = k->panel_bytes(t, n);
    if (fn && rows_per_group) *rows_per_group = k->rows;
    return fn;
}

void gemm_grouped(GgmlType t, const uint8_t* w, const int64_t* mat_offsets, const int64_t* tok0, int64_t n_mats,
                  int64_t rows, int64_t n, const uint8_t* xq, int64_t act_bytes, float* const* yrows,
                  ThreadPool& pool, int64_t min_tokens) {
    size_t pbytes = 0;
    int group_rows = 0;
    GemmGroupFn fn = active_gemm(t, &pbytes, n, &group_rows);
    const int64_t ntok = tok0[n_mats];
    std::vector<int32_t> corr;
    const GemmKernels* table = table_for_active_path();
    const GemmCorr kind = table ? corr_kind(*table, t) : GemmCorr::None;
    if (kind != GemmCorr::None) corr = corrections(kind, t, xq, act_bytes, ntok, n, pool);
    const int64_t groups = (rows + group_rows - 1) / group_rows;
    const int64_t rb = row_bytes(t, n);
    // Work items (matrix, row group) for the matrices that have tokens.
    std::vector<int64_t> items;
    for (int64_t e = 0; e < n_mats; ++e) {
        const int64_t count = tok0[e + 1] - tok0[e];
        if (count == 0 || count < min_tokens) continue;
        for (int64_t g = 0; g < groups; ++g) items.push_back(e * groups + g);
    }
    pool.parallel_for(
        (int64_t)items.size(),
        [&](int64_t i0, int64_t i1) {
            uint8_t* panel = panel_scratch(pbytes);
            for (int64_t i = i0; i < i1; ++i) {
                const int64_t e = items[(size_t)i] / groups, g = items[(size_t)i] % groups;
                GemmGroup grp;
                grp.row0 = g * group_rows;
                grp.nrows = (int)(rows - grp.row0 < group_rows ? rows - grp.row0 : group_rows);
                grp.w = w + mat_offsets[e] + grp.row0 * rb;
                grp.row_bytes = rb;
                grp.n = n;
                grp.xq = xq + tok0[e] * act_bytes;
                grp.act_bytes = act_bytes;
                grp.corr = corr.empty() ? nullptr : corr.data() + tok0[e] * (n / 32);
                grp.ntok = tok0[e + 1] - tok0[e];
                grp.y = yrows + tok0[e];
                grp.panel = panel;
                fn(grp);
            }
        },
        // Items differ in work (an expert's token count), so many short ranges: a thread that
        // draws the last one waits less for the other (the split never changes a value).
        1, items.size() >= 256 ? 16 : 4);
}

void gemm(GgmlType t, const uint8_t* w, int64_t rows, int64_t n, const uint8_t* xq, int64_t act_bytes,
          int64_t ntok, float* const* yrows, ThreadPool& pool) {
    const int64_t off = 0, tok0[2] = {0, ntok};
    gemm_grouped(t, w, &off, tok0, 1, rows, n, xq, act_bytes, yrows, pool);
}

DotPeak int8_dot_peak(ThreadPool& pool, int64_t iters) {
    DotPeak out;
#if defined(DS4_ARCH_X86)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bw")) return out;
    const int nt = pool.size();
    std::vector<double> cpu((size_t)nt, 0.0);
    std::atomic<int64_t> sink{0};
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(
        nt,
        [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; ++i) {
                timespec a, b;
                clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
                sink += avx512vnni_dot_loop(iters);
                clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
                cpu[(size_t)i] = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
            }
        },
        1);
    out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (double c : cpu) out.cpu_s += c;
    out.macs = (double)nt * (double)iters * 12.0 * 64.0;
#else
    (void)pool;
    (void)iters;
#endif
    return out;
}

}  // namespace ds4::quant
