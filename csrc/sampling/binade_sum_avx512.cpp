// binade_sum.h for AVX-512: the units of 16 terms per vector, one certainty test and one reduction
// per chunk of 8 blocks, terms read from weights, arguments or the logits themselves (why the
// units are exact: binade_sum.cpp; the measurements: docs/sampling.md).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/thread_pool.h"

#include "sampling/binade_sum.h"
#include "sampling/binade_sum_impl.h"
#include "sampling/exp_weights.h"
#include "sampling/sampling_pool.h"

namespace ds4 {

namespace {

constexpr int kLanes = 16;
constexpr int kChunkBlocks = 8;

// The largest units one term may add in the model: a chunk's 128 terms then add at most 2^29
// (exact) or 2^25 (approximate) units, so the int32 sums cannot overflow (2^24 units per term
// could: 128 of them make 2^31). Approximate terms above 2^18 units are rarely certain anyway
// (the error is then over a quarter of a unit).
constexpr float kExactUnitsMax = 0x1p22f;
constexpr float kApproxUnitsMax = 0x1p18f;

alignas(64) constexpr float kExp2Table[32] = {
    0x1.0p+0f, 0x1.059b0ep+0f, 0x1.0b5586p+0f, 0x1.11301ep+0f, 0x1.172b84p+0f, 0x1.1d4874p+0f,
    0x1.2387a6p+0f, 0x1.29e9ep+0f, 0x1.306fep+0f, 0x1.371a74p+0f, 0x1.3dea64p+0f, 0x1.44e086p+0f,
    0x1.4bfdaep+0f, 0x1.5342b6p+0f, 0x1.5ab07ep+0f, 0x1.6247ecp+0f, 0x1.6a09e6p+0f, 0x1.71f75ep+0f,
    0x1.7a1148p+0f, 0x1.82589ap+0f, 0x1.8ace54p+0f, 0x1.93737cp+0f, 0x1.9c4918p+0f, 0x1.a5503cp+0f,
    0x1.ae89fap+0f, 0x1.b7f77p+0f, 0x1.c199bep+0f, 0x1.cb720ep+0f, 0x1.d5818ep+0f, 0x1.dfc974p+0f,
    0x1.ea4afap+0f, 0x1.f50766p+0f,
};   // 2^(j/32) rounded to float (relative error <= 2^-24)

// exp(x) * 2^E for x <= 0: 2^(q+E) * 2^(j/32) * p(r) with k = 32q + j = round(x * 32/ln2) (the
// fused multiply-add with 1.5 * 2^23 rounds x * 32/ln2 once, to an integer in its low bits),
// r = x - k ln2/32 (ln2/32 in two parts: k * hi is exact for |k| < 2^12 and x - k * hi is exact by
// Sterbenz), |r| <= ln2/64 (1 + 2^-20), p(r) = 1 + r + r^2/2 (truncation < 2^-22). With the table's
// 2^-24 and the roundings of the fused steps, a few 2^-23 in all: inside kApproxWeightRel (checked
// over every float argument in [-87, 0]). Arguments below -87 (and -inf) are taken as -87: an
// error below 2^-125 * 2^E absolute. The table `tab` holds the bits of 2^(j/32) less j << 18, plus
// E << 23, so that adding k << 18 (k's low bits shifted: 32q + j becomes (q << 23) + (j << 18))
// scales by 2^(q+E) with one integer add; E >= 0 keeps every result a normal float (q >= -126).
// 2^e for |e| <= 126, and the exponent of a power of two (no libm calls: these run per span).
inline float pow2(int e) {
    const uint32_t b = (uint32_t)(e + 127) << 23;
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
}

inline int exponent_of(float p) {
    uint32_t b;
    std::memcpy(&b, &p, sizeof b);
    return (int)(b >> 23) - 127;
}

constexpr int32_t exp_entry(int j) { return (int32_t)(__builtin_bit_cast(uint32_t, kExp2Table[j]) - ((uint32_t)j << 18)); }

alignas(64) constexpr int32_t kExpBits[32] = {
    exp_entry(0),  exp_entry(1),  exp_entry(2),  exp_entry(3),  exp_entry(4),  exp_entry(5),  exp_entry(6),
    exp_entry(7),  exp_entry(8),  exp_entry(9),  exp_entry(10), exp_entry(11), exp_entry(12), exp_entry(13),
    exp_entry(14), exp_entry(15), exp_entry(16), exp_entry(17), exp_entry(18), exp_entry(19), exp_entry(20),
    exp_entry(21), exp_entry(22), exp_entry(23), exp_entry(24), exp_entry(25), exp_entry(26), exp_entry(27),
    exp_entry(28), exp_entry(29), exp_entry(30), exp_entry(31),
};   // the bits of 2^(j/32) less j << 18 (E = 0)

struct ExpTable {
    __m512 lo, hi;
    ExpTable() = default;
    explicit ExpTable(int e) {
        const __m512i add = _mm512_set1_epi32((int32_t)((uint32_t)e << 23));
        lo = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_load_si512(kExpBits), add));
        hi = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_load_si512(kExpBits + 16), add));
    }
};

