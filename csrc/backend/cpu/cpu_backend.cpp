#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "common/decode_switches.h"
#include "common/errors.h"
#include "common/thread_pool.h"
#include "layers/attention.h"
#include "layers/compressor.h"
#include "layers/fp_quant.h"
#include "layers/hyper_connection.h"
#include "layers/indexer.h"
#include "layers/linear.h"
#include "layers/moe.h"
#include "layers/numerics.h"
#include "layers/rope.h"
#include "quant/kernels.h"

namespace ds4 {
namespace backend {

namespace {

// calloc'd host memory: large caches cost address space up front and physical pages only as
// rows are written (the compressed-row caches of a long context).
class HostBuffer final : public Buffer {
public:
    explicit HostBuffer(uint64_t n) : Buffer(nullptr, n) {
        if (n) {
            host_ = std::calloc((size_t)n, 1);
            if (!host_) throw std::bad_alloc();
        }
    }
    ~HostBuffer() override { std::free(host_); }
};

// The model file's mapping, used in place.
class MappedBuffer final : public Buffer {
public:
    MappedBuffer(const void* base, uint64_t n) : Buffer(const_cast<void*>(base), n) {}
};

template <class V>
void grow(V& v, int64_t n) {
    if ((int64_t)v.size() < n) v.resize((size_t)std::max<int64_t>(n, (int64_t)v.size() * 3 / 2));
}

float* f32(const Tensor& t) { return t.host<float>(); }

// Weights a side job reads ahead (hc_pre): one range per chunk, so stopping it waits for at
// most one chunk's loads.
constexpr int64_t kWarmChunk = 16 * 1024;

// Loads one byte per cache line of [p, p + bytes): the lines end up in this core's caches.
// Demand loads rather than prefetch hints, which the core may drop.
inline void touch_lines(const uint8_t* p, int64_t bytes) {
    uint32_t acc = 0;
    for (int64_t i = 0; i < bytes; i += 64) acc += p[i];
    asm volatile("" : : "r"(acc));
}

class CpuStream final : public Stream {
public:
    explicit CpuStream(ThreadPool* pool) : pool_(pool) {}

    // A command batch (a decode step, a prefill chunk) starts after host time in which the
    // workers may have gone to sleep; waking them now overlaps their wake-up with the first
    // serial ops (embedding, hc_pre's norm) instead of the first hand-off waiting for it
    // (docs/kernels.md, "Decode glue").
    void begin() override {
        if (decode_switches().prewake.load(std::memory_order_relaxed)) pool_->wake_workers();
    }

    void reserve(const StreamLimits& l) override { grow(scores_, l.n_head * l.max_attn_rows); }

    void upload(const Tensor& dst, const void* src, uint64_t bytes) override {
        std::memcpy(dst.host<uint8_t>(), src, (size_t)bytes);
    }
    void download(const Tensor& src, void* dst, uint64_t bytes) override {
        std::memcpy(dst, src.host<uint8_t>(), (size_t)bytes);
    }

    void embed_tokens_hc(const EmbedTokensHcArgs& a) override {
        const TensorRef& t = *a.table;
        const int64_t E = t.ne[0], HD = E * a.n_hc;
        float* out = f32(a.out);
        for (int64_t b = 0; b < a.n; ++b) {
            float* row = out + b * HD;
            dequantize_row(t.type, t.data + (int64_t)a.tokens[b] * t.row_stride(), row, E);
            for (int h = 1; h < a.n_hc; ++h) std::memcpy(row + h * E, row, (size_t)E * sizeof(float));
        }
    }

    void rms_norm(const RmsNormArgs& a) override {
        const int64_t n = a.x.width();
        const float* w = a.weight ? a.weight->f32() : nullptr;
        each_row(a.x.rows(), [&](int64_t b0, int64_t b1) {
            rms_norm_rows(f32(a.out) + b0 * n, f32(a.x) + b0 * n, w, b1 - b0, n, a.eps);
        });
    }

