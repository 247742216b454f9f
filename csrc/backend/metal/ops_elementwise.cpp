// Metal ops: RMS norms (norm.metal), SwiGLU (ffn.metal) and the small data ops: add, fill, the
// f16 store, copy (a blit) and argmax (misc.metal). Grids as in ds4.metal_emu.ops.
#include "common/errors.h"
#include "backend/metal/metal_stream.h"

namespace ds4 {
namespace backend {
namespace metal {

namespace {

constexpr uint32_t kElementwiseThreads = 64;   // threadgroup of the one-thread-per-element kernels

// Threads of a per-row norm: enough 32-lane simdgroups to cover the row, at most 256 (the kernel
// keeps one partial sum per simdgroup; 256 threads = 8 partials).
uint32_t norm_threads(int64_t n) {
    const int64_t t = (n + 31) / 32 * 32;
    return (uint32_t)std::min<int64_t>(std::max<int64_t>(t, 32), 256);
}

int64_t elements(const Tensor& t) { return t.width() * t.rows(); }

void check_same(const Tensor& a, const Tensor& b, const char* op) {
    if (elements(a) != elements(b)) fail(ErrorKind::InvalidArgument, std::string("metal: ") + op + ": element counts differ");
}

}  // namespace

bool elementwise_ops_supports(Op op, GgmlType t) {
    return t == GgmlType::F32;   // no weights, or an F32 norm weight
}

// rms_norm_f32 reads rows in_stride floats apart and writes rows out_stride apart; in place is fine.
void MetalStream::rms_norm(const RmsNormArgs& a) {
    const int64_t n = a.x.width(), rows = a.x.rows();
    check_same(a.x, a.out, "rms_norm");
    const ds4_norm_args args{(uint)n, (uint)n, (uint)a.out.width(), a.eps};
    // An unweighted norm never reads buffer 2, but Metal wants every declared buffer bound.
    const Arg w = a.weight ? arg(*a.weight) : arg(a.x);
    dispatch("rms_norm_f32", {FunctionConstant::boolean(0, a.weight != nullptr)},
             {bytes_arg(args), arg(a.x), w, arg(a.out)}, {32 * 4}, {(uint32_t)rows, 1, 1},
             {threads_within("rms_norm_f32", {FunctionConstant::boolean(0, a.weight != nullptr)}, norm_threads(n)), 1, 1});
}

// A head is a row of head_dim: the plain norm over rows * n_head rows, in place.
void MetalStream::head_rms_norm(const HeadRmsNormArgs& a) {
    if (a.n_head * a.head_dim != a.x.width()) {
        fail(ErrorKind::InvalidArgument, "metal: head_rms_norm: n_head * head_dim differs from the row width");
    }
    const ds4_norm_args args{(uint)a.head_dim, (uint)a.head_dim, (uint)a.head_dim, a.eps};
    dispatch("rms_norm_f32", {FunctionConstant::boolean(0, false)}, {bytes_arg(args), arg(a.x), arg(a.x), arg(a.x)},
             {32 * 4}, {(uint32_t)(a.x.rows() * a.n_head), 1, 1},
             {threads_within("rms_norm_f32", {FunctionConstant::boolean(0, false)}, norm_threads(a.head_dim)), 1, 1});
}

void MetalStream::store_row_f16(const StoreRowF16Args& a) {
    check_same(a.src, a.dst, "store_row_f16");
    const int64_t n = elements(a.src);
    const ds4_elementwise_args args{(uint)n, 0.0f};
    dispatch_threads("store_row_f16", {}, {bytes_arg(args), arg(a.src), arg(a.dst)}, {}, {(uint32_t)n, 1, 1},
                     {threads_within("store_row_f16", {}, kElementwiseThreads), 1, 1});
}

void MetalStream::swiglu(const SwigluArgs& a) {
    check_same(a.g, a.u, "swiglu");
    check_same(a.g, a.out, "swiglu");
    const int64_t n = elements(a.g);
    const ds4_swiglu_args args{(uint)n, a.clamp, a.scale};
    dispatch_threads("swiglu", {}, {bytes_arg(args), arg(a.g), arg(a.u), arg(a.out)}, {}, {(uint32_t)n, 1, 1},
                     {threads_within("swiglu", {}, kElementwiseThreads), 1, 1});
}

void MetalStream::add(const AddArgs& a) {
    check_same(a.a, a.b, "add");
    check_same(a.a, a.out, "add");
    const int64_t n = elements(a.a);
    const ds4_elementwise_args args{(uint)n, 0.0f};
    dispatch_threads("add_f32", {}, {bytes_arg(args), arg(a.a), arg(a.b), arg(a.out)}, {}, {(uint32_t)n, 1, 1},
                     {threads_within("add_f32", {}, kElementwiseThreads), 1, 1});
}

void MetalStream::fill(const FillArgs& a) {
    const int64_t n = elements(a.t);
    const ds4_elementwise_args args{(uint)n, a.value};
    dispatch_threads("fill_f32", {}, {bytes_arg(args), arg(a.t)}, {}, {(uint32_t)n, 1, 1}, {threads_within("fill_f32", {}, kElementwiseThreads), 1, 1});
}

void MetalStream::copy(const CopyArgs& a) {
    if (a.src.nbytes() != a.dst.nbytes()) fail(ErrorKind::InvalidArgument, "copy: source and destination sizes differ");
    blit(arg(a.src), arg(a.dst), (uint64_t)a.src.nbytes());
}

// The result goes to the host: the queued work (and this dispatch) is waited for.
void MetalStream::argmax(const ArgmaxArgs& a) {
    const int64_t n = a.x.width();
    const Tensor r = scratch("argmax.result", DType::I32, 1, 1);
    const ds4_elementwise_args args{(uint)n, 0.0f};
    dispatch("argmax_f32", {}, {bytes_arg(args), arg(a.x), arg(r)}, {2 * 32 * 4}, {1, 1, 1},
             {threads_within("argmax_f32", {}, norm_threads(n)), 1, 1});
    download(r, a.result, 4);
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
