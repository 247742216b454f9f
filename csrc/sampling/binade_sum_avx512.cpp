// binade_sum.h for AVX-512: the units of 16 terms per vector, a mask test per block and one
// reduction per chunk of 8 blocks (why the units are exact: binade_sum.cpp).
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "common/thread_pool.h"

#include "sampling/binade_sum.h"
#include "sampling/binade_sum_impl.h"
#include "sampling/exp_weights.h"

namespace ds4 {

namespace {

constexpr int kLanes = 16;
constexpr int kChunkBlocks = 8;

alignas(64) constexpr float kExp2Table[32] = {
    0x1.0p+0f, 0x1.059b0ep+0f, 0x1.0b5586p+0f, 0x1.11301ep+0f, 0x1.172b84p+0f, 0x1.1d4874p+0f,
    0x1.2387a6p+0f, 0x1.29e9ep+0f, 0x1.306fep+0f, 0x1.371a74p+0f, 0x1.3dea64p+0f, 0x1.44e086p+0f,
    0x1.4bfdaep+0f, 0x1.5342b6p+0f, 0x1.5ab07ep+0f, 0x1.6247ecp+0f, 0x1.6a09e6p+0f, 0x1.71f75ep+0f,
    0x1.7a1148p+0f, 0x1.82589ap+0f, 0x1.8ace54p+0f, 0x1.93737cp+0f, 0x1.9c4918p+0f, 0x1.a5503cp+0f,
    0x1.ae89fap+0f, 0x1.b7f77p+0f, 0x1.c199bep+0f, 0x1.cb720ep+0f, 0x1.d5818ep+0f, 0x1.dfc974p+0f,
    0x1.ea4afap+0f, 0x1.f50766p+0f,
};   // 2^(j/32) rounded to float (relative error <= 2^-24)

// exp(x) for x <= 0: 2^q * 2^(j/32) * p(r) with k = 32q + j = round(x * 32/ln2), r = x - k ln2/32
// (ln2/32 in two parts: k * hi is exact for |k| < 2^12 and x - k * hi is exact by Sterbenz),
// |r| <= ln2/64, p(r) = 1 + r + r^2/2 (truncation < 2^-22). With the table's 2^-24 and the
// roundings of the fused steps, a few 2^-23 in all: well inside kApproxWeightRel. Arguments
// below -87 (and -inf) are taken as -87: an error below 2^-125 absolute. NaN stays NaN.
inline __m512 approx_exp(__m512 x) {
    const __m512 lo_tab = _mm512_load_ps(kExp2Table), hi_tab = _mm512_load_ps(kExp2Table + 16);
    const __m512 xc = _mm512_max_ps(_mm512_set1_ps(-87.0f), x);   // max returns x when x is NaN
    const __m512 kf = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(46.16624130844683f)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(0x1.0bfbe80000000p-20f),   // ln2/32 - hi
                                      _mm512_fnmadd_ps(kf, _mm512_set1_ps(0x1.62e0000000000p-6f), xc));   // hi: 12 bits
    const __m512 p = _mm512_fmadd_ps(_mm512_fmadd_ps(r, _mm512_set1_ps(0.5f), _mm512_set1_ps(1.0f)), r,
                                     _mm512_set1_ps(1.0f));
    const __m512i k = _mm512_cvtps_epi32(kf);
    const __m512 t = _mm512_permutex2var_ps(lo_tab, k, hi_tab);   // entry k & 31
    const __m512i q = _mm512_slli_epi32(_mm512_srai_epi32(k, 5), 23);   // q = floor(k / 32) >= -126
    return _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(t), q)));
}

