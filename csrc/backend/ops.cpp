#include "backend/ops.h"

namespace ds4 {
namespace backend {

const char* op_name(Op op) {
    switch (op) {
        case Op::EmbedTokensHc: return "embed_tokens_hc";
        case Op::RmsNorm: return "rms_norm";
        case Op::HeadRmsNorm: return "head_rms_norm";
        case Op::Linear: return "linear";
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

}  // namespace backend
}  // namespace ds4
