// Matrix-vector products over whole weight matrices. Work is split by output rows only (each row
// is one row-dot kernel call), so results are bit-identical for every thread count.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/decode_switches.h"
#include "common/errors.h"
#include "common/thread_pool.h"
#include "quant/dot_kernels.h"
#include "quant/gemm.h"
#include "quant/kernels.h"
#include "quant/matmul_half.h"

namespace ds4 {

using namespace quant;

namespace {

// Ranges per thread of a weight-streaming row split. At the end of a job one thread finishes its
// last range while the other waits (on average half a range), so on a large matrix short ranges
// pay: with the pool's default 4, a 2-thread matvec over the output head (8 ranges of 35 MB)
// could lose up to 1/8 of its time there. But each range starts its software prefetch afresh, so
// ranges stay at least ~4 MB: up to 16 per thread on large matrices, the default 4 below that.
int ranges_per_thread(int64_t bytes, const ThreadPool& pool) {
    const int64_t per = bytes / ((int64_t)pool.size() * (4 << 20));
    return per < 4 ? 4 : per > 16 ? 16 : (int)per;
}

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

// Weight-streaming products end with short ranges (common/range_split.h), unless switched off for
// an A/B comparison (common/decode_switches.h).
Split streaming_split() {
    return decode_switches().tapered.load(std::memory_order_relaxed) ? Split::Tapered : Split::Even;
}

// Software prefetch of the bytes a fixed distance ahead of the row about to be read. The
// hardware prefetchers stop at page boundaries and the K/IQ kernels are slow enough per byte that
// DRAM latency shows; asking early hides it. Prefetches never fault, but stay inside [lo, hi).
// Into L2 (prefetcht1), not L1: L2 tracks more misses in flight than L1's fill buffers, and the
// L1 prefetcher pulls the lines on from L2. Measured on decode (small, 2 threads, AVX-512):
// 6 KiB ahead into L1 ~46 tok/s, 3 KiB ahead into L2 ~50 tok/s (1 KiB 46, 8-16 KiB 48-49).
// That was before the Q8_0 one-activation kernel; Q8_0 now has its own distance (below).
constexpr int64_t kPrefetchAhead = 3 * 1024;

inline void prefetch_span(const uint8_t* p, int64_t bytes, const uint8_t* hi) {
    const uint8_t* end = p + bytes < hi ? p + bytes : hi;
    for (; p < end; p += 64) __builtin_prefetch(p, 0, 2);
}

// Q8_0 rows prefetch further ahead (decode_switches().q8_prefetch, 16 KiB by default): with the
// one-activation kernel the head streamed ~25 % more CPU time per byte at 3 KiB than at 16 KiB,
// which matched stream_read (docs/kernels.md, "The Q8_0 weight streaming at 2 threads").
int64_t prefetch_ahead(GgmlType t, const PreparedDot& prep) {
    if (t != GgmlType::Q8_0) return kPrefetchAhead;
    const DecodeSwitches& sw = decode_switches();
    // A kernel that prefetches as it goes gets no burst before each row (dot_kernels.h).
    if (prep.dot && prep.prefetches && sw.q8_prefetch_inline.load(std::memory_order_relaxed)) return 0;
    return sw.q8_prefetch.load(std::memory_order_relaxed);
}

// Rows [r0, r1) of one matrix (mat, rows of rb bytes, mat_end its end) against one activation:
// one DotFn call per row, or DotRowsFn calls over runs of up to kRowRun rows where the path has
// them (same results, dot_kernels.h).
constexpr int64_t kRowRun = 16;

inline void dot_rows(DotFn fn, DotRowsFn rows_fn, const uint8_t* mat, const uint8_t* mat_end, int64_t rb, int64_t r0,
                     int64_t r1, const void* xa, int64_t n, float* y, int64_t ahead = kPrefetchAhead) {
    if (!rows_fn) {
        if (ahead <= 0) {
            for (int64_t r = r0; r < r1; ++r) y[r - r0] = fn(mat + r * rb, xa, n);
            return;
        }
        for (int64_t r = r0; r < r1; ++r) {
            prefetch_span(mat + r * rb + ahead, rb, mat_end);
            y[r - r0] = fn(mat + r * rb, xa, n);
        }
        return;
    }
    for (int64_t r = r0; r < r1; r += kRowRun) {
        const int64_t e = r + kRowRun < r1 ? r + kRowRun : r1;
        prefetch_span(mat + r * rb + kPrefetchAhead, (e - r) * rb, mat_end);
        rows_fn(mat + r * rb, rb, e - r, xa, n, y + (r - r0));
    }
}

// Batches below this many tokens run the small-batch prepared kernels (PreparedDot::dot_n) where
// the path has them, instead of the GEMM or the DotNFn row kernels.
// Q8_0 (avx512vnni): CPU time per call, 16384 x 4096 (71 MB, from DRAM), 2 threads, relative to
// one matvec and against the GEMM: docs/kernels.md ("Q8_0 small batches"); small ahead up to 15
// tokens, even at 16, the GEMM ahead from 24.
int64_t small_batch_max_tokens(GgmlType t) { return t == GgmlType::Q8_0 ? 16 : 0; }

// matmul for small batches: every activation is prepared once, then each weight row is applied
// to up to kPreparedMaxN of them at a time with its bytes loaded once. Split by rows only.
void matmul_prepared(const PreparedDot& prep, const uint8_t* wb, int64_t rows, int64_t n, int64_t rb,
                     const uint8_t* xb, int64_t ab, int64_t nb, float* y, ThreadPool& pool) {
    const int64_t pb = prep.bytes(n);
    thread_local std::vector<uint8_t> buf;
    buf.resize((size_t)(pb * nb));
    for (int64_t b = 0; b < nb; ++b) prep.prepare(xb + b * ab, n, buf.data() + b * pb);
    const uint8_t* xa = buf.data();
    pool.parallel_for(
        rows,
        [&](int64_t r0, int64_t r1) {
            const uint8_t* hi = wb + r1 * rb;
            for (int64_t r = r0; r < r1; ++r) {
                prefetch_span(wb + r * rb + kPrefetchAhead, rb, hi);
                for (int64_t b = 0; b < nb; b += kPreparedMaxN) {
                    const int na = nb - b < kPreparedMaxN ? (int)(nb - b) : kPreparedMaxN;
                    float out[kPreparedMaxN];
                    prep.dot_n(wb + r * rb, xa + b * pb, pb, na, n, out);
                    for (int k = 0; k < na; ++k) y[(b + k) * rows + r] = out[k];
                }
            }
        },
        min_rows_per_task(rb));
}

}  // namespace

void matvec(GgmlType t, const void* w, int64_t rows, int64_t n, const void* xq, float* y, ThreadPool* pool) {
    check_dims("matvec", rows, n);
    const int64_t rb = row_bytes(t, n);
    DotFn fn = dot_fn(active_kernels(), t);
    act_bytes(t, n);
    if (rows == 0) return;
    check_ptrs("matvec", w, xq, y);
    const uint8_t* wb = static_cast<const uint8_t*>(w);
    if (HalfBlockFn hb = active_half_block(t)) {  // F16/BF16 tiles (matmul_half.h), the row kernel's bits
        matmul_half(hb, wb, rows, n, static_cast<const float*>(xq), 1, y, pool_or_global(pool));
        return;
    }
    // Where the path has a prepared form, the activation is rearranged once for all rows
    // (dot_kernels.h); its row kernel has DotFn's signature and gives the same results.
    const PreparedDot prep = prepared_vec_dot(active_kernels(), t);
    // The several-rows kernels read the plain activation layout, never a prepared one.
    DotRowsFn rows_fn = prep.dot ? nullptr : dot_rows_fn(active_kernels(), t);
    const void* xa = xq;
    if (prep.dot) {
        thread_local std::vector<uint8_t> buf;
        buf.resize((size_t)prep.bytes(n));
        prep.prepare(xq, n, buf.data());
        xa = buf.data();
        fn = prep.dot;
    }
    pool_or_global(pool).parallel_for(
        rows,
        [&, ahead = prefetch_ahead(t, prep)](int64_t r0, int64_t r1) {
            dot_rows(fn, rows_fn, wb, wb + r1 * rb, rb, r0, r1, xa, n, y + r0, ahead);
        },
        min_rows_per_task(rb), ranges_per_thread(rows * rb, pool_or_global(pool)), streaming_split());
}

// One dispatch for several matvecs over one activation (kernels.h): each part's rows are cut into
// units of ~64 KiB of weights (min_rows_per_task), the units of all parts are numbered one after
// another, and the pool splits that list, so a task may finish one weight and start the next.
// Each unit runs the same kernel matvec() would pick for its part (prepared form, several-rows
// kernel, F16/BF16 tile), and every output row is one kernel result independent of where the
// split falls, so the outputs are matvec()'s bits.
void matvec_group(const MatvecPart* parts, int n_parts, int64_t n, ThreadPool* pool) {
    if (n_parts < 0 || (n_parts > 0 && !parts)) fail(ErrorKind::InvalidArgument, "matvec_group: bad part list");
    struct Plan {
        DotFn fn = nullptr;
        DotRowsFn rows_fn = nullptr;
        HalfBlockFn half = nullptr;
        const uint8_t* w = nullptr;
        int64_t rb = 0, rows = 0, unit_rows = 1, first_unit = 0, units = 0, ahead = 0;
        const void* xa = nullptr;
        float* y = nullptr;
    };
    // Prepared activations (Q8_0's rearranged form, aligned float copies), one per distinct
    // (kind, type, activation) of the group: parts that share an activation share its preparation.
    struct Prepared {
        int kind;
        GgmlType t;
        const void* xq;
        std::vector<uint8_t> bytes;
        const void* data;
    };
    thread_local std::vector<Plan> plans;
    thread_local std::vector<Prepared> prepared;
    plans.assign((size_t)n_parts, Plan{});
    prepared.reserve((size_t)n_parts);   // no reallocation below: `data` may point into `bytes`
    size_t n_prepared = 0;
    auto prepare_once = [&](int kind, GgmlType t, const void* xq, auto make) -> const void* {
        for (size_t i = 0; i < n_prepared; ++i) {
            const Prepared& p = prepared[i];
            if (p.kind == kind && p.t == t && p.xq == xq) return p.data;
        }
        if (prepared.size() <= n_prepared) prepared.emplace_back();
        Prepared& p = prepared[n_prepared++];
        p.kind = kind;
        p.t = t;
        p.xq = xq;
        p.data = make(p.bytes);
        return p.data;
    };
    int64_t total_units = 0;
    for (int i = 0; i < n_parts; ++i) {
        const MatvecPart& part = parts[i];
        Plan& pl = plans[(size_t)i];
        check_dims("matvec_group", part.rows, n);
        pl.rb = row_bytes(part.t, n);
        pl.fn = dot_fn(active_kernels(), part.t);
        act_bytes(part.t, n);
        pl.first_unit = total_units;
        if (part.rows == 0) continue;
        check_ptrs("matvec_group", part.w, part.xq, part.y);
        pl.w = static_cast<const uint8_t*>(part.w);
        pl.rows = part.rows;
        pl.y = part.y;
        pl.unit_rows = min_rows_per_task(pl.rb);
        pl.units = (part.rows + pl.unit_rows - 1) / pl.unit_rows;
        total_units += pl.units;
        if ((pl.half = active_half_block(part.t))) {
            // The tiles want 64-byte aligned float activations (matmul_half.h): the same values.
            pl.xa = prepare_once(0, GgmlType::F32, part.xq, [&](std::vector<uint8_t>& b) -> const void* {
                if ((reinterpret_cast<uintptr_t>(part.xq) & 63) == 0) return part.xq;
                b.resize((size_t)n * 4 + 64);
                uint8_t* p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(b.data()) + 63) & ~uintptr_t(63));
                std::memcpy(p, part.xq, (size_t)n * 4);
                return p;
            });
            continue;
        }
        const PreparedDot prep = prepared_vec_dot(active_kernels(), part.t);  // matvec()'s choice
        pl.ahead = prefetch_ahead(part.t, prep);
        pl.rows_fn = prep.dot ? nullptr : dot_rows_fn(active_kernels(), part.t);
        pl.xa = part.xq;
        if (prep.dot) {
            pl.fn = prep.dot;
            pl.xa = prepare_once(1, part.t, part.xq, [&](std::vector<uint8_t>& b) -> const void* {
                b.resize((size_t)prep.bytes(n));
                prep.prepare(part.xq, n, b.data());
                return b.data();
            });
        }
    }
    if (total_units == 0) return;
    // The workers read the caller's plans: a thread_local named inside the lambda would be theirs.
    const Plan* const plan = plans.data();
    pool_or_global(pool).parallel_for(
        total_units,
        [&](int64_t u0, int64_t u1) {
            for (int i = 0; i < n_parts && u0 < u1; ++i) {
                const Plan& pl = plan[i];
                const int64_t end = pl.first_unit + pl.units;
                if (u0 >= end) continue;
                const int64_t e = u1 < end ? u1 : end;
                const int64_t r0 = (u0 - pl.first_unit) * pl.unit_rows;
                const int64_t r1 = (e - pl.first_unit) * pl.unit_rows < pl.rows ? (e - pl.first_unit) * pl.unit_rows
                                                                                 : pl.rows;
                if (pl.half) {
                    pl.half(pl.w + r0 * pl.rb, pl.rb, r1 - r0, static_cast<const float*>(pl.xa), n, 1, n, pl.y + r0,
                            pl.rows);
                } else {
                    dot_rows(pl.fn, pl.rows_fn, pl.w, pl.w + r1 * pl.rb, pl.rb, r0, r1, pl.xa, n, pl.y + r0, pl.ahead);
                }
                u0 = e;
            }
        },
        1, 4, streaming_split());
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
    if (HalfBlockFn hb = active_half_block(t)) {  // F16/BF16 register tiles (matmul_half.h), same bits
        matmul_half(hb, wb, rows, n, reinterpret_cast<const float*>(xb), nb, y, pool_or_global(pool));
        return;
    }
    const PreparedDot prep = prepared_dot(active_kernels(), t);
    if (prep.dot_n && nb < small_batch_max_tokens(t)) {
        matmul_prepared(prep, wb, rows, n, rb, xb, ab, nb, y, pool_or_global(pool));
        return;
    }
    if (active_gemm(t, nullptr, n) && nb >= gemm_min_tokens(t)) {  // register-blocked GEMM (gemm.h), same bits
        std::vector<float*> yrows((size_t)nb);
        for (int64_t b = 0; b < nb; ++b) yrows[(size_t)b] = y + b * rows;
        gemm(t, wb, rows, n, xb, ab, nb, yrows.data(), pool_or_global(pool));
        return;
    }
    // Each task owns a row range; inside it, a tile of rows is applied to the whole batch so the
    // tile's weights stay in cache while the activations stream past. Where the path has a
    // multi-activation kernel, one weight row is decoded once for up to 4 activations (results
    // are bit-identical to the single-activation kernel).
    DotNFn fn_n = dot_n_fn(active_kernels(), t);
    const int64_t tile = 8;
    pool_or_global(pool).parallel_for(
        rows,
        [&](int64_t r0, int64_t r1) {
            for (int64_t t0 = r0; t0 < r1; t0 += tile) {
                const int64_t t1 = t0 + tile < r1 ? t0 + tile : r1;
                if (fn_n) {
                    for (int64_t b = 0; b < nb; b += 4) {
                        const int na = nb - b < 4 ? (int)(nb - b) : 4;
                        for (int64_t r = t0; r < t1; ++r) {
                            float out[4];
                            fn_n(wb + r * rb, xb + b * ab, ab, na, n, out);
                            for (int k = 0; k < na; ++k) y[(b + k) * rows + r] = out[k];
                        }
                    }
                } else {
                    for (int64_t b = 0; b < nb; ++b) {
                        const uint8_t* xb_b = xb + b * ab;
                        float* yb = y + b * rows;
                        for (int64_t r = t0; r < t1; ++r) yb[r] = fn(wb + r * rb, xb_b, n);
                    }
                }
            }
        },
        1);
}