// Adds round(y) to d and returns the lanes whose rounding is certain. y is exact (rel 0) or
// within y * rel + 2^-40 of the exact value; uncertain: negative, NaN, above ymax, or within that
// error of a half-integer (a possible tie). Certain lanes have |y - round(y)| < 1/2 - error.
inline __mmask16 block_units(__m512 y, float rel, float ymax, __m512i& d) {
    uint32_t ymax_bits;
    std::memcpy(&ymax_bits, &ymax, sizeof ymax_bits);
    // as unsigned integers, the bits of 0 <= y <= ymax are <= ymax's; negatives and NaN are above
    const __mmask16 in_range = _mm512_cmple_epu32_mask(_mm512_castps_si512(y), _mm512_set1_epi32((int)ymax_bits));
    const __m512 q = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 off = _mm512_abs_ps(_mm512_sub_ps(y, q));
    const __m512 limit = rel > 0.0f ? _mm512_fnmadd_ps(y, _mm512_set1_ps(rel), _mm512_set1_ps(0.5f - 0x1p-40f))
                                    : _mm512_set1_ps(0.5f);
    d = _mm512_add_epi32(d, _mm512_cvtps_epi32(q));
    return in_range & _mm512_cmp_ps_mask(off, limit, _CMP_LT_OQ);
}

// The units of `blocks` blocks of 16 at scale inv_u, or false when a rounding is uncertain.
// Exact: src are the weights. Approximate: src are arguments; their weights are approximated
// (taken from wa when given; stored into wa_out when given), and a block with an uncertain lane
// rounds its exact weights instead.
bool units_of(const float* src, bool approx, const float* wa, float* wa_out, int blocks, float inv_u, int32_t& units) {
    const __m512 scale = _mm512_set1_ps(inv_u);
    __m512i d_all = _mm512_setzero_si512();
    alignas(64) float wb[kLanes];
    for (int k = 0; k < blocks * kLanes; k += kLanes) {
        if (!approx) {
            if (block_units(_mm512_mul_ps(_mm512_loadu_ps(src + k), scale), 0.0f, 16777216.0f, d_all) != 0xFFFF) return false;
            continue;
        }
        const __m512 w = wa ? _mm512_loadu_ps(wa + k) : approx_exp(_mm512_loadu_ps(src + k));
        if (wa_out) _mm512_storeu_ps(wa_out + k, w);
        __m512i d = _mm512_setzero_si512();
        if (block_units(_mm512_mul_ps(w, scale), kApproxWeightRel, 16384.0f, d) != 0xFFFF) {
            exp_weights(src + k, wb, kLanes);
            const __m512 we = _mm512_load_ps(wb);
            if (wa_out) _mm512_storeu_ps(wa_out + k, we);   // exact weights are good guides too
            d = _mm512_setzero_si512();
            if (block_units(_mm512_mul_ps(we, scale), 0.0f, 16777216.0f, d) != 0xFFFF) return false;
        }
        d_all = _mm512_add_epi32(d_all, d);
    }
    units = _mm512_reduce_add_epi32(d_all);
    return true;
}

// Whether all weights of `blocks` blocks of arguments are exactly 0 (arguments below -105).
bool zero_blocks(const float* x, int blocks) {
    __mmask16 all = 0xFFFF;
    for (int k = 0; k < blocks * kLanes; k += kLanes)
        all &= _mm512_cmp_ps_mask(_mm512_loadu_ps(x + k), _mm512_set1_ps(-105.0f), _CMP_LT_OQ);
    return all == 0xFFFF;
}

// One span (a chunk, or one block of a chunk that failed) of the sum: true when the model took it.
bool add_span(const float* src, bool approx, float* wa, int blocks, float& s) {
    if (approx && zero_blocks(src, blocks)) {   // s + 0 = s: the plain loop changes nothing either
        if (wa) std::memset(wa, 0, sizeof(float) * blocks * kLanes);
        return true;
    }
    if (!(s >= binade::kModelMin && s <= binade::kModelMax)) return false;
    const binade::Unit b = binade::unit_of(s);
    int32_t d;
    if (!units_of(src, approx, nullptr, wa, blocks, b.inv_u, d)) return false;
    const int32_t S = (int32_t)(s * b.inv_u) + d;
    if (S >= (1 << 24)) return false;
    s = (float)S * b.u;
    return true;
}

// The plain loop over one span (exact weights).
void add_plain(const float* src, bool approx, float* wa, int64_t m, float& s) {
    alignas(64) float wb[kChunkBlocks * kLanes];
    const float* we = src;
    if (approx) {
        exp_weights(src, wb, m);
        if (wa) std::memcpy(wa, wb, sizeof(float) * m);
        we = wb;
    }
    for (int64_t j = 0; j < m; ++j) s += we[j];
}