// The table of the last unit a source's spans used. A sum or walk keeps its unit for many spans,
// so the next span's exponentials need not wait for the running value that sets the unit (the
// comparison is a predicted branch, not a data dependency). One per source object: a source is
// used by one thread at a time (total_parallel's workers use units_of, which has no table).
struct TableCache {
    mutable int e = -1000;
    mutable ExpTable tab{0};
    const ExpTable& get(int E) const {
        if (__builtin_expect(E != e, 0)) {
            tab = ExpTable(E);
            e = E;
        }
        return tab;
    }
};

inline __m512 approx_exp_scaled(__m512 x, const ExpTable& tab) {
    const __m512 xc = _mm512_max_ps(_mm512_set1_ps(-87.0f), x);   // max returns x when x is NaN
    const __m512 shifter = _mm512_set1_ps(0x1.8p23f);
    const __m512 kshift = _mm512_fmadd_ps(xc, _mm512_set1_ps(46.16624130844683f), shifter);
    const __m512 kf = _mm512_sub_ps(kshift, shifter);
    const __m512 r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(0x1.0bfbe80000000p-20f),   // ln2/32 - hi
                                      _mm512_fnmadd_ps(kf, _mm512_set1_ps(0x1.62e0000000000p-6f), xc));   // hi: 12 bits
    const __m512 p = _mm512_fmadd_ps(_mm512_fmadd_ps(r, _mm512_set1_ps(0.5f), _mm512_set1_ps(1.0f)), r,
                                     _mm512_set1_ps(1.0f));
    const __m512i kb = _mm512_castps_si512(kshift);   // 0x4B400000 + k: low 5 bits j, and << 18 drops the rest
    const __m512 t = _mm512_permutex2var_ps(tab.lo, kb, tab.hi);   // entry k & 31
    return _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(t), _mm512_slli_epi32(kb, 18))));
}

inline __m512 approx_exp(__m512 x) {
    static const ExpTable unscaled(0);
    return approx_exp_scaled(x, unscaled);
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

// Where the terms come from. Weights: the terms themselves (exact). Args: the weights
// exp_weights(x) of arguments x. Logits: the weights of logits a, whose arguments fl(fl(a - m) / t)
// (-inf where a is not finite: shifted_args) are computed as they are read, so the whole-vocabulary
// passes read the logits once and write no argument array (docs/sampling.md).
// Approximate sources also give load_approx (the arguments the approximate weights are taken of)
// and rel (the relative bound those approximations keep against the exact weights).
struct Weights {
    static constexpr bool kApprox = false;
    const float* w;
    __m512 load(int64_t i) const { return _mm512_loadu_ps(w + i); }
    __m512 load_approx(int64_t i) const { return load(i); }
    float rel() const { return 0.0f; }
    void copy(int64_t i, int64_t m, float* out) const { std::memcpy(out, w + i, sizeof(float) * m); }
};

struct Args {
    static constexpr bool kApprox = true;
    const float* x;
    TableCache cache{};
    __m512 load(int64_t i) const { return _mm512_loadu_ps(x + i); }
    __m512 load_approx(int64_t i) const { return load(i); }
    float rel() const { return kApproxWeightRel; }
    void copy(int64_t i, int64_t m, float* out) const { std::memcpy(out, x + i, sizeof(float) * m); }
};

struct Logits {
    static constexpr bool kApprox = true;
    const float* a;
    float m, t;
    bool all_finite;   // no NaN or inf among a: the finiteness test is skipped
    // Logits below this weigh exactly 0 (their arguments are below -105); -inf when no logit is
    // (then no span is tested for zero weights: the test would only cost).
    float zero_below;
    TableCache cache{};
    template <bool kReciprocal = false>
    __m512 args(__m512 v, float inv_t = 0.0f) const {
        __m512 d = _mm512_sub_ps(v, _mm512_set1_ps(m));
        if (kReciprocal) {
            d = _mm512_mul_ps(d, _mm512_set1_ps(inv_t));
        } else if (t != 1.0f) {
            d = _mm512_div_ps(d, _mm512_set1_ps(t));
        }
        if (all_finite) return d;
        const __mmask16 fin = _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), _mm512_setzero_ps(), _CMP_EQ_OQ);
        return _mm512_mask_blend_ps(fin, _mm512_set1_ps(-__builtin_inff()), d);
    }
    __m512 load(int64_t i) const { return args(_mm512_loadu_ps(a + i)); }
    __m512 load_approx(int64_t i) const { return load(i); }
    float rel() const { return kApproxWeightRel; }
    void copy(int64_t i, int64_t m_, float* out) const {
        for (int64_t j = 0; j < m_; j += kLanes) {
            const __mmask16 in = m_ - j >= kLanes ? (__mmask16)0xFFFF : (__mmask16)((1u << (m_ - j)) - 1);
            _mm512_mask_storeu_ps(out + j, in, args(_mm512_maskz_loadu_ps(in, a + i + j)));
        }
    }
};

