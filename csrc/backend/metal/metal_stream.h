// A stream of the Metal backend: one command queue, the private work memory of its ops, and the
// small dispatch API the op files (ops_*.cpp) are written with. Each op of backend/ops.h is one
// method; its definition lives in the op group's file (see the list below), so the ops can be
// ported file by file. An op that is not ported yet throws Unsupported, and the backend's
// supports() says false for it (the *_supports functions, one per op file).
//
// Ordering: every dispatch of a stream sees the results of the ones before it (the helper puts
// a barrier between consecutive dispatches), and the CPU touches device memory only after the
// queued work is done (flush()).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/metal/encoder.h"
#include "backend/metal/metal_args.h"
#include "backend/metal/metal_backend.h"

namespace ds4 {
namespace backend {
namespace metal {

// One [[buffer(i)]] binding of a dispatch: a device buffer at a byte offset, or inline bytes
// (setBytes, copied when the dispatch is encoded: a pointer to a local struct is fine).
struct Arg {
    const DeviceBuffer* buffer = nullptr;
    uint64_t offset = 0;
    const void* bytes = nullptr;
    uint32_t nbytes = 0;
};

template <class T>
Arg bytes_arg(const T& v) {
    static_assert(sizeof(T) <= 4096, "setBytes takes at most 4 KiB");
    Arg a;
    a.bytes = &v;
    a.nbytes = (uint32_t)sizeof(T);
    return a;
}

// The kernel name suffix and activation format of a weight type (matvec_<suffix>, matmul_<suffix>).
struct QuantKernel {
    const char* suffix;       // "q8_0", "q2_k", "q4_k", "iq2_xxs", "f16", "bf16", "f32"
    int64_t block_elems;      // elements per weight block (1 for F16/BF16/F32)
    int64_t block_bytes;
    const char* act_kernel;   // quantize_q8_0_act / quantize_q8_k, or nullptr (float activations)
    int64_t act_block_elems;  // 32 / 256 / 1
    int64_t act_block_bytes;  // 36 / 292 / 4
};
// nullptr for types without Metal kernels (I32, Q8_K, ...).
const QuantKernel* quant_kernel(GgmlType t);

// ceil(a / b) for grid sizes.
inline uint32_t div_up(int64_t a, int64_t b) { return (uint32_t)((a + b - 1) / b); }

class MetalStream final : public Stream {
public:
    explicit MetalStream(MetalBackend& be);
    ~MetalStream() override;

    void reserve(const StreamLimits& limits) override;
    void begin() override;
    void end() override;
    void upload(const Tensor& dst, const void* src, uint64_t bytes) override;
    void download(const Tensor& src, void* dst, uint64_t bytes) override;

    // ---- ops (file of each in brackets) ----
    void embed_tokens_hc(const EmbedTokensHcArgs& a) override;        // ops_linear.cpp
    void linear(const LinearArgs& a) override;                        // ops_linear.cpp
    void linear_group(const LinearGroupArgs& a) override;             // ops_linear.cpp
    void grouped_output_a(const GroupedOutputAArgs& a) override;      // ops_linear.cpp
    void rms_norm(const RmsNormArgs& a) override;                     // ops_elementwise.cpp
    void head_rms_norm(const HeadRmsNormArgs& a) override;            // ops_elementwise.cpp
    void store_row_f16(const StoreRowF16Args& a) override;            // ops_elementwise.cpp
    void swiglu(const SwigluArgs& a) override;                        // ops_elementwise.cpp
    void add(const AddArgs& a) override;                              // ops_elementwise.cpp
    void fill(const FillArgs& a) override;                            // ops_elementwise.cpp
    void copy(const CopyArgs& a) override;                            // ops_elementwise.cpp
    void argmax(const ArgmaxArgs& a) override;                        // ops_elementwise.cpp
    void routed_experts(const RoutedExpertsArgs& a) override;         // ops_moe.cpp
    void hc_pre(const HcPreArgs& a) override;                         // ops_hc.cpp
    void hc_post(const HcPostArgs& a) override;                       // ops_hc.cpp
    void hc_collapse_norm(const HcCollapseNormArgs& a) override;      // ops_hc.cpp
    void rope_tail(const RopeTailArgs& a) override;                   // ops_rope_fp8.cpp
    void fp8_kv_roundtrip(const Fp8KvRoundtripArgs& a) override;      // ops_rope_fp8.cpp
    void compressor_store(const CompressorStoreArgs& a) override;     // ops_compressor.cpp
    void compressor_pool(const CompressorPoolArgs& a) override;       // ops_compressor.cpp
    void compressor_shift(const CompressorShiftArgs& a) override;     // ops_compressor.cpp
    void indexer_scores(const IndexerScoresArgs& a) override;         // ops_indexer.cpp
    void top_k_mask(const TopKMaskArgs& a) override;                  // ops_indexer.cpp
    void attention(const AttentionArgs& a) override;                  // ops_attention.cpp
    void attention_block(const AttentionBlockArgs& a) override;       // ops_attention.cpp (unsupported)
    void router(const RouterArgs& a) override;                        // ops_router.cpp

