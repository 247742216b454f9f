// The logprob passes for arm64 NEON: 4 logits per compare, 2 doubles per exponential, fused
// multiply-adds. It is the AVX2 build's arithmetic lane for lane: the same reduction, polynomial
// and fused steps, and its four double lanes kept as two pairs of NEON registers, so every term and
// every sum has the AVX2 build's bits (docs/sampling.md, "Log-probabilities"). The table is read
// by two scalar loads per pair: NEON has no 64-bit gather, and a TBL over the 128-byte table would
// cost more vector instructions than the loads (docs/sampling.md counts them).
#include <arm_neon.h>

#include <cstring>

#include "sampling/logprobs_kernels.h"

// gcc's scheduling before register allocation interleaves the sixteen exponentials of a step and
// spills (about 90 stack accesses per 32 logits, against 15 without it); clang schedules with the
// register pressure in view and ignores this.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-schedule-insns")
#endif

namespace ds4 {
namespace logprob_kernels {

namespace {

struct Exp2 {
    const float64x2_t clamp = vdupq_n_f64(kClamp), inv = vdupq_n_f64(kInvLn2_16);
    const float64x2_t shifter = vdupq_n_f64(kShifter);
    const float64x2_t ln2_hi = vdupq_n_f64(kLn2Hi16), ln2_lo = vdupq_n_f64(kLn2Lo16);
    const float64x2_t c1 = vdupq_n_f64(kC[0]), c2 = vdupq_n_f64(kC[1]), c3 = vdupq_n_f64(kC[2]);
    const float64x2_t c4 = vdupq_n_f64(kC[3]), c5 = vdupq_n_f64(kC[4]), c6 = vdupq_n_f64(kC[5]);
    const float64x2_t c7 = vdupq_n_f64(kC[6]);