// The same logits at a temperature other than 1 whose approximate weights take their arguments as
// fl(fl(a - m) * inv_t) instead of the division (the slowest step of a pass) and keep the wider
// bound approx_rel (reciprocal_weight_rel, binade_sum.h); exact weights still divide.
struct LogitsRcp : Logits {
    float inv_t, approx_rel;
    __m512 load_approx(int64_t i) const { return args<true>(_mm512_loadu_ps(a + i), inv_t); }
    float rel() const { return approx_rel; }
};

// The units of `blocks` blocks of 16 from index i0 at scale inv_u, or false when a rounding is
// uncertain. Exact sources round their terms. Approximate sources approximate their weights
// (taken from wa when given; stored into wa_out when given), and a block with an uncertain lane
// rounds its exact weights instead.
template <class Src>
bool units_of(const Src& src, int64_t i0, const float* wa, float* wa_out, int blocks, float inv_u, int32_t& units) {
    const __m512 scale = _mm512_set1_ps(inv_u);
    __m512i d_all = _mm512_setzero_si512();
    alignas(64) float xb[kLanes], wb[kLanes];
    for (int k = 0; k < blocks * kLanes; k += kLanes) {
        if (!Src::kApprox) {
            if (block_units(_mm512_mul_ps(src.load(i0 + k), scale), 0.0f, kExactUnitsMax, d_all) != 0xFFFF) return false;
            continue;
        }
        const __m512 w = wa ? _mm512_loadu_ps(wa + i0 + k) : approx_exp(src.load_approx(i0 + k));
        if (wa_out) _mm512_storeu_ps(wa_out + i0 + k, w);
        __m512i d = _mm512_setzero_si512();
        if (block_units(_mm512_mul_ps(w, scale), src.rel(), kApproxUnitsMax, d) != 0xFFFF) {
            src.copy(i0 + k, kLanes, xb);
            exp_weights(xb, wb, kLanes);
            const __m512 we = _mm512_load_ps(wb);
            if (wa_out) _mm512_storeu_ps(wa_out + i0 + k, we);   // exact weights are good guides too
            d = _mm512_setzero_si512();
            if (block_units(_mm512_mul_ps(we, scale), 0.0f, kExactUnitsMax, d) != 0xFFFF) return false;
        }
        d_all = _mm512_add_epi32(d_all, d);
    }
    units = _mm512_reduce_add_epi32(d_all);
    return true;
}