    void head_rms_norm(const HeadRmsNormArgs& a) override {
        each_row(a.x.rows(), [&](int64_t b0, int64_t b1) {
            for (int64_t b = b0; b < b1; ++b) {
                head_rms_norm_inplace(f32(a.x) + b * a.x.width(), a.n_head, a.head_dim, a.eps);
            }
        });
    }

    void linear(const LinearArgs& a) override {
        check_linear(a);
        ds4::linear(*a.w, f32(a.x), a.x.rows(), f32(a.y), act_, pool_, a.x.width());
    }

    void linear_group(const LinearGroupArgs& a) override {
        check_linear_group(a);
        LinearOut outs[LinearGroupArgs::kMax];
        for (int i = 0; i < a.count; ++i) outs[i] = LinearOut{a.w[i], f32(a.y[i])};
        ds4::linear_group(outs, a.count, f32(a.x), a.x.rows(), act_, pool_, a.x.width());
    }

    void grouped_output_a(const GroupedOutputAArgs& a) override {
        const TensorRef& wa = *a.wa;
        const int64_t nb = a.heads.rows(), G = a.n_group, rank = a.rank, gd = wa.ne[0];
        const int64_t qd = a.heads.width(), low_w = a.low.width();
        const int64_t ab = act_bytes(wa.type, gd);
        const float* heads = f32(a.heads);
        float* low = f32(a.low);
        if (nb == 1) {
            // Decode: every group's input is quantised first, then the G products run as one
            // pool dispatch (matvec_group: each output is matvec()'s bits), one hand-off to the
            // other threads instead of G (docs/kernels.md "Where a decode step's wall time goes").
            uint8_t* xq = act_.ensure(ab * G);
            group_parts_.resize((size_t)G);
            for (int64_t g = 0; g < G; ++g) {
                quantize_act(wa.type, heads + g * gd, xq + g * ab, gd);
                group_parts_[(size_t)g] =
                    MatvecPart{wa.type, wa.data + g * rank * wa.row_stride(), rank, xq + g * ab, low + g * rank};
            }
            matvec_group(group_parts_.data(), (int)G, gd, pool_);
            return;
        }
        uint8_t* xq = act_.ensure(ab * nb);
        grow(grp_, nb * rank);
        for (int64_t g = 0; g < G; ++g) {
            each_row(nb, [&](int64_t b0, int64_t b1) {
                for (int64_t b = b0; b < b1; ++b) quantize_act(wa.type, heads + b * qd + g * gd, xq + b * ab, gd);
            });
            const uint8_t* w = wa.data + g * rank * wa.row_stride();
            matmul(wa.type, w, rank, gd, xq, nb, grp_.data(), pool_);
            each_row(nb, [&](int64_t b0, int64_t b1) {
                for (int64_t b = b0; b < b1; ++b) {
                    std::memcpy(low + b * low_w + g * rank, grp_.data() + b * rank, (size_t)rank * sizeof(float));
                }
            });
        }
    }