float total(const float* src, bool approx, int64_t n, float* wa) {
    float s = 0.0f;
    const int64_t chunk = kChunkBlocks * kLanes;
    int64_t i = 0;
    for (; i + chunk <= n; i += chunk) {
        if (add_span(src + i, approx, wa ? wa + i : nullptr, kChunkBlocks, s)) continue;
        for (int64_t k = i; k < i + chunk; k += kLanes)   // a binade change or a tie: block by block
            if (!add_span(src + k, approx, wa ? wa + k : nullptr, 1, s)) add_plain(src + k, approx, wa ? wa + k : nullptr, kLanes, s);
    }
    if (i < n) add_plain(src + i, approx, wa ? wa + i : nullptr, n - i, s);
    return s;
}

// One span of the walk: true when the model took it (r stays above its binade's floor). src:
// arguments (approx) or the weights themselves.
bool walk_span(const float* src, bool approx, const float* wa, int blocks, float& r) {
    if (approx && r > 0.0f && zero_blocks(src, blocks)) return true;   // r - 0 = r stays > 0
    if (!(r >= binade::kModelMin && r <= binade::kModelMax)) return false;
    const binade::Unit b = binade::unit_of(r);
    int32_t d;
    if (!units_of(src, approx, wa, nullptr, blocks, b.inv_u, d)) return false;
    const int32_t R = (int32_t)(r * b.inv_u) - d;
    if (R <= (1 << 23)) return false;
    r = (float)R * b.u;
    return true;
}

}  // namespace

float binade_seq_sum_avx512(const float* w, int64_t n) { return total(w, false, n, nullptr); }

// The whole-vocabulary total on the thread pool. The serial loop above needs, per chunk, only the
// unit of the running sum at its start, and that is almost always the unit of the approximate
// prefix sum there. So: (1) in parallel, every chunk's approximate weights and their sum;
// (2) the prefix sums predict each chunk's unit; (3) in parallel, every chunk's units at the
// predicted unit (units_of, the same test as the serial loop); (4) serially, each chunk whose
// actual running sum has the predicted unit adds its units exactly as the serial loop would, and
// any other chunk runs the serial loop's own steps. The result is the serial loop's, bit for bit.
float total_parallel(const float* x, int64_t n, float* wa, ThreadPool& pool) {
    const int64_t chunk = kChunkBlocks * kLanes;
    const int64_t n_chunks = n / chunk;
    struct ChunkInfo {
        float approx_sum;
        bool zero, ok;
        int32_t units;
        float u;
    };
    static thread_local std::vector<ChunkInfo> per_thread;   // the caller's; workers see it through `info`
    std::vector<ChunkInfo>& info = per_thread;
    info.resize((size_t)n_chunks);
    pool.parallel_for(n_chunks, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
            const float* src = x + c * chunk;
            float* out = wa + c * chunk;
            ChunkInfo& ci = info[(size_t)c];
            ci.zero = zero_blocks(src, kChunkBlocks);
            if (ci.zero) {
                std::memset(out, 0, sizeof(float) * chunk);
                ci.approx_sum = 0.0f;
                continue;
            }
            __m512 acc = _mm512_setzero_ps();
            for (int k = 0; k < chunk; k += kLanes) {
                const __m512 w = approx_exp(_mm512_loadu_ps(src + k));
                _mm512_storeu_ps(out + k, w);
                acc = _mm512_add_ps(acc, w);
            }
            ci.approx_sum = _mm512_reduce_add_ps(acc);
        }
    }, 64);
    double prefix = 0.0;
    for (int64_t c = 0; c < n_chunks; ++c) {
        ChunkInfo& ci = info[(size_t)c];
        const float p = (float)prefix;
        ci.u = (p >= binade::kModelMin && p <= binade::kModelMax) ? binade::unit_of(p).u : 0.0f;
        prefix += ci.approx_sum;
    }
    pool.parallel_for(n_chunks, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
            ChunkInfo& ci = info[(size_t)c];
            ci.ok = false;
            if (ci.zero || ci.u == 0.0f) continue;
            const binade::Unit b = binade::unit_of(ci.u * 0x1p23f);
            ci.ok = units_of(x + c * chunk, true, wa + c * chunk, nullptr, kChunkBlocks, b.inv_u, ci.units);
        }
    }, 64);
    float s = 0.0f;
    for (int64_t c = 0; c < n_chunks; ++c) {
        const ChunkInfo& ci = info[(size_t)c];
        const int64_t i = c * chunk;
        if (ci.zero) continue;   // s + 0 = s, as add_span
        if (ci.ok && s >= binade::kModelMin && s <= binade::kModelMax) {
            const binade::Unit b = binade::unit_of(s);
            if (b.u == ci.u) {
                const int32_t S = (int32_t)(s * b.inv_u) + ci.units;
                if (S < (1 << 24)) {
                    s = (float)S * b.u;
                    continue;
                }
            }
        }
        for (int64_t k = i; k < i + chunk; k += kLanes)   // the serial loop's steps
            if (!add_span(x + k, true, wa + k, 1, s)) add_plain(x + k, true, wa + k, kLanes, s);
    }
    const int64_t i = n_chunks * chunk;
    if (i < n) add_plain(x + i, true, wa + i, n - i, s);
    return s;
}