// round(y) for approximate y within y * rel (kApproxWeightRel, or a source's wider bound; plus
// 2^-40) of the exact value: the
// lanes where it is certain, and (into acc, as float bits of 1.5 * 2^23 + round) its value. The
// bounds y(1 -+ rel) are rounded to integers by adding 1.5 * 2^23 in the fused multiply-add; the
// exact y lies strictly between them, so when both round to the same integer (whichever way a
// tie of a bound went) that integer is round(y) and y is not a half-integer. Bounds from 2^22 up
// differ by more than the grid step there: never certain, so certain lanes add < 2^22 units.
inline __mmask16 approx_round(__m512 y, float rel, __m512i& acc) {
    const __m512 shifter = _mm512_set1_ps(0x1.8p23f);
    const __m512 hi = _mm512_fmadd_ps(y, _mm512_set1_ps(1.0f + rel), shifter);
    const __m512 lo = _mm512_fmadd_ps(y, _mm512_set1_ps(1.0f - rel), shifter);
    acc = _mm512_add_epi32(acc, _mm512_castps_si512(hi));
    return _mm512_cmp_ps_mask(hi, lo, _CMP_EQ_OQ);
}

// The units of `blocks` blocks from i0 at the unit 2^-E (E >= 0) from the weights' approximations,
// blocks with an uncertain lane rounding their exact weights instead: false when even those are
// uncertain (a tie). One test per span in the common case that every lane is certain.
// The approximations come from wa when given (scaled by 2^E: exact), else are evaluated;
// wa_out (when given) receives them (y scaled back by 2^-E).
template <class Src>
bool fast_units(const Src& src, int64_t i0, int blocks, int E, const float* wa, float* wa_out, int32_t& units) {
    const ExpTable& tab = wa ? src.cache.tab : src.cache.get(E);   // (not read when wa is given)
    const float rel = src.rel();
    __m512i acc = _mm512_setzero_si512();
    unsigned bad = 0;
    const __m512 unscale = _mm512_set1_ps(pow2(-E)), scale = _mm512_set1_ps(pow2(E));
    for (int b = 0; b < blocks; ++b) {
        const int64_t i = i0 + b * kLanes;
        const __m512 y = wa ? _mm512_mul_ps(_mm512_loadu_ps(wa + i), scale) : approx_exp_scaled(src.load_approx(i), tab);
        if (wa_out) _mm512_storeu_ps(wa_out + i, _mm512_mul_ps(y, unscale));
        if (approx_round(y, rel, acc) != 0xFFFF) bad |= 1u << b;
    }
    // each lane added 1.5 * 2^23's bits once per block: take them off (int32 arithmetic wraps,
    // the true total is small)
    int32_t d = _mm512_reduce_add_epi32(acc) - (int32_t)(0x4B400000u * (uint32_t)(blocks * kLanes));
    const float inv_u = pow2(E);
    alignas(64) float xb[kLanes], wb[kLanes];
    for (; bad; bad &= bad - 1) {
        const int64_t k = i0 + (int64_t)__builtin_ctz(bad) * kLanes;
        __m512i wrong = _mm512_setzero_si512();
        approx_round(wa ? _mm512_mul_ps(_mm512_loadu_ps(wa + k), scale) : approx_exp_scaled(src.load_approx(k), tab), rel,
                     wrong);
        d -= _mm512_reduce_add_epi32(wrong) - (int32_t)(0x4B400000u * (uint32_t)kLanes);
        src.copy(k, kLanes, xb);
        exp_weights(xb, wb, kLanes);
        __m512i exact = _mm512_setzero_si512();
        if (block_units(_mm512_mul_ps(_mm512_load_ps(wb), _mm512_set1_ps(inv_u)), 0.0f, kExactUnitsMax, exact) != 0xFFFF)
            return false;
        d += _mm512_reduce_add_epi32(exact);
    }
    units = d;
    return true;
}

// Whether all weights of `blocks` blocks from i0 are exactly 0 (arguments below -105).
template <class Src>
bool zero_blocks(const Src& src, int64_t i0, int blocks) {
    __mmask16 all = 0xFFFF;
    for (int k = 0; k < blocks * kLanes; k += kLanes)
        all &= _mm512_cmp_ps_mask(src.load(i0 + k), _mm512_set1_ps(-105.0f), _CMP_LT_OQ);
    return all == 0xFFFF;
}

// The same on the logits themselves: one compare per 16 (NaN and +inf are never below, so such
// a block is evaluated, to the same 0 weights).
bool zero_blocks(const Logits& src, int64_t i0, int blocks) {
    __mmask16 all = 0xFFFF;
    for (int k = 0; k < blocks * kLanes; k += kLanes)
        all &= _mm512_cmp_ps_mask(_mm512_loadu_ps(src.a + i0 + k), _mm512_set1_ps(src.zero_below), _CMP_LT_OQ);
    return all == 0xFFFF;
}