namespace {

// matvec_experts over n_mats weights of one shape and type sharing the ids and activations
// (gate and up: docs/kernels.md, "decode dispatches"): the (matrix, slot, row) list is split in
// one dispatch. A row's result is the row kernel's, wherever the split falls, so each output is
// what a separate matvec_experts call gives.
void experts_dispatch(const char* what, GgmlType t, const void* const* ws, float* const* ys, int n_mats,
                      int64_t n_expert, int64_t rows, int64_t n, const int32_t* ids, int64_t n_ids, const void* xq,
                      int64_t xq_stride, ThreadPool* pool) {
    const std::string name(what);
    check_dims(what, rows, n);
    if (n_expert <= 0 || n_ids < 0 || xq_stride < 0) {
        fail(ErrorKind::InvalidArgument, name + ": n_expert=" + std::to_string(n_expert) +
                                             ", n_ids=" + std::to_string(n_ids) + ", xq_stride=" +
                                             std::to_string(xq_stride) + " (need n_expert > 0, others >= 0)");
    }
    const int64_t rb = row_bytes(t, n);
    const int64_t ab = act_bytes(t, n);
    if (xq_stride != 0 && xq_stride < ab) {
        fail(ErrorKind::InvalidArgument, name + ": xq_stride " + std::to_string(xq_stride) +
                                             " is smaller than one activation (" + std::to_string(ab) + " bytes)");
    }
    DotFn fn = dot_fn(active_kernels(), t);
    if (n_ids == 0 || rows == 0) return;
    if (!ids) fail(ErrorKind::InvalidArgument, name + ": null ids");
    for (int m = 0; m < n_mats; ++m) check_ptrs(what, ws[m], xq, ys[m]);
    for (int64_t i = 0; i < n_ids; ++i) {
        if (ids[i] < 0 || ids[i] >= n_expert) {
            fail(ErrorKind::InvalidArgument, name + ": expert id " + std::to_string(ids[i]) + " at slot " +
                                                 std::to_string(i) + " is outside [0, " + std::to_string(n_expert) + ")");
        }
    }
    const uint8_t* xb = static_cast<const uint8_t*>(xq);
    const int64_t mat_bytes = rb * rows;
    const int64_t per_mat = n_ids * rows;
    DotRowsFn rows_fn = dot_rows_fn(active_kernels(), t);
    // Flatten (matrix, slot, row) so all threads share the work even with few selected experts.
    pool_or_global(pool).parallel_for(
        n_mats * per_mat,
        [&](int64_t k0, int64_t k1) {
            for (int64_t k = k0; k < k1;) {
                const int64_t m = k / per_mat, km = k % per_mat;
                const int64_t i = km / rows, r = km % rows, e = k1 - k < rows - r ? r + (k1 - k) : rows;
                const uint8_t* mat = static_cast<const uint8_t*>(ws[m]) + ids[i] * mat_bytes;
                // Prefetch within one expert's rows; the next expert's start is picked up by the hardware.
                dot_rows(fn, rows_fn, mat, mat + mat_bytes, rb, r, e, xb + i * xq_stride, n, ys[m] + km);
                k += e - r;
            }
        },
        min_rows_per_task(rb), ranges_per_thread(n_mats * n_ids * mat_bytes, pool_or_global(pool)));
}

}  // namespace

