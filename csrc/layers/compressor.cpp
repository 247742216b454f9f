#include "layers/compressor.h"

#include <cmath>
#include <cstring>

#include "layers/fp_quant.h"
#include "layers/numerics.h"
#include "layers/rope.h"
#include "model/shape.h"
#include "quant/kernels.h"

namespace ds4 {

namespace {

void pool_state(float* out, const float* skv, const float* ssc, int64_t hd, int ratio) {
    const int64_t width = Shape::coff(ratio) * hd;
    for (int64_t j = 0; j < hd; ++j) {
        float mx = kNeg;
        if (ratio == 4) {
            for (int r = 0; r < 4; ++r) {
                const float sp = ssc[r * width + j];
                const float sc = ssc[(4 + r) * width + hd + j];
                if (sp > mx) mx = sp;
                if (sc > mx) mx = sc;
            }
        } else {
            for (int r = 0; r < ratio; ++r) {
                const float sv = ssc[r * width + j];
                if (sv > mx) mx = sv;
            }
        }
        if (mx <= kNegSkip) {
            out[j] = 0.0f;
            continue;
        }
        float denom = 0.0f, sum = 0.0f;
        if (ratio == 4) {
            for (int r = 0; r < 4; ++r) {
                const float wp = std::exp(ssc[r * width + j] - mx);
                const float wc = std::exp(ssc[(4 + r) * width + hd + j] - mx);
                denom += wp + wc;
                sum += wp * skv[r * width + j];
                sum += wc * skv[(4 + r) * width + hd + j];
            }
        } else {
            for (int r = 0; r < ratio; ++r) {
                const float w = std::exp(ssc[r * width + j] - mx);
                denom += w;
                sum += w * skv[r * width + j];
            }
        }
        out[j] = denom > 0.0f ? sum / denom : 0.0f;
    }
}

}  // namespace

void compressor_store(const TensorRef& ape, float* skv, float* ssc, const float* kv_cur, float* sc_cur, int ratio,
                      int64_t hd, int64_t pos, float* tmp) {
    const int64_t width = Shape::coff(ratio) * hd;
    const int64_t pos_mod = pos % ratio;
    const int64_t row = Shape::frontier_row(ratio, pos);
    // APE row pos_mod of the [width, ratio] tensor, added to the score only.
    dequantize_row(ape.type, ape.data + pos_mod * ape.row_stride(), tmp, width);
    for (int64_t j = 0; j < width; ++j) sc_cur[j] += tmp[j];
    std::memcpy(skv + row * width, kv_cur, (size_t)width * sizeof(float));
    std::memcpy(ssc + row * width, sc_cur, (size_t)width * sizeof(float));
}

void compressor_pool(const float* norm, const float* skv, const float* ssc, int ratio, int64_t hd, int64_t n_rot,
                     float eps, const RopeParams& rope, int64_t pos, bool fp8, float* out, float* tmp) {
    pool_state(tmp, skv, ssc, hd, ratio);
    rms_norm_weight(out, tmp, norm, hd, eps);
    rope_tail(out, 1, hd, n_rot, pos, rope, false);
    if (fp8) {
        fp8_kv_roundtrip(out, hd, n_rot);
    } else {
        indexer_qat_row(out, hd);
    }
}

void compressor_shift(float* skv, float* ssc, int64_t hd) {
    const int64_t width = Shape::coff(4) * hd;
    std::memcpy(skv, skv + 4 * width, (size_t)(4 * width) * sizeof(float));
    std::memcpy(ssc, ssc + 4 * width, (size_t)(4 * width) * sizeof(float));
}

}  // namespace ds4