bool zero_blocks(const LogitsRcp& src, int64_t i0, int blocks) { return zero_blocks((const Logits&)src, i0, blocks); }

// Whether spans are tested for zero weights before the model: logits that may weigh 0 (low
// temperatures, peaked logits: long runs of them are skipped at one compare per 16).
template <class Src>
bool skips_zeros(const Src&) { return false; }
bool skips_zeros(const Logits& src) { return src.zero_below > -__builtin_inff(); }
bool skips_zeros(const LogitsRcp& src) { return src.zero_below > -__builtin_inff(); }

// units_of, through fast_units where it applies (approximate terms and a unit of at most 1).
template <class Src>
bool span_units(const Src& src, int64_t i0, const float* wa, float* wa_out, int blocks, binade::Unit b, int32_t& d) {
    if constexpr (Src::kApprox) {
        if (b.inv_u >= 1.0f) return fast_units(src, i0, blocks, exponent_of(b.inv_u), wa, wa_out, d);
    }
    return units_of(src, i0, wa, wa_out, blocks, b.inv_u, d);
}

// One span (a chunk, or one block of a chunk that failed) of the sum: true when the model took it.
// Inside the model's range a block of zero weights adds 0 units like any other; outside it (a sum
// still 0) such blocks are skipped: s + 0 = s, as in the plain loop.
template <class Src>
bool add_span(const Src& src, int64_t i0, float* wa, int blocks, float& s) {
    if (!(s >= binade::kModelMin && s <= binade::kModelMax) || skips_zeros(src)) {
        if (Src::kApprox && zero_blocks(src, i0, blocks)) {   // s + 0 = s
            if (wa) std::memset(wa + i0, 0, sizeof(float) * blocks * kLanes);
            return true;
        }
        if (!(s >= binade::kModelMin && s <= binade::kModelMax)) return false;
    }
    const binade::Unit b = binade::unit_of(s);
    int32_t d;
    if (!span_units(src, i0, nullptr, wa, blocks, b, d)) return false;
    const int32_t S = (int32_t)(s * b.inv_u) + d;
    if (S >= (1 << 24)) return false;
    s = (float)S * b.u;
    return true;
}

// The exact weights of the terms [i0, i0 + m) (m <= 128) into out (and wa when given).
template <class Src>
void exact_terms(const Src& src, int64_t i0, int64_t m, float* wa, float* out) {
    if (!Src::kApprox) return src.copy(i0, m, out);
    alignas(64) float xb[kChunkBlocks * kLanes];
    src.copy(i0, m, xb);
    exp_weights(xb, out, m);
    if (wa) std::memcpy(wa + i0, out, sizeof(float) * m);
}

// The plain loop over one span (exact weights).
template <class Src>
void add_plain(const Src& src, int64_t i0, float* wa, int64_t m, float& s) {
    alignas(64) float wb[kChunkBlocks * kLanes];
    exact_terms(src, i0, m, wa, wb);
    for (int64_t j = 0; j < m; ++j) s += wb[j];
}

// Whole chunks added at one unit, the running sum carried as its integer count S of that unit (s =
// S u exactly, so converting back and forth per chunk, a float-int-float chain on every chunk's
// path, changes nothing but the time; docs/sampling.md, "Ninth round"): from i while the sum stays
// inside the model, in one binade and away from zero-weight tests. Returns where it stopped, with
// s updated; `failed`: the chunk there was tried at this unit and did not fit (a binade crossing,
// a tie, an uncertain exact term), so it goes block by block without trying it whole again.
template <class Src>
int64_t add_chunks_at_one_unit(const Src& src, int64_t i, int64_t n, float* wa, float& s, bool& failed) {
    const int64_t chunk = kChunkBlocks * kLanes;
    failed = false;
    if (!(s >= binade::kModelMin && s <= binade::kModelMax) || skips_zeros(src)) return i;
    const binade::Unit b = binade::unit_of(s);
    int32_t S = (int32_t)(s * b.inv_u);
    for (; i + chunk <= n; i += chunk) {
        int32_t d;
        if (!span_units(src, i, nullptr, wa, kChunkBlocks, b, d) || S + d >= (1 << 24)) {
            failed = true;
            break;
        }
        S += d;
    }
    s = (float)S * b.u;
    return i;
}

