#include "layers/attention.h"

#include <cmath>
#include <algorithm>
#include <functional>
#include <vector>

#include "common/thread_pool.h"
#include "layers/attention_simd.h"
#include "layers/numerics.h"
#include "quant/kernels.h"
#include "quant/simd.h"

namespace ds4 {

namespace {

// One range of heads. Dot is a functor (not a pointer) so the row dots inline and vectorise.
template <class Dot>
void attend_heads(const AttentionInputs& in, float* out, float* scores, int64_t h0, int64_t h1, Dot dot) {
    const int64_t D = in.head_dim;
    const int64_t n_raw = in.n_raw;
    const int64_t stride = in.raw_cap + in.n_comp;
    auto raw_row = [&](int64_t i) {
        if (in.raw_rows) return in.raw_rows[i];
        int64_t slot = in.raw_first + i;
        if (slot >= in.raw_cap) slot -= in.raw_cap;
        return in.raw + slot * D;
    };
    const float kq_scale = 1.0f / std::sqrt((float)D);
    for (int64_t h = h0; h < h1; ++h) {
        const float* qh = in.q + h * D;
        float* sc = scores + h * stride;
        float mx = in.sinks[h];
        for (int64_t r = 0; r < n_raw; ++r) {
            sc[r] = dot(qh, raw_row(r), D) * kq_scale;
            if (sc[r] > mx) mx = sc[r];
        }
        for (int64_t r = 0; r < in.n_comp; ++r) {
            float& v = sc[n_raw + r];
            if (in.allowed && !in.allowed[r]) {
                v = kNeg;
                continue;
            }
            v = dot(qh, in.comp + r * D, D) * kq_scale;
            if (v > mx) mx = v;
        }
        float* oh = out + h * D;
        for (int64_t i = 0; i < D; ++i) oh[i] = 0.0f;
        float denom = std::exp(in.sinks[h] - mx);
        for (int64_t r = 0; r < n_raw; ++r) {
            const float w = std::exp(sc[r] - mx);
            const float* row = raw_row(r);
            denom += w;
            for (int64_t i = 0; i < D; ++i) oh[i] += w * row[i];
        }
        for (int64_t r = 0; r < in.n_comp; ++r) {
            const float v = sc[n_raw + r];
            if (v <= kNegSkip) continue;
            const float w = std::exp(v - mx);
            const float* row = in.comp + r * D;
            denom += w;
            for (int64_t i = 0; i < D; ++i) oh[i] += w * row[i];
        }
        const float inv = 1.0f / denom;
        for (int64_t i = 0; i < D; ++i) oh[i] *= inv;
    }
}

struct SeqDot {
    float operator()(const float* a, const float* b, int64_t n) const { return dot_f32(a, b, n); }
};
struct LanesDot {
    float operator()(const float* a, const float* b, int64_t n) const { return dot_f32_lanes(a, b, n); }
};

// The x86 several-query kernel and how many queries it takes at once, or {null, 1}.
struct QueriesKernel {
    AttendQueriesFn fn;
    int64_t max_queries;
};
QueriesKernel x86_queries_kernel() {
#if defined(DS4_ARCH_X86)
    switch (simd_path()) {
        case SimdPath::AVX2: return {attend_queries_avx2, kAttendQueriesAvx2};
        case SimdPath::AVX512:
        case SimdPath::AVX512VNNI: return {attend_queries_avx512, kAttendQueriesAvx512};
        default: break;
    }
#endif
    return {nullptr, 1};
}

// The x86 kernel for the active SIMD path, or null (scalar, NEON: the portable loops above).
AttendHeadsFn x86_kernel() {
#if defined(DS4_ARCH_X86)
    switch (simd_path()) {
        case SimdPath::AVX2: return attend_heads_avx2;
        case SimdPath::AVX512:
        case SimdPath::AVX512VNNI: return attend_heads_avx512;
        default: break;
    }
#endif
    return nullptr;
}

}  // namespace

void attend(const AttentionInputs& in, float* out, float* scores, ThreadPool* pool) {
    const int64_t n_head = in.n_head;
    if (AttendHeadsFn kernel = x86_kernel()) {
        std::vector<const float*> rows;
        rows.reserve((size_t)(in.n_raw + in.n_comp));
        for (int64_t r = 0; r < in.n_raw; ++r) {
            if (in.raw_rows) {
                rows.push_back(in.raw_rows[r]);
                continue;
            }
            int64_t slot = in.raw_first + r;
            if (slot >= in.raw_cap) slot -= in.raw_cap;
            rows.push_back(in.raw + slot * in.head_dim);
        }
        for (int64_t r = 0; r < in.n_comp; ++r) {
            if (!in.allowed || in.allowed[r]) rows.push_back(in.comp + r * in.head_dim);
        }
        const AttentionRows list{rows.data(), (int64_t)rows.size()};
        const int64_t stride = in.raw_cap + in.n_comp;
        // Blocks of 4 heads share each row load (attention_simd.inc); a task is one or more blocks.
        const int64_t n_blocks = (n_head + 3) / 4;
        auto blocks = [&](int64_t b0, int64_t b1) {
            kernel(in, list, out, scores, stride, b0 * 4, std::min(n_head, b1 * 4));
        };
        if (pool) pool->parallel_for(n_blocks, std::ref(blocks), 1); else blocks(0, n_blocks);
        return;
    }
    const bool lanes = simd_path() != SimdPath::Scalar;
    auto heads = [&](int64_t h0, int64_t h1) {
        if (lanes) attend_heads(in, out, scores, h0, h1, LanesDot{});
        else attend_heads(in, out, scores, h0, h1, SeqDot{});
    };
    if (pool) pool->parallel_for(n_head, std::ref(heads), 1); else heads(0, n_head);
}

namespace {

// The raw window of query j of a block, oldest first: the newest ring rows from before the block,
// then the block's fresh rows up to j (a block longer than the ring sees fresh rows only).
void query_window(const QueryBlockInputs& in, int64_t j, std::vector<const float*>& rows) {
    const int64_t D = in.head_dim;
    const int64_t n = std::min(in.raw_cap, in.n_raw + j + 1);
    const int64_t n_fresh = std::min(n, j + 1), n_ring = n - n_fresh;
    rows.clear();
    for (int64_t i = in.n_raw - n_ring; i < in.n_raw; ++i) {
        int64_t slot = in.raw_first + i;
        if (slot >= in.raw_cap) slot -= in.raw_cap;
        rows.push_back(in.raw + slot * D);
    }
    for (int64_t f = j + 1 - n_fresh; f <= j; ++f) rows.push_back(in.fresh + f * D);
}

// The rows of queries [j0, j0 + nq) merged in softmax order with who-attends bits: raw positions
// (relative to the block's first, ascending) over the union of their windows, then compressed rows.
void merge_rows(const QueryBlockInputs& in, int64_t j0, int64_t nq, std::vector<const float*>& rows,
                std::vector<uint8_t>& who) {
    const int64_t D = in.head_dim;
    auto masked = [&](int64_t j) { return in.mask && j >= in.mask_first; };
    rows.clear();
    who.clear();
    auto window_start = [&](int64_t j) { return j + 1 - std::min(in.raw_cap, in.n_raw + j + 1); };
    for (int64_t p = window_start(j0); p < j0 + nq; ++p) {
        unsigned bits = 0;
        for (int64_t k = 0; k < nq; ++k) {
            if (p >= window_start(j0 + k) && p <= j0 + k) bits |= 1u << k;
        }
        if (!bits) continue;
        if (p >= 0) {
            rows.push_back(in.fresh + p * D);
        } else {
            int64_t slot = in.raw_first + in.n_raw + p;   // ring row n_raw + p (p < 0)
            if (slot >= in.raw_cap) slot -= in.raw_cap;
            rows.push_back(in.raw + slot * D);
        }
        who.push_back((uint8_t)bits);
    }
    for (int64_t c = 0; c < in.n_comp[j0 + nq - 1]; ++c) {
        unsigned bits = 0;
        for (int64_t k = 0; k < nq; ++k) {
            const int64_t j = j0 + k;
            if (c < in.n_comp[j] && (!masked(j) || in.mask[j * in.mask_stride + c])) bits |= 1u << k;
        }
        if (!bits) continue;
        rows.push_back(in.comp + c * D);
        who.push_back((uint8_t)bits);
    }
}

}  // namespace

void attend_queries(const QueryBlockInputs& in, float* out, std::vector<float>& scratch, ThreadPool* pool) {
    const int64_t nq = in.nq, H = in.n_head, D = in.head_dim;
    const QueriesKernel kernel = x86_queries_kernel();
    if (!kernel.fn) {   // scalar / NEON: attend() per query on its own window (the same loops)
        std::vector<const float*> window;
        for (int64_t j = 0; j < nq; ++j) {
            query_window(in, j, window);
            const uint8_t* allowed = in.mask && j >= in.mask_first ? in.mask + j * in.mask_stride : nullptr;
            AttentionInputs one{in.q + j * H * D, in.raw, in.raw_cap, (int64_t)window.size(), 0, in.comp,
                                in.n_comp[j], allowed, in.sinks, H, D, window.data()};
            const size_t need = (size_t)(H * (in.raw_cap + in.n_comp[j]));
            if (scratch.size() < need) scratch.resize(need);
            attend(one, out + j * H * D, scratch.data(), pool);
        }
        return;
    }
    // Groups of up to max_queries consecutive queries share one merged row list; a task is one
    // group x one block of 4 heads, with its own scratch (packed queries and weights).
    const int64_t G = kernel.max_queries;
    const int64_t n_groups = (nq + G - 1) / G, n_hblocks = (H + 3) / 4;
    std::vector<std::vector<const float*>> rows((size_t)n_groups);
    std::vector<std::vector<uint8_t>> who((size_t)n_groups);
    int64_t stride = 1;   // the longest merged list
    for (int64_t g = 0; g < n_groups; ++g) {
        merge_rows(in, g * G, std::min(G, nq - g * G), rows[(size_t)g], who[(size_t)g]);
        stride = std::max(stride, (int64_t)rows[(size_t)g].size());
    }
    const int64_t per_task = G * 4 * (D + stride);
    const size_t need = (size_t)(n_groups * n_hblocks * per_task);
    if (scratch.size() < need) scratch.resize(need);
    static_assert(kAttendQueriesAvx2 <= 4 && kAttendQueriesAvx512 <= 4, "q/o below and the who bits hold 4 queries");
    auto tasks = [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
            const int64_t g = t / n_hblocks, hb = t % n_hblocks;
            const int64_t j0 = g * G, n = std::min(G, nq - j0);
            const float* q[4];
            float* o[4];
            for (int64_t k = 0; k < n; ++k) {
                q[k] = in.q + (j0 + k) * H * D;
                o[k] = out + (j0 + k) * H * D;
            }
            const std::vector<const float*>& rg = rows[(size_t)g];
            const QueryBlockRows list{rg.data(), who[(size_t)g].data(), (int64_t)rg.size()};
            kernel.fn(q, o, n, in.sinks, D, list, scratch.data() + t * per_task, hb * 4, std::min(H, hb * 4 + 4));
        }
    };
    const int64_t n_tasks = n_groups * n_hblocks;
    // A prefill block has 16 tasks of unequal length (later queries see more rows): one task per
    // range, so the thread that finishes first takes the next instead of waiting on a pair.
    if (pool) pool->parallel_for(n_tasks, std::ref(tasks), 1, 8); else tasks(0, n_tasks);
}

}  // namespace ds4
