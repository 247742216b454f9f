// Thread split of the F16/BF16 tiles (matmul_half.h). The tiles themselves are per-ISA
// (dot_half_tile.inc); this file only decides which rows and tokens each task owns.
#include "quant/matmul_half.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/thread_pool.h"
#include "quant/gemm.h"

namespace ds4::quant {

namespace {

// Weight bytes per work item: a row block that stays in L2 (1 MiB per core on Zen 4, 2 MiB on
// recent Intel) next to the activations, and big enough that the ~µs cost of taking a task is
// noise next to streaming it.
constexpr int64_t kBlockBytes = 128 * 1024;
constexpr int64_t kMinBlockBytes = 16 * 1024;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

// DS4_GEMM=rows-half keeps the row kernels for F16/BF16 only (the quantised GEMM stays on): the
// A/B switch for these tiles (DS4_GEMM=off turns both off). Same results either way.
bool half_tiles_disabled() {
    static const bool off = [] {
        const char* v = std::getenv("DS4_GEMM");
        return v && std::strcmp(v, "rows-half") == 0;
    }();
    return off;
}

HalfBlockFn active_half_block(GgmlType t) {
    if (gemm_disabled() || half_tiles_disabled()) return nullptr;
    if (t == GgmlType::F16) return active_kernels().f16_block;
    if (t == GgmlType::BF16) return active_kernels().bf16_block;
    return nullptr;
}

// The tiles (and the row kernel) load whole 64-byte activation vectors; from an address that is not a multiple of 64
// every load spans two cache lines, which halves the tile's speed (measured: 1 x 1 tile 24 vs 54
// GFLOP/s, 2 x 3 tile 47 vs 71, n = 1024, one Zen 4 core). malloc's large blocks start 16 bytes
// into a page, so activations are copied (same values: same bits out) to an aligned buffer of
// the calling thread, whose size is kept between calls.
const float* aligned_activations(const float* x, int64_t n, int64_t nb, int64_t* stride) {
    *stride = n;
    if ((reinterpret_cast<uintptr_t>(x) & 63) == 0 && n % 16 == 0) return x;
    *stride = (n + 15) & ~int64_t(15);  // every token's activation starts on a 64-byte boundary
    thread_local std::vector<float> buf;
    if (buf.size() < (size_t)(nb * *stride) + 16) buf.resize((size_t)(nb * *stride) + 16);
    float* p = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
    for (int64_t b = 0; b < nb; ++b) std::memcpy(p + b * *stride, x + b * n, (size_t)n * sizeof(float));
    return p;
}

void matmul_half(HalfBlockFn fn, const uint8_t* w, int64_t rows, int64_t n, const float* x, int64_t nb, float* y,
                 ThreadPool& pool) {
    const int64_t rb = 2 * n, rb1 = rb > 0 ? rb : 1;
    int64_t xs = n;
    x = aligned_activations(x, n, nb, &xs);
    const int64_t want = 4 * (int64_t)pool.size();  // work items for an even split over threads
    int64_t block_rows = kBlockBytes / rb1;
    // A small matrix with few tokens: smaller row blocks (down to ~16 KiB) so every thread has
    // work. With many tokens the tokens are split instead (below): a large row block reuses each
    // activation tile for more rows (4096 x 24, 512 tokens: 6-row blocks ran 2x slower).
    if (nb < 12 && ceil_div(rows, block_rows) < want) {
        const int64_t even = ceil_div(rows, want), least = ceil_div(kMinBlockBytes, rb1);
        block_rows = even > least ? even : least;
    }
    block_rows = (block_rows + 1) & ~int64_t(1);  // whole tiles of 2 rows
    const int64_t row_blocks = ceil_div(rows, block_rows);
    // Too few row blocks for a large batch (the 24-row hc_*_fn matrices): split its tokens, in
    // whole tiles of 3 (a small batch keeps one pass over the weights). Which task computes an
    // output never changes its value.
    int64_t block_toks = nb;
    if (row_blocks < want && nb >= 12) block_toks = 3 * ceil_div(ceil_div(nb, ceil_div(want, row_blocks)), 3);
    const int64_t tok_blocks = ceil_div(nb, block_toks);
    pool.parallel_for(
        row_blocks * tok_blocks,
        [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; ++i) {
                const int64_t r0 = (i / tok_blocks) * block_rows, t0 = (i % tok_blocks) * block_toks;
                const int64_t nr = rows - r0 < block_rows ? rows - r0 : block_rows;
                const int64_t nt = nb - t0 < block_toks ? nb - t0 : block_toks;
                fn(w + r0 * rb, rb, nr, x + t0 * xs, xs, nt, n, y + t0 * rows + r0, rows);
            }
        },
        1);
}

}  // namespace ds4::quant
