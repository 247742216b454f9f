#include "layers/compressor.h"

#include <cmath>
#include <cstring>

#include "layers/fp_quant.h"
#include "layers/numerics.h"
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

// Ratio 4 after an emission: the current window becomes the previous one; rows 4..7 keep their
// contents and are overwritten before the next emission.
void advance_window(float* skv, float* ssc, int64_t width) {
    std::memcpy(skv, skv + 4 * width, (size_t)(4 * width) * sizeof(float));
    std::memcpy(ssc, ssc + 4 * width, (size_t)(4 * width) * sizeof(float));
}

}  // namespace

bool compressor_step(const CompressorLane& lane, const CompressorWeights& w, float* skv, float* ssc,
                     const float* kv_cur, float* sc_cur, int64_t pos, float* out, float* tmp) {
    const int ratio = lane.ratio;
    const int64_t hd = lane.head_dim;
    const int64_t width = Shape::coff(ratio) * hd;
    const int64_t pos_mod = pos % ratio;
    const int64_t row = frontier_row(ratio, pos);

    // APE row pos_mod of the [width, ratio] tensor, added to the score only.
    dequantize_row(w.ape.type, w.ape.data + pos_mod * w.ape.row_stride(), tmp, width);
    for (int64_t j = 0; j < width; ++j) sc_cur[j] += tmp[j];
    std::memcpy(skv + row * width, kv_cur, (size_t)width * sizeof(float));
    std::memcpy(ssc + row * width, sc_cur, (size_t)width * sizeof(float));
    if ((pos + 1) % ratio != 0) return false;

    // Pooled before the ratio-4 window moves (frontier_store does the move for replays).
    pool_state(tmp, skv, ssc, hd, ratio);
    rms_norm_weight(out, tmp, w.norm.f32(), hd, lane.eps);
    rope_tail(out, 1, hd, lane.n_rot, pos + 1 - ratio, *lane.rope, false);
    if (lane.fp8) {
        fp8_kv_roundtrip(out, hd, lane.n_rot);
    } else {
        indexer_qat_row(out, hd);
    }
    if (ratio == 4) advance_window(skv, ssc, width);
    return true;
}

void frontier_store(int ratio, int64_t width, float* skv, float* ssc, const float* kv_row, const float* score_row,
                    int64_t pos) {
    const int64_t row = frontier_row(ratio, pos);
    std::memcpy(skv + row * width, kv_row, (size_t)width * sizeof(float));
    std::memcpy(ssc + row * width, score_row, (size_t)width * sizeof(float));
    if (ratio == 4 && (pos + 1) % ratio == 0) advance_window(skv, ssc, width);
}

}  // namespace ds4
