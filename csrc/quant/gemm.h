// Register-blocked quantised GEMM for prefill (docs/gemm.md): a group of weight rows (16 for
// AVX-512 with or without VNNI, 8 for AVX2: one vector of int32 lanes; 8 for NEON: two) is
// decoded once into an int8 panel laid out for the dot-product instructions (4 consecutive
// k of 16 rows per 64-byte vector), and the micro-kernel applies it to every token of the batch,
// several tokens per register tile. The panel is scratch of one group (tens of KiB, stays in L2);
// the mapped weights are never copied or repacked as a whole.
//
// Numerics: each output is the row kernel's computation of the same SIMD path, to the bit: the
// same exact int32 block sums and the same float operations in the same order (Q2_K, Q4_K,
// IQ2_XXS: scalar block order; Q8_0: the x86 row kernel's eight-lane order, see gemm.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace ds4 {
class ThreadPool;
}

namespace ds4::quant {

// One row group against a batch of tokens (filled by gemm.cpp, consumed by a per-ISA kernel).
struct GemmGroup {
    const uint8_t* w;        // first weight row of the group
    int64_t row_bytes;       // distance between weight rows
    int nrows;               // rows in this group, 1..GemmKernels::rows
    int64_t n;               // row length (whole blocks)
    const uint8_t* xq;       // activation of token 0, as quantize_act wrote it
    int64_t act_bytes;       // distance between token activations
    const int32_t* corr;     // per token, per 32 codes: what the kernel's GemmCorr asks for, else nullptr
    int64_t ntok;
    float* const* y;         // y[t][row0 + i]: output of row i of the group for token t
    int64_t row0;
    uint8_t* panel;          // scratch of panel_bytes(type, n) bytes, 64-byte aligned
};

using GemmGroupFn = void (*)(const GemmGroup& g);

// What the driver computes once per call for every token and 32 activation codes (GemmGroup::corr).
enum class GemmCorr : uint8_t {
    None,         // nothing: corr is nullptr
    OffsetSum,    // -128 * (sum of the codes): the panel holds code + 128 for vpdpbusd
    MinCodeMask,  // bit i set where code i is -128: the Q8_0 tiles that move the weight's sign onto
                  // the activation code (vpmaddubsw on |w|) correct those products (docs/gemm.md)
};

struct GemmKernels {
    int rows;  // weight rows per group (panel width)
    GemmGroupFn q8_0;  // nullptr: that type keeps the row kernels on this path
    GemmGroupFn q2_k;
    GemmGroupFn q4_k;
    GemmGroupFn iq2_xxs;
    size_t (*panel_bytes)(GgmlType t, int64_t n);
    GemmCorr q8_0_corr;  // Q2_K and Q4_K never need any
    GemmCorr iq2_xxs_corr;
    // gemm_min_tokens for IQ2_XXS: its panel decode costs far more without VBMI (a grid-table
    // gather per panel vector), so the crossover moves up (docs/gemm.md "Measured").
    int iq2_xxs_min_tokens;
};

#if defined(DS4_ARCH_X86)
const GemmKernels& avx512vnni_gemm();  // gemm_avx512vnni.cpp
const GemmKernels& avx512_gemm();      // gemm_avx512.cpp (plain AVX-512BW)
const GemmKernels& avx2_gemm();        // gemm_avx2.cpp
// 12 independent vpdpbusd zmm chains, iters rounds: 12 * 64 * iters int8 multiply-adds. The
// return value depends on every accumulator (so the loop is not optimised away).
int64_t avx512vnni_dot_loop(int64_t iters);
#endif
#if defined(DS4_ARCH_ARM64)
const GemmKernels& neon_gemm();  // gemm_neon.cpp (sdot: signed codes, no corrections needed)
#endif

// The int8 dot-product peak of this machine, measured: every thread of pool runs
// avx512vnni_dot_loop(iters) at once. macs == 0 where the CPU/build has no VNNI.
struct DotPeak {
    double macs = 0;    // int8 multiply-adds done, all threads
    double wall_s = 0;  // wall time of the whole run
    double cpu_s = 0;   // sum of the threads' CPU time (load-resistant: time the cores really ran)
};
DotPeak int8_dot_peak(ThreadPool& pool, int64_t iters);

// DS4_GEMM=off (or 0) in the environment: matmul keeps the row kernels for every type, the
// quantised GEMM and the F16/BF16 tiles alike (an A/B switch for benchmarks; same results).
bool gemm_disabled();

// The group kernel of the active SIMD path for type t, or nullptr (caller keeps the row kernels);
// with it, the panel scratch size for rows of n and the rows per group.
GemmGroupFn active_gemm(GgmlType t, size_t* panel_bytes, int64_t n, int* rows_per_group = nullptr);

// Fewest tokens for which the GEMM beats the row kernels on one matrix: below it, decoding the
// panel costs more than it saves (measured crossover, 4096-long rows, docs/gemm.md).
int64_t gemm_min_tokens(GgmlType t);

// Y rows for tokens t in [0, ntok): yrows[t][r] = dot(W row r, xq + t * act_bytes), r < rows.
// Requires active_gemm(t) != nullptr. Work is split by row groups only: any thread count gives
// the same bits.
void gemm(GgmlType t, const uint8_t* w, int64_t rows, int64_t n, const uint8_t* xq, int64_t act_bytes,
          int64_t ntok, float* const* yrows, ThreadPool& pool);

// The same for several matrices at once (routed experts): item e uses matrix w + mats[e] and the
// tokens [tok0[e], tok0[e+1]) of the shared activation/output lists. Matrices with fewer than
// min_tokens tokens are skipped (the caller runs them on the row kernels).
void gemm_grouped(GgmlType t, const uint8_t* w, const int64_t* mat_offsets, const int64_t* tok0, int64_t n_mats,
                  int64_t rows, int64_t n, const uint8_t* xq, int64_t act_bytes, float* const* yrows,
                  ThreadPool& pool, int64_t min_tokens = 1);

}  // namespace ds4::quant
