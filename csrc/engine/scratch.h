// The preallocated working memory of a forward pass over up to `tokens` tokens. Buffers only grow
// (on the first chunk of a given size), so the decode loop never allocates.
#pragma once
#include <cstdint>
#include <vector>

#include "layers/hyper_connection.h"
#include "layers/linear.h"
#include "model/shape.h"

namespace ds4 {

struct Scratch {
    int64_t tokens = 0;        // batch capacity
    int64_t comp_cap = 0;      // compressed-row capacity (scores, masks)

    std::vector<float> H, H2, flat, mix;
    std::vector<HcSplit> splits;
    std::vector<float> x, a, qr, qrn, q, kvr, kv;
    std::vector<float> ckv, csc, ickv, icsc, iq, iw;
    std::vector<float> heads, low, grp, attn_out;
    std::vector<float> rlogits, sg, su, smid, sout, moe;
    // per-token temporaries (gate/up/mid/down/sel/sel_w: per MoE token batch, see kMoeTokenBatch)
    std::vector<float> gate, up, mid, down, probs, comp_row, comp_tmp, scores, iscores, y, ytmp, plain;
    std::vector<int32_t> sel, order;
    std::vector<float> sel_w;
    std::vector<uint8_t> allowed;
    ActBuffer act, act2, xq, midq;

    // Grows the buffers for a batch of nb tokens and comp_rows compressed rows.
    void ensure(const Shape& s, int64_t nb, int64_t raw_cap, int64_t comp_rows);
};

}  // namespace ds4
