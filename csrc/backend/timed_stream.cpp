#include "backend/timed_stream.h"

#include <utility>

#include "common/op_timeline.h"

namespace ds4 {
namespace backend {

namespace {

const std::string* name_of(const TensorRef* t) { return t ? t->name : nullptr; }
int64_t bytes_of(const TensorRef* t) { return t ? t->nbytes : 0; }

// Opens an event for the scope when the timeline records.
class Scope {
public:
    Scope(const char* op, const std::string* label, int64_t bytes) : on_(timeline::recording()) {
        if (on_) timeline::open(op, label, bytes);
    }
    ~Scope() {
        if (on_) timeline::close();
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

private:
    bool on_;
};

class TimedStream final : public Stream {
public:
    explicit TimedStream(std::unique_ptr<Stream> inner) : in_(std::move(inner)) {}

    void reserve(const StreamLimits& l) override { in_->reserve(l); }
    void begin() override { in_->begin(); }
    void end() override {
        Scope s("end", nullptr, 0);
        in_->end();
    }
    void upload(const Tensor& dst, const void* src, uint64_t bytes) override {
        Scope s("upload", nullptr, 0);
        in_->upload(dst, src, bytes);
    }
    void download(const Tensor& src, void* dst, uint64_t bytes) override {
        Scope s("download", nullptr, 0);
        in_->download(src, dst, bytes);
    }
    void embed_tokens_hc(const EmbedTokensHcArgs& a) override {
        Scope s("embed_tokens_hc", name_of(a.table), a.table->row_stride() * a.n);
        in_->embed_tokens_hc(a);
    }
    void rms_norm(const RmsNormArgs& a) override {
        Scope s("rms_norm", name_of(a.weight), 0);
        in_->rms_norm(a);
    }
    void head_rms_norm(const HeadRmsNormArgs& a) override {
        Scope s("head_rms_norm", nullptr, 0);
        in_->head_rms_norm(a);
    }
    void linear(const LinearArgs& a) override {
        Scope s("linear", name_of(a.w), bytes_of(a.w));
        in_->linear(a);
    }
    void linear_group(const LinearGroupArgs& a) override {
        int64_t bytes = 0;
        for (int i = 0; i < a.count; ++i) bytes += bytes_of(a.w[i]);
        Scope s("linear_group", a.count ? name_of(a.w[0]) : nullptr, bytes);
        in_->linear_group(a);
    }
    void grouped_output_a(const GroupedOutputAArgs& a) override {
        Scope s("grouped_output_a", name_of(a.wa), bytes_of(a.wa));
        in_->grouped_output_a(a);
    }
    void hc_pre(const HcPreArgs& a) override {
        Scope s("hc_pre", name_of(a.fn), bytes_of(a.fn));
        in_->hc_pre(a);
    }
    void hc_post(const HcPostArgs& a) override {
        Scope s("hc_post", nullptr, 0);
        in_->hc_post(a);
    }
    void hc_collapse_norm(const HcCollapseNormArgs& a) override {
        Scope s("hc_collapse_norm", name_of(a.fn), bytes_of(a.fn));
        in_->hc_collapse_norm(a);
    }
    void rope_tail(const RopeTailArgs& a) override {
        Scope s("rope_tail", nullptr, 0);
        in_->rope_tail(a);
    }
    void fp8_kv_roundtrip(const Fp8KvRoundtripArgs& a) override {
        Scope s("fp8_kv_roundtrip", nullptr, 0);
        in_->fp8_kv_roundtrip(a);
    }
    void store_row_f16(const StoreRowF16Args& a) override {
        Scope s("store_row_f16", nullptr, 0);
        in_->store_row_f16(a);
    }
    void compressor_store(const CompressorStoreArgs& a) override {
        Scope s("compressor_store", nullptr, 0);
        in_->compressor_store(a);
    }
    void compressor_pool(const CompressorPoolArgs& a) override {
        Scope s("compressor_pool", nullptr, 0);
        in_->compressor_pool(a);
    }
    void compressor_shift(const CompressorShiftArgs& a) override {
        Scope s("compressor_shift", nullptr, 0);
        in_->compressor_shift(a);
    }
    void indexer_scores(const IndexerScoresArgs& a) override {
        Scope s("indexer_scores", nullptr, 0);
        in_->indexer_scores(a);
    }
    void top_k_mask(const TopKMaskArgs& a) override {
        Scope s("top_k_mask", nullptr, 0);
        in_->top_k_mask(a);
    }
    void attention(const AttentionArgs& a) override {
        Scope s("attention", nullptr, 0);
        in_->attention(a);
    }
    void attention_block(const AttentionBlockArgs& a) override {
        Scope s("attention_block", nullptr, 0);
        in_->attention_block(a);
    }
    void router(const RouterArgs& a) override {
        Scope s("router", nullptr, 0);
        in_->router(a);
    }
    void routed_experts(const RoutedExpertsArgs& a) override {
        // The experts a token uses: n_used of each matrix per row (an upper bound for a batch,
        // whose tokens may share experts).
        const int64_t per_slot = a.gate->matrix_stride() + a.up->matrix_stride() + a.down->matrix_stride();
        Scope s("routed_experts", name_of(a.gate), per_slot * a.n_used * a.x.rows());
        in_->routed_experts(a);
    }
    void swiglu(const SwigluArgs& a) override {
        Scope s("swiglu", nullptr, 0);
        in_->swiglu(a);
    }
    void add(const AddArgs& a) override {
        Scope s("add", nullptr, 0);
        in_->add(a);
    }
    void fill(const FillArgs& a) override {
        Scope s("fill", nullptr, 0);
        in_->fill(a);
    }
    void copy(const CopyArgs& a) override {
        Scope s("copy", nullptr, 0);
        in_->copy(a);
    }
    void argmax(const ArgmaxArgs& a) override {
        Scope s("argmax", nullptr, 0);
        in_->argmax(a);
    }

private:
    std::unique_ptr<Stream> in_;
};

}  // namespace

std::unique_ptr<Stream> maybe_timed(std::unique_ptr<Stream> inner) {
    if (!timeline::wanted()) return inner;
    return std::make_unique<TimedStream>(std::move(inner));
}

}  // namespace backend
}  // namespace ds4
