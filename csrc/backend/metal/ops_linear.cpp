// Metal ops: token embedding, Linear (quantise the activation, then mat-vec for one row or
// mat-mat for many) and the grouped attention output A (quantize_act.metal, matvec.metal,
// matmul.metal). Grids and arguments as in ds4.metal_emu.ops, the reference host.
#include "backend/metal/ops_linear.h"

#include <cstring>

#include "common/errors.h"

namespace ds4 {
namespace backend {
namespace metal {

namespace {

constexpr uint32_t kMvRows = 4;         // rows per simdgroup (MV_ROWS in matvec.metal)
constexpr uint32_t kMvSimdgroups = 2;   // simdgroups per threadgroup
constexpr uint32_t kMmTile = 32;        // mat-mat output tile (rows x tokens)

const QuantKernel& kernel_for(GgmlType t, const char* op) {
    const QuantKernel* k = quant_kernel(t);
    if (!k) fail(ErrorKind::Unsupported, std::string("metal: ") + op + ": no kernel for weight type " +
                                         (is_known_type((uint32_t)t) ? type_traits(t).name : std::to_string((uint32_t)t)));
    return *k;
}

void check_width(int64_t n, const QuantKernel& k, const char* op) {
    if (n % k.block_elems) {
        fail(ErrorKind::InvalidArgument, std::string("metal: ") + op + ": row width " + std::to_string(n) +
                                             " is not a multiple of the weight block (" + std::to_string(k.block_elems) + ")");
    }
}

// Two weight kernels read the same activation rows when they name the same quantiser (or none:
// floats).
bool same_act_kernel(const char* a, const char* b) { return a == b || (a && b && std::strcmp(a, b) == 0); }

}  // namespace

bool linear_ops_supports(Op op, GgmlType t) { return quant_kernel(t) != nullptr; }

ActRows quantize_rows(MetalStream& s, const QuantKernel& k, const Tensor& x, int64_t n, int64_t rows,
                      const char* slot) {
    if (!k.act_kernel) return {s.arg(x), n * 4};   // F16/BF16/F32 weights read float activations
    const int64_t ab = n / k.act_block_elems * k.act_block_bytes;
    const Tensor q = s.scratch(slot, DType::U8, ab, rows);
    const ds4_quant_act_args args{(uint)n, (uint)ab};
    s.dispatch(k.act_kernel, {}, {bytes_arg(args), s.arg(x), s.arg(q)}, {},
               {(uint32_t)(n / k.act_block_elems), (uint32_t)rows, 1}, {32, 1, 1});
    return {s.arg(q), ab};
}

void matvec_or_matmul(MetalStream& s, const QuantKernel& k, const Arg& w, int64_t n, int64_t rows, const Arg& x,
                      int64_t act_stride, int64_t n_tok, const Arg& y, int64_t y_stride) {
    const ds4_matvec_args args{(uint)n, (uint)rows, (uint)(n / k.block_elems * k.block_bytes), (uint)n_tok,
                               (uint)act_stride, (uint)y_stride};
    const std::string mm = "matmul_" + std::string(k.suffix), mv = "matvec_" + std::string(k.suffix);
    // The mat-mat tile code needs its 4 simdgroups; a pipeline capped lower runs the mat-vec,
    // which takes any token count (one threadgroup row per token).
    if (n_tok > 1 && s.threads_within(mm.c_str(), {}, 128) == 128) {
        s.dispatch(mm.c_str(), {}, {bytes_arg(args), w, x, y}, {2 * kMmTile * kMmTile * 4},
                   {div_up(rows, kMmTile), div_up(n_tok, kMmTile), 1}, {128, 1, 1});
        return;
    }
    const uint32_t threads = s.threads_within(mv.c_str(), {}, 32 * kMvSimdgroups);
    s.dispatch(mv.c_str(), {}, {bytes_arg(args), w, x, y}, {}, {div_up(rows, kMvRows * (threads / 32)), (uint32_t)n_tok, 1},
               {threads, 1, 1});
}

void MetalStream::linear(const LinearArgs& a) {
    check_linear(a);
    const TensorRef& w = *a.w;
    const QuantKernel& k = kernel_for(w.type, "linear");
    const int64_t n = w.ne[0], rows = w.ne[1], nb = a.x.rows();
    check_width(n, k, "linear");
    if (a.x.width() != n) fail(ErrorKind::InvalidArgument, "metal: linear: activation width differs from the weight's");
    const ActRows x = quantize_rows(*this, k, a.x, n, nb, "linear.act");
    matvec_or_matmul(*this, k, arg(w), n, rows, x.arg, x.stride, nb, arg(a.y), a.y.width());
}

// Linear for each member, with one quantisation of x per activation kernel (members whose
// kernels share act_kernel read the same scratch rows): the same kernels on the same inputs as
// separate Linear calls, so the same bits. Each product stays its own dispatch (docs/metal.md).
void MetalStream::linear_group(const LinearGroupArgs& a) {
    check_linear_group(a);
    static const char* const kSlots[LinearGroupArgs::kMax] = {"group.act0", "group.act1", "group.act2", "group.act3",
                                                              "group.act4", "group.act5", "group.act6", "group.act7"};
    const int64_t nb = a.x.rows();
    const char* act_kernel[LinearGroupArgs::kMax];
    ActRows act[LinearGroupArgs::kMax];
    int n_acts = 0;
    for (int i = 0; i < a.count; ++i) {
        const TensorRef& w = *a.w[i];
        const QuantKernel& k = kernel_for(w.type, "linear_group");
        const int64_t n = w.ne[0];
        check_width(n, k, "linear_group");
        int j = 0;
        while (j < n_acts && !same_act_kernel(act_kernel[j], k.act_kernel)) ++j;
        if (j == n_acts) {
            act_kernel[j] = k.act_kernel;
            act[j] = quantize_rows(*this, k, a.x, n, nb, kSlots[j]);
            ++n_acts;
        }
        matvec_or_matmul(*this, k, arg(w), n, w.ne[1], act[j].arg, act[j].stride, nb, arg(a.y[i]), a.y[i].width());
    }
}

// Group g: rows g*rank.. of Wa (bound at their byte offset, no copy) times the heads' group g.
// The activation is quantised once for every (token, group) as rows of group_dim.
void MetalStream::grouped_output_a(const GroupedOutputAArgs& a) {
    const TensorRef& wa = *a.wa;
    const QuantKernel& k = kernel_for(wa.type, "grouped_output_a");
    const int64_t nb = a.heads.rows(), G = a.n_group, rank = a.rank, gd = wa.ne[0];
    check_width(gd, k, "grouped_output_a");
    const ActRows x = quantize_rows(*this, k, a.heads, gd, nb * G, "grouped.act");
    const int64_t row_bytes = gd / k.block_elems * k.block_bytes;
    for (int64_t g = 0; g < G; ++g) {
        Arg xg = x.arg;
        xg.offset += (uint64_t)(g * x.stride);
        matvec_or_matmul(*this, k, arg(wa, (uint64_t)(g * rank * row_bytes)), gd, rank, xg, G * x.stride, nb,
                         arg(a.low, (uint64_t)(g * rank * 4)), a.low.width());
    }
}

void MetalStream::embed_tokens_hc(const EmbedTokensHcArgs& a) {
    const TensorRef& t = *a.table;
    const QuantKernel& k = kernel_for(t.type, "embed_tokens_hc");
    const int64_t E = t.ne[0];
    check_width(E, k, "embed_tokens_hc");
    if (a.n <= 0) return;
    const ds4_embed_args args{(uint)E, (uint)(E / k.block_elems * k.block_bytes), (uint)t.ne[1], (uint)a.n_hc};
    dispatch_threads("embed_rows_hc", {FunctionConstant::i32(0, (int32_t)t.type)},
                     {bytes_arg(args), arg(t), host_array(a.tokens, (uint64_t)a.n * 4), arg(a.out)}, {},
                     {div_up(E, 8), (uint32_t)a.n, 1}, {8, 4, 1});
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
