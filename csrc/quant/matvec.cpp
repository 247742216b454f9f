// Matrix-vector products over whole weight matrices. Work is split by output rows only (each row
// is one dot_row call), so results are bit-identical for every thread count.
#include <string>

#include "common/errors.h"
#include "common/thread_pool.h"
#include "quant/dot_kernels.h"
#include "quant/kernels.h"

namespace ds4 {

using namespace quant;

namespace {

// Rows per task: enough weight bytes (~64 KiB) that scheduling cost is noise next to streaming.
int64_t min_rows_per_task(int64_t row_bytes) {
    const int64_t target = 64 * 1024;
    return row_bytes >= target ? 1 : target / (row_bytes > 0 ? row_bytes : 1);
}

void check_dims(const char* fn, int64_t rows, int64_t n) {
    if (rows < 0 || n < 0) {
        fail(ErrorKind::InvalidArgument,
             std::string(fn) + ": negative size (rows=" + std::to_string(rows) + ", n=" + std::to_string(n) + ")");
    }
}

void check_ptrs(const char* fn, const void* w, const void* xq, const void* y) {
    if (!w || !xq || !y) fail(ErrorKind::InvalidArgument, std::string(fn) + ": null buffer");
}

ThreadPool& pool_or_global(ThreadPool* pool) { return pool ? *pool : ThreadPool::global(); }

// Software prefetch of the bytes a fixed distance ahead of the row about to be read. The
// hardware prefetchers stop at page boundaries and the K/IQ kernels are slow enough per byte that
// DRAM latency shows; asking early hides it. Prefetches never fault, but stay inside [lo, hi).
constexpr int64_t kPrefetchAhead = 6 * 1024;

inline void prefetch_span(const uint8_t* p, int64_t bytes, const uint8_t* hi) {
    const uint8_t* end = p + bytes < hi ? p + bytes : hi;
    for (; p < end; p += 64) __builtin_prefetch(p, 0, 3);
}

}  // namespace

float dot_row(GgmlType weight_type, const void* w_row, const void* xq, int64_t n) {
    row_bytes(weight_type, n);
    DotFn fn = dot_fn(active_kernels(), weight_type);
    return fn(w_row, xq, n);
}

void matvec(GgmlType t, const void* w, int64_t rows, int64_t n, const void* xq, float* y, ThreadPool* pool) {
    check_dims("matvec", rows, n);
    const int64_t rb = row_bytes(t, n);
    DotFn fn = dot_fn(active_kernels(), t);
    act_bytes(t, n);
    if (rows == 0) return;
    check_ptrs("matvec", w, xq, y);
    const uint8_t* wb = static_cast<const uint8_t*>(w);
    pool_or_global(pool).parallel_for(
        rows,
        [&](int64_t r0, int64_t r1) {
            const uint8_t* hi = wb + r1 * rb;
            for (int64_t r = r0; r < r1; ++r) {
                prefetch_span(wb + r * rb + kPrefetchAhead, rb, hi);
                y[r] = fn(wb + r * rb, xq, n);
            }
        },
        min_rows_per_task(rb));
}

void matmul(GgmlType t, const void* w, int64_t rows, int64_t n, const void* xq, int64_t nb, float* y,
            ThreadPool* pool) {
    check_dims("matmul", rows, n);
    if (nb < 0) fail(ErrorKind::InvalidArgument, "matmul: negative batch " + std::to_string(nb));
    const int64_t rb = row_bytes(t, n);
    const int64_t ab = act_bytes(t, n);
    DotFn fn = dot_fn(active_kernels(), t);
    if (rows == 0 || nb == 0) return;
    check_ptrs("matmul", w, xq, y);
    const uint8_t* wb = static_cast<const uint8_t*>(w);
    const uint8_t* xb = static_cast<const uint8_t*>(xq);
    // Each task owns a row range; inside it, a tile of rows is applied to the whole batch so the
    // tile's weights stay in cache while the activations stream past.
    const int64_t tile = 8;
    pool_or_global(pool).parallel_for(
        rows,
        [&](int64_t r0, int64_t r1) {
            for (int64_t t0 = r0; t0 < r1; t0 += tile) {
                const int64_t t1 = t0 + tile < r1 ? t0 + tile : r1;
                for (int64_t b = 0; b < nb; ++b) {
                    const uint8_t* xb_b = xb + b * ab;
                    float* yb = y + b * rows;
                    for (int64_t r = t0; r < t1; ++r) yb[r] = fn(wb + r * rb, xb_b, n);
                }
            }
        },
        1);
}

void matvec_experts(GgmlType t, const void* w, int64_t n_expert, int64_t rows, int64_t n, const int32_t* ids,
                    int64_t n_ids, const void* xq, int64_t xq_stride, float* y, ThreadPool* pool) {
    check_dims("matvec_experts", rows, n);
    if (n_expert <= 0 || n_ids < 0 || xq_stride < 0) {
        fail(ErrorKind::InvalidArgument, "matvec_experts: n_expert=" + std::to_string(n_expert) +
                                             ", n_ids=" + std::to_string(n_ids) + ", xq_stride=" +
                                             std::to_string(xq_stride) + " (need n_expert > 0, others >= 0)");
    }
    const int64_t rb = row_bytes(t, n);
    const int64_t ab = act_bytes(t, n);
    if (xq_stride != 0 && xq_stride < ab) {
        fail(ErrorKind::InvalidArgument, "matvec_experts: xq_stride " + std::to_string(xq_stride) +
                                             " is smaller than one activation (" + std::to_string(ab) + " bytes)");
    }
    DotFn fn = dot_fn(active_kernels(), t);
    if (n_ids == 0 || rows == 0) return;
    if (!ids) fail(ErrorKind::InvalidArgument, "matvec_experts: null ids");
    check_ptrs("matvec_experts", w, xq, y);
    for (int64_t i = 0; i < n_ids; ++i) {
        if (ids[i] < 0 || ids[i] >= n_expert) {
            fail(ErrorKind::InvalidArgument, "matvec_experts: expert id " + std::to_string(ids[i]) + " at slot " +
                                                 std::to_string(i) + " is outside [0, " + std::to_string(n_expert) + ")");
        }
    }
    const uint8_t* wb = static_cast<const uint8_t*>(w);
    const uint8_t* xb = static_cast<const uint8_t*>(xq);
    const int64_t mat_bytes = rb * rows;
    // Flatten (slot, row) so all threads share the work even with few selected experts.
    pool_or_global(pool).parallel_for(
        n_ids * rows,
        [&](int64_t k0, int64_t k1) {
            for (int64_t k = k0; k < k1; ++k) {
                const int64_t i = k / rows, r = k % rows;
                const uint8_t* mat = wb + ids[i] * mat_bytes;
                // Within one expert's rows; the next expert's start is picked up by the hardware.
                prefetch_span(mat + r * rb + kPrefetchAhead, rb, mat + mat_bytes);
                y[k] = fn(mat + r * rb, xb + i * xq_stride, n);
            }
        },
        min_rows_per_task(rb));
}

}  // namespace ds4