    void hc_pre(const HcPreArgs& a) override {
        const int64_t nb = a.H.rows(), hd = a.H.width(), E = a.x.width();
        const int64_t mixn = a.split.width();
        grow(mix_, nb * mixn);
        const float* H = f32(a.H);
        // A batch times a float-activation weight (the F16 hc_*_fn): the normed rows are written
        // straight into the aligned buffer the product reads, which is what linear() would copy
        // them into (8 MiB per call for a 512-token `small` prefill; docs/gemm.md, "Prefill
        // profile"). Same floats into the same matmul. Decode keeps linear().
        const bool direct = nb > 1 && act_type_for(a.fn->type) == GgmlType::F32 && a.fn->ne[0] == hd;
        float* flat;
        if (direct) {
            flat = reinterpret_cast<float*>(act_.ensure(act_bytes(a.fn->type, hd) * nb));
        } else {
            grow(flat_, nb * hd);
            flat = flat_.data();
        }
        if (nb == 1) {
            // Decode: the norm's sum of squares is one sequential chain of double adds
            // (upstream's order, so it cannot be split), and the product needs its result. Meanwhile
            // the other thread reads the mix weights into cache, so the product that follows
            // reads them from there instead of DRAM (docs/kernels.md, "Decode glue").
            const uint8_t* wb = a.fn->data;
            const int64_t wbytes = a.fn->nbytes;
            const std::function<void(int64_t, int64_t)> warm = [wb, wbytes](int64_t c0, int64_t c1) {
                touch_lines(wb + c0 * kWarmChunk, std::min(c1 * kWarmChunk, wbytes) - c0 * kWarmChunk);
            };
            const int64_t chunks = (wbytes + kWarmChunk - 1) / kWarmChunk;
            const bool on = decode_switches().warm_hc.load(std::memory_order_relaxed);
            ThreadPool::SideJob side(*pool_, on ? chunks : 0, chunks, warm);
            rms_norm_rows(flat, H, nullptr, 1, hd, a.rms_eps);
            side.finish();
        } else {
            each_row(nb, [&](int64_t b0, int64_t b1) {
                rms_norm_rows(flat + b0 * hd, H + b0 * hd, nullptr, b1 - b0, hd, a.rms_eps);
            });
        }
        if (direct) {
            matmul(a.fn->type, a.fn->data, a.fn->ne[1], hd, flat, nb, mix_.data(), pool_);
        } else {
            ds4::linear(*a.fn, flat, nb, mix_.data(), act_, pool_);
        }
        float* split = f32(a.split);
        float* x = f32(a.x);
        const float* mix = mix_.data();
        each_row(nb, [&](int64_t b0, int64_t b1) {
            for (int64_t b = b0; b < b1; ++b) {
                float* sp = split + b * mixn;
                hc_split_sinkhorn(mix + b * mixn, a.scale->f32(), a.base->f32(), a.n_hc, a.sinkhorn_iters, a.hc_eps,
                                  sp);
                hc_weighted_sum(x + b * E, H + b * hd, hc_split_pre(sp), E, a.n_hc);
            }
        });
    }

    void hc_post(const HcPostArgs& a) override {
        const int64_t E = a.block.width(), hd = a.residual.width(), mixn = a.split.width();
        each_row(a.block.rows(), [&](int64_t b0, int64_t b1) {
            for (int64_t b = b0; b < b1; ++b) {
                ds4::hc_post(f32(a.out) + b * hd, f32(a.block) + b * E, f32(a.residual) + b * hd,
                             f32(a.split) + b * mixn, E, a.n_hc);
            }
        });
    }

    void hc_collapse_norm(const HcCollapseNormArgs& a) override {
        const int64_t hd = a.H.width(), E = a.y.width();
        grow(flat_, hd);
        grow(tmp_, E);
        const float* H = f32(a.H);
        rms_norm_no_weight(flat_.data(), H, hd, a.rms_eps);
        float pre[16], w[16];
        ds4::linear(*a.fn, flat_.data(), 1, pre, act_, pool_);
        const float scale = a.scale->f32()[0];
        const float* base = a.base->f32();
        for (int i = 0; i < a.n_hc; ++i) w[i] = sigmoid_stable(pre[i] * scale + base[i]) + a.hc_eps;
        for (int64_t d = 0; d < E; ++d) {
            float acc = 0.0f;
            for (int h = 0; h < a.n_hc; ++h) acc += H[h * E + d] * w[h];
            tmp_[d] = acc;
        }
        rms_norm_weight(f32(a.y), tmp_.data(), a.norm->f32(), E, a.rms_eps);
    }

    void rope_tail(const RopeTailArgs& a) override {
        each_row(a.x.rows(), [&](int64_t b0, int64_t b1) {
            for (int64_t b = b0; b < b1; ++b) {
                ds4::rope_tail(f32(a.x) + b * a.x.width(), a.n_head, a.head_dim, a.n_rot, a.pos0 + b, a.rope,
                               a.inverse);
            }
        });
    }

    void fp8_kv_roundtrip(const Fp8KvRoundtripArgs& a) override {
        each_row(a.x.rows(), [&](int64_t b0, int64_t b1) {
            for (int64_t b = b0; b < b1; ++b) ds4::fp8_kv_roundtrip(f32(a.x) + b * a.x.width(), a.head_dim, a.n_rot);
        });
    }