template <class Src>
float total(const Src& src, int64_t n, float* wa, float s = 0.0f) {
    const int64_t chunk = kChunkBlocks * kLanes;
    int64_t i = 0;
    for (; i + chunk <= n; i += chunk) {
        bool failed;
        i = add_chunks_at_one_unit(src, i, n, wa, s, failed);
        if (i + chunk > n) break;
        if (!failed && add_span(src, i, wa, kChunkBlocks, s)) continue;
        for (int64_t k = i; k < i + chunk; k += kLanes)   // a binade change or a tie: block by block
            if (!add_span(src, k, wa, 1, s)) add_plain(src, k, wa, kLanes, s);
    }
    for (; i < n; i += chunk) add_plain(src, i, wa, std::min<int64_t>(chunk, n - i), s);
    return s;
}

// One span of the walk: true when the model took it (r stays above its binade's floor).
template <class Src>
bool walk_span(const Src& src, int64_t i0, const float* wa, int blocks, float& r) {
    const bool in_model = r >= binade::kModelMin && r <= binade::kModelMax;
    if (!in_model || skips_zeros(src)) {
        if (Src::kApprox && r > 0.0f && zero_blocks(src, i0, blocks)) return true;   // r - 0 = r stays > 0
        if (!in_model) return false;
    }
    const binade::Unit b = binade::unit_of(r);
    int32_t d;
    if (!span_units(src, i0, wa, nullptr, blocks, b, d)) return false;
    const int32_t R = (int32_t)(r * b.inv_u) - d;
    if (R <= (1 << 23)) return false;
    r = (float)R * b.u;
    return true;
}

// The plain walk over [i0, i0 + m) (m <= 128): the index of the first r <= 0, or -1.
template <class Src>
int64_t walk_plain(const Src& src, int64_t i0, int64_t m, float& r) {
    alignas(64) float wb[kChunkBlocks * kLanes];
    exact_terms(src, i0, m, nullptr, wb);
    return binade::seq_walk_plain(wb, m, r);
}

// The walk's counterpart of add_chunks_at_one_unit: whole chunks taken from r as its integer count
// R of one unit while every step stays above the binade's floor (R > 2^23 after the chunk).
template <class Src>
int64_t walk_chunks_at_one_unit(const Src& src, const float* wa, int64_t i, int64_t n, float& r, bool& failed) {
    const int64_t chunk = kChunkBlocks * kLanes;
    failed = false;
    if (!(r >= binade::kModelMin && r <= binade::kModelMax) || skips_zeros(src)) return i;
    const binade::Unit b = binade::unit_of(r);
    int32_t R = (int32_t)(r * b.inv_u);
    for (; i + chunk <= n; i += chunk) {
        int32_t d;
        if (!span_units(src, i, wa, nullptr, kChunkBlocks, b, d) || R - d <= (1 << 23)) {
            failed = true;
            break;
        }
        R -= d;
    }
    r = (float)R * b.u;
    return i;
}

template <class Src>
int64_t walk(const Src& src, const float* wa, int64_t n, float r) {
    const int64_t chunk = kChunkBlocks * kLanes;
    int64_t i = 0;
    for (; i + chunk <= n; i += chunk) {
        bool failed;
        i = walk_chunks_at_one_unit(src, wa, i, n, r, failed);
        if (i + chunk > n) break;
        if (!failed && walk_span(src, i, wa, kChunkBlocks, r)) continue;
        for (int64_t k = i; k < i + chunk; k += kLanes) {
            if (walk_span(src, k, wa, 1, r)) continue;
            const int64_t hit = walk_plain(src, k, kLanes, r);
            if (hit >= 0) return k + hit;
        }
    }
    for (; i < n; i += chunk) {
        const int64_t hit = walk_plain(src, i, std::min<int64_t>(chunk, n - i), r);
        if (hit >= 0) return i + hit;
    }
    return -1;
}

}  // namespace

float binade_seq_sum_avx512(const float* w, int64_t n) { return total(Weights{w}, n, nullptr); }
float binade_seq_sum_from_avx512(const float* w, int64_t n, float s) { return total(Weights{w}, n, nullptr, s); }