    // ---- the dispatch API of the op files ----
    // A tensor's buffer at its offset (plus `extra` bytes).
    Arg arg(const Tensor& t, uint64_t extra = 0) const;
    // A weight inside the mapped model (plus `extra` bytes: a group's rows, an expert).
    Arg arg(const TensorRef& w, uint64_t extra = 0) const;
    // A host array copied into device memory owned by the current command batch (token ids).
    Arg host_array(const void* p, uint64_t bytes);

    // dispatchThreadgroups / dispatchThreads of `kernel` specialised by `constants`, with
    // [[buffer(i)]] = args[i] and [[threadgroup(i)]] = tg_mem[i] bytes (rounded up to 16).
    void dispatch(const char* kernel, std::initializer_list<FunctionConstant> constants,
                  std::initializer_list<Arg> args, std::initializer_list<uint32_t> tg_mem, Size3 groups,
                  Size3 threads);
    void dispatch_threads(const char* kernel, std::initializer_list<FunctionConstant> constants,
                          std::initializer_list<Arg> args, std::initializer_list<uint32_t> tg_mem, Size3 grid,
                          Size3 threads);
    // Bytes of src into dst (a blit ordered like a dispatch).
    void blit(const Arg& src, const Arg& dst, uint64_t bytes);

    // Private work memory named `slot` (each op file uses its own names): at least width*rows
    // elements of `type`, grown on demand and kept. Its contents survive until the next use of
    // the same slot; a buffer replaced by growth lives until the queued work is done.
    Tensor scratch(const char* slot, DType type, int64_t width, int64_t rows);

    // Submits the queued work and waits for it (throws the device's error, naming the kernel).
    void flush();
    // `want` threads per threadgroup, lowered to whole simdgroups within the pipeline's
    // maxTotalThreadsPerThreadgroup (which may be below 1024 for register-heavy kernels).
    uint32_t threads_within(const char* kernel, std::initializer_list<FunctionConstant> constants, uint32_t want);
    // The pipeline's maxTotalThreadsPerThreadgroup.
    uint32_t max_threads(const char* kernel, std::initializer_list<FunctionConstant> constants = {});

    MetalBackend& backend() { return be_; }

private:
    void encode(const char* kernel, std::initializer_list<FunctionConstant> constants, std::initializer_list<Arg> args,
                std::initializer_list<uint32_t> tg_mem, Size3 grid, Size3 threads, bool grid_is_threads);

    MetalBackend& be_;
    std::unique_ptr<Queue> queue_;
    int depth_ = 0;               // begin()/end() nesting
    bool dispatched_ = false;     // a dispatch is encoded in the open command buffer
    std::map<std::string, std::unique_ptr<MetalBuffer>> scratch_;
    std::vector<std::unique_ptr<MetalBuffer>> retired_;   // replaced scratch / host copies in flight
};

// Throws Unsupported("<backend>: op X is not ported yet") (for ops whose file is a stub).
[[noreturn]] void metal_op_not_ported(MetalStream& s, Op op);

// Whether each op file runs `op` with weights of type `t` (metal_backend.cpp asks the file that
// owns the op; a stub file answers false).
bool linear_ops_supports(Op op, GgmlType t);        // ops_linear.cpp
bool elementwise_ops_supports(Op op, GgmlType t);   // ops_elementwise.cpp
bool moe_ops_supports(Op op, GgmlType t);           // ops_moe.cpp
bool hc_ops_supports(Op op, GgmlType t);            // ops_hc.cpp
bool rope_fp8_ops_supports(Op op, GgmlType t);      // ops_rope_fp8.cpp
bool compressor_ops_supports(Op op, GgmlType t);    // ops_compressor.cpp
bool indexer_ops_supports(Op op, GgmlType t);       // ops_indexer.cpp
bool attention_ops_supports(Op op, GgmlType t);     // ops_attention.cpp
bool router_ops_supports(Op op, GgmlType t);        // ops_router.cpp

}  // namespace metal
}  // namespace backend
}  // namespace ds4