    // exp(max(d, kClamp)); FMAXNM returns the number when d is a quiet NaN, as the x86 max
    // returns its second operand, so a NaN d gives exp(kClamp) there too. +inf gives garbage that
    // callers mask. Without Clamp: d >= kClamp given.
    template <bool Clamp = true>
    float64x2_t eval(float64x2_t d) const {
        if (Clamp) d = vmaxnmq_f64(d, clamp);
        const float64x2_t kshift = vfmaq_f64(shifter, d, inv);
        const float64x2_t k = vsubq_f64(kshift, shifter);
        float64x2_t r = vfmsq_f64(d, k, ln2_hi);
        r = vfmsq_f64(r, k, ln2_lo);
        float64x2_t h = vfmaq_f64(c6, c7, r);
        h = vfmaq_f64(c5, h, r);
        h = vfmaq_f64(c4, h, r);
        h = vfmaq_f64(c3, h, r);
        h = vfmaq_f64(c2, h, r);
        h = vfmaq_f64(c1, h, r);
        // kshift's bits are 0x4338000000000000 + k: their low 4 bits pick the entry, << 48 leaves
        // (k << 48) mod 2^64 (logprobs_kernels.h)
        const uint64x2_t kb = vreinterpretq_u64_f64(kshift);
        const uint64x2_t entry = vcombine_u64(vld1_u64(kTable + (vgetq_lane_u64(kb, 0) & 15)),
                                              vld1_u64(kTable + (vgetq_lane_u64(kb, 1) & 15)));
        const float64x2_t t = vreinterpretq_f64_u64(vaddq_u64(entry, vshlq_n_u64(kb, 48)));
        return vfmaq_f64(t, vmulq_f64(t, r), h);
    }
};

// All-ones in the float lanes that are finite (NaN and +-inf fail v - v == 0).
inline uint32x4_t finite_mask(float32x4_t v) { return vceqq_f32(vsubq_f32(v, v), vdupq_n_f32(0.0f)); }

// A float lane mask widened to the double lanes of its low / high pair (sign extension).
inline uint64x2_t lo_mask(uint32x4_t m) { return vreinterpretq_u64_s64(vmovl_s32(vget_low_s32(vreinterpretq_s32_u32(m)))); }
inline uint64x2_t hi_mask(uint32x4_t m) { return vreinterpretq_u64_s64(vmovl_high_s32(vreinterpretq_s32_u32(m))); }

inline float64x2_t masked(float64x2_t w, uint64x2_t keep) {
    return vreinterpretq_f64_u64(vandq_u64(vreinterpretq_u64_f64(w), keep));
}

inline void two_sum(float64x2_t& s, float64x2_t& c, float64x2_t x) {
    const float64x2_t t = vaddq_f64(s, x);
    const float64x2_t z = vsubq_f64(t, s);
    c = vaddq_f64(c, vaddq_f64(vsubq_f64(s, vsubq_f64(t, z)), vsubq_f64(x, z)));
    s = t;
}

// The weights of 4 logits as a low and a high pair (lanes outside `keep` weigh 0 unless Plain):
// the AVX2 build's 4-double vector of the same logits, split in two.
template <bool Plain>
inline void weights4(const Exp2& e, float32x4_t v, float64x2_t m, uint32x4_t keep, float64x2_t& lo, float64x2_t& hi) {
    lo = e.eval<!Plain>(vsubq_f64(vcvt_f64_f32(vget_low_f32(v)), m));
    hi = e.eval<!Plain>(vsubq_f64(vcvt_high_f64_f32(v), m));
    if (!Plain) {
        lo = masked(lo, lo_mask(keep));
        hi = masked(hi, hi_mask(keep));
    }
}

// A vector step found a finite logit at or above the running floor (rare): the step's logits are
// collected in id order; collect_one itself tells above from tied and ignores ties past the limit,
// so checking against the floor is enough.
__attribute__((noinline)) void collect_range(Collect& col, const float* a, int64_t i, int64_t count,
                                             float32x4_t& at_least) {
    for (int64_t j = i; j < i + count; ++j)
        if (a[j] >= col.floor && a[j] - a[j] == 0.0f) collect_one(col, a, j);
    if (col.n_tied >= col.limit) at_least = vdupq_n_f32(col.above_floor);
}

inline double combine_vector_lanes(float64x2_t s_lo, float64x2_t s_hi, float64x2_t c_lo, float64x2_t c_hi) {
    double sl[4], cl[4];
    vst1q_f64(sl, s_lo);
    vst1q_f64(sl + 2, s_hi);
    vst1q_f64(cl, c_lo);
    vst1q_f64(cl + 2, c_hi);
    return combine_lanes(sl, cl, 4);
}

// 32 logits per step as the AVX2 build takes them: its eight 4-double weight vectors are here
// eight low pairs and eight high pairs, each set added as the same tree and into its own
// compensated pair; the tail (< 32) goes 8 at a time, zero-padded and masked.
template <bool Plain>
double exp_sum(const float* a, int64_t n, float m, Collect* col) {
    const Exp2 e;
    const float64x2_t md = vdupq_n_f64((double)m);
    Collect none{__builtin_inff(), __builtin_inff(), 0, nullptr, nullptr, nullptr, 0};
    Collect& cl = col ? *col : none;
    float32x4_t at_least = vdupq_n_f32(cl.n_tied >= cl.limit ? cl.above_floor : cl.floor);
    const uint32x4_t all = vdupq_n_u32(~0u);
    float64x2_t s_lo = vdupq_n_f64(0.0), s_hi = s_lo, c_lo = s_lo, c_hi = s_lo;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        float32x4_t v[8];
        uint32x4_t hits = vdupq_n_u32(0);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
            v[j] = vld1q_f32(a + i + 4 * j);
            hits = vorrq_u32(hits, vandq_u32(Plain ? all : finite_mask(v[j]), vcgeq_f32(v[j], at_least)));
        }
        if (__builtin_expect(vmaxvq_u32(hits) != 0, 0)) collect_range(cl, a, i, 32, at_least);
        // The tree's first level as each pair of vectors is done: the same additions, fewer
        // registers live (eight pair sums instead of sixteen weights).
        float64x2_t plo[4], phi[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
            float64x2_t lo0, hi0, lo1, hi1;
            // the finite masks again rather than eight more registers live across the step
            weights4<Plain>(e, v[2 * j], md, Plain ? all : finite_mask(v[2 * j]), lo0, hi0);
            weights4<Plain>(e, v[2 * j + 1], md, Plain ? all : finite_mask(v[2 * j + 1]), lo1, hi1);
            plo[j] = vaddq_f64(lo0, lo1);
            phi[j] = vaddq_f64(hi0, hi1);
        }
        two_sum(s_lo, c_lo, vaddq_f64(vaddq_f64(plo[0], plo[1]), vaddq_f64(plo[2], plo[3])));
        two_sum(s_hi, c_hi, vaddq_f64(vaddq_f64(phi[0], phi[1]), vaddq_f64(phi[2], phi[3])));
    }
    for (; i < n; i += 8) {
        const int64_t count = n - i < 8 ? n - i : 8;
        float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};   // 0 outside: finite, masked below
        std::memcpy(buf, a + i, (size_t)count * sizeof(float));
        static const uint32_t kLanes[4] = {0, 1, 2, 3};
        const uint32x4_t lane = vld1q_u32(kLanes);
        uint32x4_t hits = vdupq_n_u32(0);
        float64x2_t lo[2], hi[2];
        for (int j = 0; j < 2; ++j) {
            const float32x4_t v = vld1q_f32(buf + 4 * j);
            const uint32x4_t in = vcltq_u32(vaddq_u32(lane, vdupq_n_u32(4 * j)), vdupq_n_u32((uint32_t)count));
            const uint32x4_t keep = vandq_u32(in, finite_mask(v));
            hits = vorrq_u32(hits, vandq_u32(keep, vcgeq_f32(v, at_least)));
            weights4<false>(e, v, md, keep, lo[j], hi[j]);
        }
        if (vmaxvq_u32(hits) != 0) collect_range(cl, a, i, count, at_least);
        two_sum(s_lo, c_lo, vaddq_f64(lo[0], lo[1]));
        two_sum(s_hi, c_hi, vaddq_f64(hi[0], hi[1]));
    }
    return combine_vector_lanes(s_lo, s_hi, c_lo, c_hi);
}

}  // namespace