float binade_weight_total_avx512(const float* x, int64_t n, float* wa) {
    if (wa && n >= (1 << 15) && sampling_threads() > 1 && ThreadPool::global().size() > 1)
        return total_parallel(x, n, wa, ThreadPool::global());
    return total(x, true, n, wa);
}

int64_t binade_weight_walk_avx512(const float* x, const float* wa, int64_t n, float r) {
    const int64_t chunk = kChunkBlocks * kLanes;
    int64_t i = 0;
    for (; i + chunk <= n; i += chunk) {
        if (walk_span(x + i, true, wa ? wa + i : nullptr, kChunkBlocks, r)) continue;
        for (int64_t k = i; k < i + chunk; k += kLanes) {
            if (walk_span(x + k, true, wa ? wa + k : nullptr, 1, r)) continue;
            const int64_t hit = binade::walk_plain(x + k, kLanes, r);
            if (hit >= 0) return k + hit;
        }
    }
    const int64_t hit = binade::walk_plain(x + i, n - i, r);
    return hit >= 0 ? i + hit : -1;
}

int64_t binade_seq_walk_avx512(const float* w, int64_t n, float r) {
    const int64_t chunk = kChunkBlocks * kLanes;
    int64_t i = 0;
    for (; i + chunk <= n; i += chunk) {
        if (walk_span(w + i, false, nullptr, kChunkBlocks, r)) continue;
        for (int64_t k = i; k < i + chunk; k += kLanes) {
            if (walk_span(w + k, false, nullptr, 1, r)) continue;
            const int64_t hit = binade::seq_walk_plain(w + k, kLanes, r);
            if (hit >= 0) return k + hit;
        }
    }
    const int64_t hit = binade::seq_walk_plain(w + i, n - i, r);
    return hit >= 0 ? i + hit : -1;
}

// The sum is non-decreasing (terms >= 0, rounding to nearest is monotone) and so is fl(s / total):
// a block whose sum at its end stays below top_p holds no stop. A block with a negative or
// non-finite term fails the model and runs the plain loop.
int64_t binade_seq_until_avx512(const float* w, int64_t n, float total, float top_p, float& s) {
    const int64_t chunk = kChunkBlocks * kLanes;
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        float s2 = s;
        if (i + chunk <= n && add_span(w + i, false, nullptr, kChunkBlocks, s2) && s2 / total < top_p) {
            s = s2;
            i += chunk - kLanes;
            continue;
        }
        s2 = s;
        if (add_span(w + i, false, nullptr, 1, s2) && s2 / total < top_p) {
            s = s2;
            continue;
        }
        const int64_t hit = binade::seq_until_plain(w + i, kLanes, total, top_p, s);
        if (hit < kLanes) return i + hit;
    }
    const int64_t hit = binade::seq_until_plain(w + i, n - i, total, top_p, s);
    return i + hit;
}

void approx_exp_weights_avx512(const float* x, float* w, int64_t n) {
    for (int64_t i = 0; i < n; i += kLanes) {
        const __mmask16 m = n - i >= kLanes ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(w + i, m, approx_exp(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

}  // namespace ds4