void matvec_experts(GgmlType t, const void* w, int64_t n_expert, int64_t rows, int64_t n, const int32_t* ids,
                    int64_t n_ids, const void* xq, int64_t xq_stride, float* y, ThreadPool* pool) {
    experts_dispatch("matvec_experts", t, &w, &y, 1, n_expert, rows, n, ids, n_ids, xq, xq_stride, pool);
}

void matvec_experts_pair(GgmlType t, const void* w_a, const void* w_b, int64_t n_expert, int64_t rows, int64_t n,
                         const int32_t* ids, int64_t n_ids, const void* xq, float* y_a, float* y_b, ThreadPool* pool) {
    const void* ws[2] = {w_a, w_b};
    float* ys[2] = {y_a, y_b};
    experts_dispatch("matvec_experts_pair", t, ws, ys, 2, n_expert, rows, n, ids, n_ids, xq, 0, pool);
}

void matmul_experts(GgmlType t, const void* w, int64_t n_expert, int64_t rows, int64_t n, const int32_t* ids,
                    int64_t n_tokens, int64_t n_used, const void* xq, int64_t tok_stride, int64_t slot_stride,
                    float* y, ThreadPool* pool) {
    check_dims("matmul_experts", rows, n);
    if (n_expert <= 0 || n_tokens < 0 || n_used < 0 || tok_stride < 0 || slot_stride < 0) {
        fail(ErrorKind::InvalidArgument, "matmul_experts: n_expert=" + std::to_string(n_expert) + ", n_tokens=" +
                                             std::to_string(n_tokens) + ", n_used=" + std::to_string(n_used) +
                                             ", strides " + std::to_string(tok_stride) + "/" +
                                             std::to_string(slot_stride) + " (need n_expert > 0, others >= 0)");
    }
    const int64_t rb = row_bytes(t, n);
    const int64_t ab = act_bytes(t, n);
    DotFn fn = dot_fn(active_kernels(), t);
    DotNFn fn_n = dot_n_fn(active_kernels(), t);
    const int64_t n_pairs = n_tokens * n_used;
    if (n_pairs == 0 || rows == 0) return;
    if (!ids) fail(ErrorKind::InvalidArgument, "matmul_experts: null ids");
    check_ptrs("matmul_experts", w, xq, y);
    for (int64_t p = 0; p < n_pairs; ++p) {
        if (ids[p] < 0 || ids[p] >= n_expert) {
            fail(ErrorKind::InvalidArgument, "matmul_experts: expert id " + std::to_string(ids[p]) + " at token " +
                                                 std::to_string(p / n_used) + " slot " + std::to_string(p % n_used) +
                                                 " is outside [0, " + std::to_string(n_expert) + ")");
        }
    }
    // Group the pairs by expert (stable), and gather their activations contiguously in that order
    // so the multi-activation kernels see evenly spaced activations.
    std::vector<int64_t> start((size_t)n_expert + 1, 0);
    for (int64_t p = 0; p < n_pairs; ++p) ++start[(size_t)ids[p] + 1];
    for (int64_t e = 0; e < n_expert; ++e) start[(size_t)e + 1] += start[(size_t)e];
    std::vector<int64_t> order((size_t)n_pairs);
    {
        std::vector<int64_t> fill(start.begin(), start.end() - 1);
        for (int64_t p = 0; p < n_pairs; ++p) order[(size_t)fill[(size_t)ids[p]]++] = p;
    }
    const uint8_t* xb = static_cast<const uint8_t*>(xq);
    // The calling thread's gather buffer, kept between calls: a prefill's is MiBs, which a fresh
    // vector would page-fault in and zero on every call (docs/gemm.md, "Prefill profile").
    // (The lambdas below run on pool threads: they use the pointer, never the thread_local.)
    thread_local std::vector<uint8_t> gather_buf;
    if (gather_buf.size() < (size_t)(n_pairs * ab)) gather_buf.resize((size_t)(n_pairs * ab));
    uint8_t* const acts = gather_buf.data();
    pool_or_global(pool).parallel_for(n_pairs, [&](int64_t k0, int64_t k1) {   // MiBs in a prefill
        for (int64_t k = k0; k < k1; ++k) {
            const int64_t p = order[(size_t)k];
            std::memcpy(acts + k * ab, xb + (p / n_used) * tok_stride + (p % n_used) * slot_stride, (size_t)ab);
        }
    }, 64);
    const uint8_t* wb = static_cast<const uint8_t*>(w);
    const int64_t mat_bytes = rb * rows;
    // Experts with enough tokens run the register-blocked GEMM (gemm.h, same bits as the row
    // kernels below); the others stay on the row kernels.
    const int64_t gemm_min = active_gemm(t, nullptr, n) ? gemm_min_tokens(t) : INT64_MAX;
    if (gemm_min != INT64_MAX) {
        std::vector<float*> yrows((size_t)n_pairs);
        for (int64_t k = 0; k < n_pairs; ++k) yrows[(size_t)k] = y + order[(size_t)k] * rows;
        std::vector<int64_t> mat_offsets((size_t)n_expert);
        for (int64_t e = 0; e < n_expert; ++e) mat_offsets[(size_t)e] = e * mat_bytes;
        gemm_grouped(t, wb, mat_offsets.data(), start.data(), n_expert, rows, n, acts, ab, yrows.data(),
                     pool_or_global(pool), gemm_min);
    }
    // Work items: (expert, range of rows), flattened so threads share experts with many pairs.
    const int64_t chunk = 64;
    const int64_t per_expert = (rows + chunk - 1) / chunk;
    std::vector<int64_t> items;
    for (int64_t e = 0; e < n_expert; ++e) {
        const int64_t count = start[(size_t)e + 1] - start[(size_t)e];
        if (count == 0 || count >= gemm_min) continue;
        for (int64_t c = 0; c < per_expert; ++c) items.push_back(e * per_expert + c);
    }
    pool_or_global(pool).parallel_for(
        (int64_t)items.size(),
        [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; ++i) {
                const int64_t e = items[(size_t)i] / per_expert, c = items[(size_t)i] % per_expert;
                const int64_t k0 = start[(size_t)e], k1 = start[(size_t)e + 1];
                const int64_t r0 = c * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
                const uint8_t* mat = wb + e * mat_bytes;
                for (int64_t r = r0; r < r1; ++r) {
                    const uint8_t* wr = mat + r * rb;
                    for (int64_t k = k0; k < k1;) {
                        if (fn_n) {
                            const int na = k1 - k < 4 ? (int)(k1 - k) : 4;
                            float out[4];
                            fn_n(wr, acts + k * ab, ab, na, n, out);
                            for (int j = 0; j < na; ++j) y[order[(size_t)(k + j)] * rows + r] = out[j];
                            k += na;
                        } else {
                            y[order[(size_t)k] * rows + r] = fn(wr, acts + k * ab, n);
                            ++k;
                        }
                    }
                }
            }
        },
        1);
}