    void store_row_f16(const StoreRowF16Args& a) override {
        const int64_t w = a.src.width();
        const float* s = f32(a.src);
        float* d = f32(a.dst);
        // A prefill rounds the whole batch's KV rows in place at once: split it like any row-wise
        // step (one element at a time either way, so the same bits).
        each_row(a.src.rows(), [&](int64_t b0, int64_t b1) {
            for (int64_t i = b0 * w; i < b1 * w; ++i) d[i] = f16_round(s[i]);
        });
    }

    void compressor_store(const CompressorStoreArgs& a) override {
        grow(tmp_, a.kv_cur.width());
        ds4::compressor_store(*a.ape, f32(a.state_kv), f32(a.state_score), f32(a.kv_cur), f32(a.score_cur), a.ratio,
                              a.head_dim, a.pos, tmp_.data());
    }

    void compressor_pool(const CompressorPoolArgs& a) override {
        grow(tmp_, a.head_dim);
        ds4::compressor_pool(a.norm->f32(), f32(a.state_kv), f32(a.state_score), a.ratio, a.head_dim, a.n_rot, a.eps,
                             a.rope, a.pos, a.fp8, f32(a.out), tmp_.data());
    }

    void compressor_shift(const CompressorShiftArgs& a) override {
        ds4::compressor_shift(f32(a.state_kv), f32(a.state_score), a.head_dim);
    }

    void indexer_scores(const IndexerScoresArgs& a) override {
        ds4::indexer_scores(f32(a.q), f32(a.w), f32(a.rows), a.n_rows, a.n_head, a.head_dim, a.n_rot, a.pos, a.rope,
                            f32(a.scores), pool_);
    }

    void top_k_mask(const TopKMaskArgs& a) override {
        grow(order_, a.n + 1);
        select_top_k(f32(a.scores), a.n, a.k, order_.data(), a.mask.host<uint8_t>());
    }

    void attention(const AttentionArgs& a) override {
        grow(scores_, a.n_head * (a.raw_cap + a.n_comp));
        AttentionInputs in{f32(a.q),
                           f32(a.raw),
                           a.raw_cap,
                           a.n_raw,
                           a.raw_first,
                           a.n_comp ? f32(a.comp) : nullptr,
                           a.n_comp,
                           a.mask ? a.mask.host<uint8_t>() : nullptr,
                           a.sinks->f32(),
                           a.n_head,
                           a.head_dim};
        attend(in, f32(a.out), scores_.data(), pool_);
    }

    void attention_block(const AttentionBlockArgs& a) override {
        const int64_t nq = a.q.rows();
        if (nq < 1) return;
        QueryBlockInputs in{f32(a.q),
                            nq,
                            f32(a.raw),
                            a.raw_cap,
                            a.n_raw,
                            a.raw_first,
                            f32(a.fresh),
                            a.n_comp[nq - 1] ? f32(a.comp) : nullptr,
                            a.n_comp,
                            a.mask ? a.mask.host<uint8_t>() : nullptr,
                            a.mask_stride,
                            a.mask_first,
                            a.sinks->f32(),
                            a.n_head,
                            a.head_dim};
        attend_queries(in, f32(a.out), block_scratch_, pool_);
    }

    void router(const RouterArgs& a) override {
        // Tokens route independently (a prefill's batch is split over the pool); each range has
        // its own probability scratch.
        each_row(a.logits.rows(), [&](int64_t b0, int64_t b1) {
            thread_local std::vector<float> probs;
            grow(probs, 2 * a.n_expert);
            for (int64_t b = b0; b < b1; ++b) {
                route_token(f32(a.logits) + b * a.n_expert, a.n_expert, a.n_used, a.bias, a.hash, a.weight_scale,
                            a.tokens[b], a.sel.host<int32_t>() + b * a.n_used, f32(a.weights) + b * a.n_used,
                            probs.data());
            }
        });
    }

