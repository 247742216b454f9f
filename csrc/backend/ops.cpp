#include "backend/ops.h"

#include <string>

#include "common/errors.h"

namespace ds4 {
namespace backend {

const char* op_name(Op op) {
    switch (op) {
        case Op::EmbedTokensHc: return "embed_tokens_hc";
        case Op::RmsNorm: return "rms_norm";
        case Op::HeadRmsNorm: return "head_rms_norm";
        case Op::Linear: return "linear";
        case Op::LinearGroup: return "linear_group";
        case Op::GroupedOutputA: return "grouped_output_a";
        case Op::HcPre: return "hc_pre";
        case Op::HcPost: return "hc_post";
        case Op::HcCollapseNorm: return "hc_collapse_norm";
        case Op::RopeTail: return "rope_tail";
        case Op::Fp8KvRoundtrip: return "fp8_kv_roundtrip";
        case Op::StoreRowF16: return "store_row_f16";
        case Op::CompressorStore: return "compressor_store";
        case Op::CompressorPool: return "compressor_pool";
        case Op::CompressorShift: return "compressor_shift";
        case Op::IndexerScores: return "indexer_scores";
        case Op::TopKMask: return "top_k_mask";
        case Op::Attention: return "attention";
        case Op::AttentionBlock: return "attention_block";
        case Op::Router: return "router";
        case Op::RoutedExperts: return "routed_experts";
        case Op::Swiglu: return "swiglu";
        case Op::Add: return "add";
        case Op::Fill: return "fill";
        case Op::Copy: return "copy";
        case Op::Argmax: return "argmax";
        case Op::kCount: break;
    }
    return "unknown";
}

void check_linear(const LinearArgs& a) {
    if (!a.w) fail(ErrorKind::InvalidArgument, "linear: weight is null");
    const TensorRef& w = *a.w;
    if (w.ne[0] != a.x.width() || a.y.width() != w.ne[1] || a.y.rows() != a.x.rows()) {
        fail(ErrorKind::InvalidArgument,
             "linear: weight [" + std::to_string(w.ne[0]) + " x " + std::to_string(w.ne[1]) +
                 "] does not fit input rows of " + std::to_string(a.x.width()) + " and output " +
                 std::to_string(a.y.rows()) + " rows of " + std::to_string(a.y.width()));
    }
}

void check_linear_group(const LinearGroupArgs& a) {
    if (a.count < 0 || a.count > LinearGroupArgs::kMax) {
        fail(ErrorKind::InvalidArgument, "linear_group: " + std::to_string(a.count) + " weights (0.." +
                                             std::to_string(LinearGroupArgs::kMax) + ")");
    }
    for (int i = 0; i < a.count; ++i) {
        const TensorRef* w = a.w[i];
        if (!w) fail(ErrorKind::InvalidArgument, "linear_group: weight " + std::to_string(i) + " is null");
        if (w->ne[0] != a.x.width() || a.y[i].width() != w->ne[1] || a.y[i].rows() != a.x.rows()) {
            fail(ErrorKind::InvalidArgument,
                 "linear_group: weight " + std::to_string(i) + " [" + std::to_string(w->ne[0]) + " x " +
                     std::to_string(w->ne[1]) + "] does not fit input rows of " + std::to_string(a.x.width()) +
                     " and output " + std::to_string(a.y[i].rows()) + " rows of " + std::to_string(a.y[i].width()));
        }
    }
}

LinearGroupArgs& LinearGroupArgs::add(const TensorRef* weight, const Tensor& out) {
    if (count >= kMax) {
        fail(ErrorKind::InvalidArgument, "linear_group: more than " + std::to_string(kMax) + " weights in one group");
    }
    w[count] = weight;
    y[count] = out;
    ++count;
    return *this;
}

}  // namespace backend
}  // namespace ds4
