// scale_weights for AVX-512: 8 weights per step, each converted to double, multiplied and
// converted back, as the plain loop does. The compiler's own vectorisation of that loop took 16
// floats per step and split and joined the halves around the conversions (an extract and an
// insert, shuffles that compete with the conversions): 8 per step, loaded and stored as halves,
// runs in about half the time (docs/sampling.md, "Ninth round").
#include <immintrin.h>

#include "sampling/scale_weights.h"

namespace ds4 {

void scale_weights_avx512(const float* w, int64_t n, double inv, float* out) {
    const __m512d v = _mm512_set1_pd(inv);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(w + i)), v)));
    if (i < n) {
        const __mmask8 m = (__mmask8)((1u << (n - i)) - 1);
        const __m256 x = _mm256_maskz_loadu_ps(m, w + i);
        _mm256_mask_storeu_ps(out + i, m, _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(x), v)));
    }
}

}  // namespace ds4