namespace {

// One chunk of kBinadeChunk terms in the parallel sums below.
struct PredictedChunk {
    float approx_sum;   // of the chunk's terms: what the prediction of the next chunk's unit adds
    bool skip;          // every term 0: s + 0 = s, as add_span
    bool ok;            // `units` are certain at `u`
    int32_t units;
    float u;            // the predicted unit of the running sum at the chunk's start; 0: none
};

// The caller's scratch; the workers see it through the reference.
std::vector<PredictedChunk>& predicted_chunks(int64_t n_chunks) {
    static thread_local std::vector<PredictedChunk> per_thread;
    per_thread.resize((size_t)n_chunks);
    return per_thread;
}

// Steps (2)-(4) of total_parallel (below), once every chunk's approx_sum and skip are set.
template <class Src>
float sum_at_predicted_units(const Src& x, int64_t n, float* wa, std::vector<PredictedChunk>& info,
                             ThreadPool& pool) {
    const int64_t chunk = kBinadeChunk;
    const int64_t n_chunks = (int64_t)info.size();
    double prefix = 0.0;
    for (PredictedChunk& ci : info) {
        const float p = (float)prefix;
        ci.u = (p >= binade::kModelMin && p <= binade::kModelMax) ? binade::unit_of(p).u : 0.0f;
        prefix += ci.approx_sum;
    }
    pool.parallel_for(n_chunks, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
            PredictedChunk& ci = info[(size_t)c];
            ci.ok = false;
            if (ci.skip || ci.u == 0.0f) continue;
            const binade::Unit b = binade::unit_of(ci.u * 0x1p23f);
            ci.ok = units_of(x, c * chunk, wa, nullptr, kChunkBlocks, b.inv_u, ci.units);
        }
    }, 64);
    float s = 0.0f;
    for (int64_t c = 0; c < n_chunks; ++c) {
        const PredictedChunk& ci = info[(size_t)c];
        const int64_t i = c * chunk;
        if (ci.skip) continue;
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
            if (!add_span(x, k, wa, 1, s)) add_plain(x, k, wa, kLanes, s);
    }
    for (int64_t i = n_chunks * chunk; i < n; i += chunk) add_plain(x, i, wa, std::min<int64_t>(chunk, n - i), s);
    return s;
}

}  // namespace

// The whole-vocabulary total on the thread pool. The serial loop above needs, per chunk, only the
// unit of the running sum at its start, and that is almost always the unit of the approximate
// prefix sum there. So: (1) in parallel, every chunk's approximate weights and their sum;
// (2) the prefix sums predict each chunk's unit; (3) in parallel, every chunk's units at the
// predicted unit (units_of, the same test as the serial loop); (4) serially, each chunk whose
// actual running sum has the predicted unit adds its units exactly as the serial loop would, and
// any other chunk runs the serial loop's own steps. The result is the serial loop's, bit for bit.
template <class Src>
float total_parallel(const Src& x, int64_t n, float* wa, ThreadPool& pool) {
    static_assert(kBinadeChunk == kChunkBlocks * kLanes, "binade_sum.h's chunk");
    const int64_t chunk = kBinadeChunk;
    std::vector<PredictedChunk>& info = predicted_chunks(n / chunk);
    pool.parallel_for((int64_t)info.size(), [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
            float* out = wa + c * chunk;
            PredictedChunk& ci = info[(size_t)c];
            ci.skip = zero_blocks(x, c * chunk, kChunkBlocks);
            if (ci.skip) {
                std::memset(out, 0, sizeof(float) * chunk);
                ci.approx_sum = 0.0f;
                continue;
            }
            __m512 acc = _mm512_setzero_ps();
            for (int k = 0; k < chunk; k += kLanes) {
                const __m512 w = approx_exp(x.load_approx(c * chunk + k));
                _mm512_storeu_ps(out + k, w);
                acc = _mm512_add_ps(acc, w);
            }
            ci.approx_sum = _mm512_reduce_add_ps(acc);
        }
    }, 64);
    return sum_at_predicted_units(x, n, wa, info, pool);
}

float binade_seq_sum_guided_avx512(const float* w, int64_t n, const float* chunk_sum, ThreadPool& pool) {
    // total_parallel's steps (2)-(4) over exact terms whose chunk sums the caller took.
    std::vector<PredictedChunk>& info = predicted_chunks(n / kBinadeChunk);
    for (size_t c = 0; c < info.size(); ++c) {
        info[c].approx_sum = chunk_sum[c];
        info[c].skip = chunk_sum[c] == 0.0f;   // every term 0 (terms >= 0)
    }
    return sum_at_predicted_units(Weights{w}, n, nullptr, info, pool);
}