    void routed_experts(const RoutedExpertsArgs& a) override {
        const int64_t nb = a.x.rows(), E = a.x.width(), U = a.n_used, F = a.n_ff;
        const int64_t mt = std::min(nb, kMoeTokenBatch);
        grow(gate_, mt * U * F);
        grow(up_, mt * U * F);
        grow(mid_, mt * U * F);
        grow(down_, mt * U * E);
        const RoutedExperts w{a.gate, a.up, a.down, a.n_expert, a.n_used, E, F, a.clamp};
        MoeScratch ms{gate_.data(), up_.data(), mid_.data(), down_.data(), &xq_, &midq_};
        for (int64_t b0 = 0; b0 < nb; b0 += kMoeTokenBatch) {
            const int64_t m = std::min(kMoeTokenBatch, nb - b0);
            routed_experts_batch(w, f32(a.x) + b0 * E, m, a.sel.host<int32_t>() + b0 * U, f32(a.weights) + b0 * U,
                                 f32(a.out) + b0 * E, ms, pool_);
        }
    }

    void swiglu(const SwigluArgs& a) override {
        const int64_t w = a.g.width();
        each_row(a.g.rows(), [&](int64_t b0, int64_t b1) {
            ds4::swiglu(f32(a.out) + b0 * w, f32(a.g) + b0 * w, f32(a.u) + b0 * w, (b1 - b0) * w, a.clamp, a.scale);
        });
    }

    void add(const AddArgs& a) override {
        const int64_t w = a.a.width();
        const float* x = f32(a.a);
        const float* y = f32(a.b);
        float* o = f32(a.out);
        each_row(a.a.rows(), [&](int64_t b0, int64_t b1) {
            for (int64_t i = b0 * w; i < b1 * w; ++i) o[i] = x[i] + y[i];
        });
    }

    void fill(const FillArgs& a) override {
        std::fill_n(f32(a.t), (size_t)(a.t.width() * a.t.rows()), a.value);
    }

    void copy(const CopyArgs& a) override {
        if (a.src.nbytes() != a.dst.nbytes()) fail(ErrorKind::InvalidArgument, "copy: source and destination sizes differ");
        std::memmove(a.dst.host<uint8_t>(), a.src.host<uint8_t>(), (size_t)a.src.nbytes());
    }

    void argmax(const ArgmaxArgs& a) override {
        const float* x = f32(a.x);
        int32_t best = 0;
        for (int32_t i = 1; i < (int32_t)a.x.width(); ++i) if (x[i] > x[best]) best = i;
        *a.result = best;
    }

private:
    // Row-wise steps over a batch: tokens are independent, so they are split over the pool (the
    // same bits for any split); a single token (decode) runs inline.
    template <class Fn>
    void each_row(int64_t rows, const Fn& fn) {
        (pool_ ? *pool_ : ThreadPool::global()).parallel_for(rows, std::function<void(int64_t, int64_t)>(fn), 4);
    }

    ThreadPool* pool_;
    ActBuffer act_, xq_, midq_;
    std::vector<float> flat_, mix_, grp_, tmp_, scores_, block_scratch_, gate_, up_, mid_, down_;
    std::vector<int32_t> order_;
    std::vector<MatvecPart> group_parts_;
};

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(int threads) : pool_(threads) {}
    const char* name() const override { return "cpu"; }
    bool batched_rows_exact() const override { return true; }   // matvec.cpp: rows of matmul = matvec
    std::unique_ptr<Buffer> alloc(uint64_t bytes) override { return std::make_unique<HostBuffer>(bytes); }
    std::unique_ptr<Buffer> map_model(const void* base, uint64_t size, uint64_t /*largest_tensor*/) override {
        return std::make_unique<MappedBuffer>(base, size);
    }
    bool supports(Op op, GgmlType t) const override {
        switch (t) {
            case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0:
            case GgmlType::Q2_K: case GgmlType::Q4_K: case GgmlType::IQ2_XXS:
                return op != Op::kCount;
            default:
                return false;
        }
    }
    std::unique_ptr<Stream> new_stream() override { return std::make_unique<CpuStream>(&pool_); }
    int threads() const override { return pool_.size(); }
    ThreadPool* host_pool() override { return &pool_; }

private:
    ThreadPool pool_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace backend
}  // namespace ds4
