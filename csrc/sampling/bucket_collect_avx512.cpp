// The collection pass with AVX-512: 32 bucket indices per step looked up in a bitmap of the wanted
// buckets held in eight registers (256 words of 16 bits: buckets 0..4095). The hits' positions
// are compressed into a list without a branch (the tokens of wanted buckets lie anywhere, so a
// branch per vector would mispredict), then written into their buckets in one tight loop.
#include <immintrin.h>

#include <cmath>

#include "sampling/bucket_collect.h"

namespace ds4 {

namespace {

// The collection loop; the word of every lane (the compress keeps those that pass) is
// collect_prefix_from's. kSaturate (id_bits + fine_bits = 32, scale 2^id_bits finite: the large
// vocabularies) takes it in two operations fewer: fl(fl(hi - v) * fl(scale 2^id_bits)) is exactly
// fl(fl(hi - v) * scale) 2^id_bits (a power of two; a product below the normal range truncates to
// level 0 either way, one that overflows is clamped either way), so its unsigned truncation holds
// the level in bits id_bits and up, its fraction below them (cleared by the id's mask), and from
// 2^32 up it saturates to all ones, level 2^fine_bits - 1: the clamp `min(d, top)` and the shift
// come free, and one ternary operation merges the id (docs/sampling.md, "Tenth round").
template <bool kSaturate>
int64_t collect_prefix_loop(const float* a, int64_t n, float floor, const PrefixGrid& g, bool all_finite, uint32_t* out) {
    const __m512 f = _mm512_set1_ps(floor), zero = _mm512_setzero_ps(), hi = _mm512_set1_ps(g.hi);
    const __m512 scale = _mm512_set1_ps(kSaturate ? std::ldexp(g.scale, g.id_bits) : g.scale);
    const __m512 top = _mm512_set1_ps((float)((1u << g.fine_bits) - 1));
    const __m128i shift = _mm_cvtsi32_si128(g.id_bits);
    const __m512i id_mask = _mm512_set1_epi32((int32_t)((1u << g.id_bits) - 1));
    __m512i ids = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16), step4 = _mm512_set1_epi32(64);
    // v >= floor is false for NaN and -inf; +inf passes it, so it is tested unless all are finite.
    auto pass = [&](__m512 v) {
        const __mmask16 ge = _mm512_cmp_ps_mask(v, f, _CMP_GE_OQ);
        return all_finite ? ge : (__mmask16)(ge & _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), zero, _CMP_EQ_OQ));
    };
    // (d is never NaN or negative in a lane that passes: v <= hi)
    auto word = [&](__m512 v, __m512i id) {
        const __m512 d = _mm512_mul_ps(_mm512_sub_ps(hi, v), scale);
        if (kSaturate) return _mm512_ternarylogic_epi32(_mm512_cvttps_epu32(d), id_mask, id, 0xBA);   // a & ~b | c
        return _mm512_or_si512(_mm512_sll_epi32(_mm512_cvttps_epi32(_mm512_min_ps(d, top)), shift), id);
    };
    int64_t k = 0, i = 0;
    // Four vectors per branch (a prefix passes a few percent of the entries: one branch per 16
    // would go either way); the stores need none, out holding n + 64 entries.
    for (; i + 64 <= n; i += 64) {
        const __m512 v[4] = {_mm512_loadu_ps(a + i), _mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(a + i + 32),
                             _mm512_loadu_ps(a + i + 48)};
        const __mmask16 ms[4] = {pass(v[0]), pass(v[1]), pass(v[2]), pass(v[3])};
        if (((unsigned)ms[0] | ms[1] | ms[2] | ms[3]) != 0) {
            __m512i id = ids;
            for (int j = 0; j < 4; ++j) {
                _mm512_storeu_si512((void*)(out + k), _mm512_maskz_compress_epi32(ms[j], word(v[j], id)));
                k += __builtin_popcount((unsigned)ms[j]);
                id = _mm512_add_epi32(id, step);
            }
        }
        ids = _mm512_add_epi32(ids, step4);
    }
    return collect_prefix_from(a, i, n, floor, g, out, k);
}

}  // namespace

int64_t collect_prefix_avx512(const float* a, int64_t n, float floor, const PrefixGrid& g, bool all_finite, uint32_t* out) {
    const bool saturate = g.id_bits + g.fine_bits == 32 && std::ldexp((double)g.scale, g.id_bits) <= 3.4028234663852886e38;
    return saturate ? collect_prefix_loop<true>(a, n, floor, g, all_finite, out)
                    : collect_prefix_loop<false>(a, n, floor, g, all_finite, out);
}

void bucket_collect_avx512(const uint16_t* bix, int64_t n, const uint8_t* want, int nb, uint32_t* cur, int32_t* ids,
                           int32_t* hits) {
    alignas(64) uint16_t words[256] = {};
    for (int k = 0; k < nb && k < 4096; ++k)
        if (want[k]) words[k >> 4] = (uint16_t)(words[k >> 4] | (1u << (k & 15)));
    __m512i t[8];
    for (int j = 0; j < 8; ++j) t[j] = _mm512_load_si512((const void*)(words + 32 * j));
    const __m512i limit = _mm512_set1_epi16((short)nb), one = _mm512_set1_epi16(1), low4 = _mm512_set1_epi16(15);
    const __m512i b6 = _mm512_set1_epi16(64), b7 = _mm512_set1_epi16(128);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int64_t h = 0, i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512i b = _mm512_loadu_si512((const void*)(bix + i));
        const __m512i wi = _mm512_srli_epi16(b, 4);   // the word; its low 6 bits pick among 64
        const __m512i w01 = _mm512_permutex2var_epi16(t[0], wi, t[1]);
        const __m512i w23 = _mm512_permutex2var_epi16(t[2], wi, t[3]);
        const __m512i w45 = _mm512_permutex2var_epi16(t[4], wi, t[5]);
        const __m512i w67 = _mm512_permutex2var_epi16(t[6], wi, t[7]);
        const __mmask32 m6 = _mm512_test_epi16_mask(wi, b6), m7 = _mm512_test_epi16_mask(wi, b7);
        const __m512i w = _mm512_mask_blend_epi16(m7, _mm512_mask_blend_epi16(m6, w01, w23),
                                                  _mm512_mask_blend_epi16(m6, w45, w67));
        const __m512i bit = _mm512_sllv_epi16(one, _mm512_and_si512(b, low4));
        // (an index >= nb, a token that is not finite, would wrap around the table: masked off)
        const uint32_t hit = (uint32_t)(_mm512_test_epi16_mask(w, bit) & _mm512_cmplt_epu16_mask(b, limit));
        const __m512i p0 = _mm512_add_epi32(iota, _mm512_set1_epi32((int)i));
        const __m512i p1 = _mm512_add_epi32(p0, _mm512_set1_epi32(16));
        _mm512_storeu_si512((void*)(hits + h), _mm512_maskz_compress_epi32((__mmask16)hit, p0));
        h += __builtin_popcount(hit & 0xFFFFu);
        _mm512_storeu_si512((void*)(hits + h), _mm512_maskz_compress_epi32((__mmask16)(hit >> 16), p1));
        h += __builtin_popcount(hit >> 16);
    }
    for (int64_t j = 0; j < h; ++j) {
        const int32_t p = hits[j];
        ids[cur[bix[p]]++] = p;
    }
    bucket_collect_from(bix, i, n, want, cur, ids);
}

}  // namespace ds4