// The whole-vocabulary total of a source (arguments or logits): split over the sampling pool
// (sampling_pool.h) when there is one and the vocabulary is large, else the serial pass (same bits
// either way).
namespace {
template <class Src>
float source_total(const Src& src, int64_t n, float* wa) {
    ThreadPool* pool = n >= (1 << 15) ? sampling_pool() : nullptr;
    if (pool) {
        static thread_local std::vector<float> guides;   // the caller's: the pool needs somewhere for them
        if (!wa) {
            guides.resize((size_t)n);
            wa = guides.data();
        }
        return total_parallel(src, n, wa, *pool);
    }
    return total(src, n, wa);
}
}  // namespace

float binade_weight_total_avx512(const float* x, int64_t n, float* wa) { return source_total(Args{x}, n, wa); }

int64_t binade_weight_walk_avx512(const float* x, const float* wa, int64_t n, float r) { return walk(Args{x}, wa, n, r); }

int64_t binade_seq_walk_avx512(const float* w, int64_t n, float r) { return walk(Weights{w}, nullptr, n, r); }


float binade_logit_total_avx512(const float* a, int64_t n, float m, float t, bool all_finite, float zero_below, float* wa) {
    return source_total(Logits{a, m, t, all_finite, zero_below}, n, wa);
}

int64_t binade_logit_walk_avx512(const float* a, int64_t n, float m, float t, bool all_finite, float zero_below, const float* wa, float r) {
    return walk(Logits{a, m, t, all_finite, zero_below}, wa, n, r);
}

float binade_logit_total_rcp_avx512(const float* a, int64_t n, float m, float t, bool all_finite, float zero_below,
                                    float rel, float* wa) {
    return source_total(LogitsRcp{{a, m, t, all_finite, zero_below}, 1.0f / t, rel}, n, wa);
}

int64_t binade_logit_walk_rcp_avx512(const float* a, int64_t n, float m, float t, bool all_finite, float zero_below,
                                     float rel, const float* wa, float r) {
    return walk(LogitsRcp{{a, m, t, all_finite, zero_below}, 1.0f / t, rel}, wa, n, r);
}

// The sum is non-decreasing (terms >= 0, rounding to nearest is monotone) and so is fl(s / total):
// a block whose sum at its end stays below top_p holds no stop. A block with a negative or
// non-finite term fails the model and runs the plain loop.
int64_t binade_seq_until_avx512(const float* w, int64_t n, float total, float top_p, float& s) {
    const int64_t chunk = kChunkBlocks * kLanes;
    // A chunk's units are taken at the unit the previous chunk ended in (`pred`), which changes
    // only when the sum crosses a binade: the next chunk's products and roundings then need not
    // wait for this chunk's reduction and the new running sum (a predicted branch instead of a
    // data dependency). Where the unit did change, the chunk runs the steps below at its own unit.
    // The same units, tests and sums as those steps: the same bits (docs/sampling.md, "Seventh round").
    float pred_inv_u = 0.0f;
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        if (i + chunk <= n && s >= binade::kModelMin && s <= binade::kModelMax) {
            int32_t d;
            const bool ok = units_of(Weights{w}, i, nullptr, nullptr, kChunkBlocks, pred_inv_u, d);
            const binade::Unit b = binade::unit_of(s);
            if (__builtin_expect(b.inv_u == pred_inv_u, 1) && ok) {
                const int32_t S = (int32_t)(s * b.inv_u) + d;
                const float s2 = (float)S * b.u;
                if (S < (1 << 24) && s2 / total < top_p) {
                    s = s2;
                    i += chunk - kLanes;
                    continue;
                }
            }
            pred_inv_u = b.inv_u;
        }
        float s2 = s;
        if (i + chunk <= n && add_span(Weights{w}, i, nullptr, kChunkBlocks, s2) && s2 / total < top_p) {
            s = s2;
            i += chunk - kLanes;
            continue;
        }
        s2 = s;
        if (add_span(Weights{w}, i, nullptr, 1, s2) && s2 / total < top_p) {
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