uint64_t stream_read(const void* p, int64_t bytes, ThreadPool* pool) {
    if (bytes < 0) fail(ErrorKind::InvalidArgument, "stream_read: negative size " + std::to_string(bytes));
    if (bytes > 0 && !p) fail(ErrorKind::InvalidArgument, "stream_read: null buffer");
    const uint8_t* base = static_cast<const uint8_t*>(p);
    const int64_t chunk = 256 * 1024;  // work item; whole 64-byte lines except at the end
    const int64_t n_chunks = (bytes + chunk - 1) / chunk;
    std::vector<uint64_t> sums((size_t)n_chunks, 0);
    pool_or_global(pool).parallel_for(
        n_chunks,
        [&](int64_t c0, int64_t c1) {
            for (int64_t c = c0; c < c1; ++c) {
                const uint8_t* q = base + c * chunk;
                const int64_t len = c + 1 < n_chunks ? chunk : bytes - c * chunk;
                // Eight independent accumulators: the adds keep up with the loads.
                uint64_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                int64_t i = 0;
                for (; i + 64 <= len; i += 64) {
                    for (int k = 0; k < 8; ++k) {
                        uint64_t v;
                        std::memcpy(&v, q + i + 8 * k, 8);
                        acc[k] += v;
                    }
                }
                for (; i < len; ++i) acc[0] += q[i];
                sums[(size_t)c] = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
            }
        },
        1);
    uint64_t total = 0;
    for (uint64_t v : sums) total += v;
    return total;
}

}  // namespace ds4