Stats stats_neon(const float* a, int64_t n, float* block_max) {
    const float32x4_t neg_inf = vdupq_n_f32(-__builtin_inff()), pos_inf = vdupq_n_f32(__builtin_inff());
    Stats st{-__builtin_inff(), __builtin_inff(), 0};
    float32x4_t lo = pos_inf;
    int64_t fin = 0;
    for (int64_t b = 0; b * kBlock < n; ++b) {
        const int64_t i0 = b * kBlock, end = i0 + kBlock < n ? i0 + kBlock : n;
        float32x4_t acc0 = neg_inf, acc1 = neg_inf;   // two chains: the max's latency
        uint32x4_t cnt = vdupq_n_u32(0);              // minus one per finite lane
        int64_t i = i0;
        for (; i + 8 <= end; i += 8) {
            const float32x4_t v0 = vld1q_f32(a + i), v1 = vld1q_f32(a + i + 4);
            const uint32x4_t f0 = finite_mask(v0), f1 = finite_mask(v1);
            acc0 = vmaxq_f32(acc0, vbslq_f32(f0, v0, neg_inf));
            acc1 = vmaxq_f32(acc1, vbslq_f32(f1, v1, neg_inf));
            lo = vminq_f32(lo, vbslq_f32(f0, v0, pos_inf));
            lo = vminq_f32(lo, vbslq_f32(f1, v1, pos_inf));
            cnt = vaddq_u32(cnt, vaddq_u32(f0, f1));
        }
        fin -= (int32_t)vaddvq_u32(cnt);   // at most 64 per lane: the wrapped sum is -count
        float hi = vmaxvq_f32(vmaxq_f32(acc0, acc1));
        finish_block(a, i, end, hi, fin, st, block_max[b]);
    }
    const float vmin = vminvq_f32(lo);
    if (vmin < st.min) st.min = vmin;
    st.n_finite = fin;
    return st;
}

double exp_sum_neon(const float* a, int64_t n, float m, bool plain, Collect* col) {
    return plain ? exp_sum<true>(a, n, m, col) : exp_sum<false>(a, n, m, col);
}

void exp_neon(const double* d, double* out, int64_t n) {
    const Exp2 e;
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) vst1q_f64(out + i, e.eval(vld1q_f64(d + i)));
    if (i < n) out[i] = vgetq_lane_f64(e.eval(vdupq_n_f64(d[i])), 0);
}

}  // namespace logprob_kernels
}  // namespace ds4
