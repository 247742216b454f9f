#include "backend/metal/metal_stream.h"

#include <algorithm>
#include <cstring>

#include "common/errors.h"

namespace ds4 {
namespace backend {
namespace metal {

const QuantKernel* quant_kernel(GgmlType t) {
    static const QuantKernel f32{"f32", 1, 4, nullptr, 1, 4};
    static const QuantKernel f16{"f16", 1, 2, nullptr, 1, 4};
    static const QuantKernel q8_0{"q8_0", 32, 34, "quantize_q8_0_act", 32, 36};
    static const QuantKernel q2_k{"q2_k", 256, 84, "quantize_q8_k", 256, 292};
    static const QuantKernel q4_k{"q4_k", 256, 144, "quantize_q8_k", 256, 292};
    static const QuantKernel iq2_xxs{"iq2_xxs", 256, 66, "quantize_q8_k", 256, 292};
    switch (t) {
        case GgmlType::F32: return &f32;
        case GgmlType::F16: return &f16;
        case GgmlType::Q8_0: return &q8_0;
        case GgmlType::Q2_K: return &q2_k;
        case GgmlType::Q4_K: return &q4_k;
        case GgmlType::IQ2_XXS: return &iq2_xxs;
        default: return nullptr;
    }
}

void metal_op_not_ported(MetalStream& s, Op op) {
    fail(ErrorKind::Unsupported, std::string(s.backend().name()) + ": op " + op_name(op) + " is not ported yet");
}

MetalStream::MetalStream(MetalBackend& be) : be_(be), queue_(be.device().new_queue()) {}

MetalStream::~MetalStream() {
    // Work that references this stream's scratch must finish before it is freed.
    try {
        flush();
    } catch (...) {
    }
}

void MetalStream::reserve(const StreamLimits&) {}

void MetalStream::begin() { ++depth_; }

void MetalStream::end() {
    if (depth_ > 0) --depth_;
    if (depth_ == 0) flush();
}

void MetalStream::flush() {
    queue_->commit();
    dispatched_ = false;
    std::vector<std::unique_ptr<MetalBuffer>> retired = std::move(retired_);
    retired_.clear();
    queue_->wait();   // throws the device's error; the retired buffers are freed either way
}

namespace {

const MetalBuffer& metal_buffer(const Tensor& t, const char* backend) {
    const MetalBuffer* b = dynamic_cast<const MetalBuffer*>(t.buffer);
    if (!b) fail(ErrorKind::InvalidArgument, std::string(backend) + ": a tensor of another backend was passed to an op");
    return *b;
}

void check_range(const Tensor& t, uint64_t bytes, const char* what) {
    if (t.offset + bytes > t.buffer->size()) {
        fail(ErrorKind::InvalidArgument, std::string(what) + ": " + std::to_string(bytes) + " bytes at offset " +
                                             std::to_string(t.offset) + " run past the buffer's " +
                                             std::to_string(t.buffer->size()));
    }
}

}  // namespace

void MetalStream::upload(const Tensor& dst, const void* src, uint64_t bytes) {
    check_range(dst, bytes, "upload");
    const MetalBuffer& b = metal_buffer(dst, be_.name());
    flush();   // queued work may still read (or write) these bytes
    std::memcpy(static_cast<uint8_t*>(b.device().contents()) + dst.offset, src, (size_t)bytes);
}

void MetalStream::download(const Tensor& src, void* dst, uint64_t bytes) {
    check_range(src, bytes, "download");
    const MetalBuffer& b = metal_buffer(src, be_.name());
    flush();   // the values are final only once the queued work is done
    std::memcpy(dst, static_cast<const uint8_t*>(b.device().contents()) + src.offset, (size_t)bytes);
}

Arg MetalStream::arg(const Tensor& t, uint64_t extra) const {
    Arg a;
    a.buffer = &metal_buffer(t, be_.name()).device();
    a.offset = t.offset + extra;
    return a;
}

Arg MetalStream::arg(const TensorRef& w, uint64_t extra) const {
    const WeightLocation loc = be_.locate(w.data, (uint64_t)w.nbytes, w.name);
    Arg a;
    a.buffer = loc.buffer;
    a.offset = loc.offset + extra;
    return a;
}

Arg MetalStream::host_array(const void* p, uint64_t bytes) {
    const uint64_t n = std::max<uint64_t>(bytes, 16);
    auto b = std::make_unique<MetalBuffer>(be_.device().new_buffer(n), n);
    std::memcpy(b->device().contents(), p, (size_t)bytes);
    Arg a;
    a.buffer = &b->device();
    retired_.push_back(std::move(b));   // lives until the batch that reads it is done
    return a;
}

Tensor MetalStream::scratch(const char* slot, DType type, int64_t width, int64_t rows) {
    const uint64_t need = (uint64_t)std::max<int64_t>(width * rows * dtype_size(type), 16);
    std::unique_ptr<MetalBuffer>& b = scratch_[slot];
    if (!b || b->size() < need) {
        const uint64_t n = std::max<uint64_t>(need, b ? b->size() * 3 / 2 : 0);
        if (b) retired_.push_back(std::move(b));   // queued dispatches may still use the old one
        b = std::make_unique<MetalBuffer>(be_.device().new_buffer(n), n);
    }
    Tensor t = tensor_of(b.get(), type, width, rows);
    return t;
}

uint32_t MetalStream::max_threads(const char* kernel, std::initializer_list<FunctionConstant> constants) {
    return be_.device().pipeline(kernel, constants).max_threads_per_threadgroup();
}

uint32_t MetalStream::threads_within(const char* kernel, std::initializer_list<FunctionConstant> constants,
                                     uint32_t want) {
    const Pipeline& p = be_.device().pipeline(kernel, constants);
    const uint32_t width = p.thread_execution_width();
    const uint32_t cap = std::max(p.max_threads_per_threadgroup() / width * width, width);
    return std::min(want, cap);
}

void MetalStream::encode(const char* kernel, std::initializer_list<FunctionConstant> constants,
                         std::initializer_list<Arg> args, std::initializer_list<uint32_t> tg_mem, Size3 grid,
                         Size3 threads, bool grid_is_threads) {
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;   // nothing to do (empty batch / no rows)
    const Pipeline& p = be_.device().pipeline(kernel, constants);
    if ((uint64_t)threads.x * threads.y * threads.z > p.max_threads_per_threadgroup()) {
        fail(ErrorKind::Internal, std::string(be_.name()) + ": " + kernel + ": a threadgroup of " +
                                      std::to_string((uint64_t)threads.x * threads.y * threads.z) +
                                      " threads exceeds the pipeline's maximum of " +
                                      std::to_string(p.max_threads_per_threadgroup()));
    }
    Encoder& enc = queue_->encoder();
    if (dispatched_) enc.barrier();
    enc.set_pipeline(p);
    uint32_t i = 0;
    for (const Arg& a : args) {
        if (a.buffer) enc.set_buffer(i, *a.buffer, a.offset);
        else if (a.bytes) enc.set_bytes(i, a.bytes, a.nbytes);
        ++i;
    }
    i = 0;
    for (uint32_t bytes : tg_mem) enc.set_threadgroup_memory(i++, (bytes + 15) / 16 * 16);
    if (grid_is_threads) enc.dispatch_threads(grid, threads);
    else enc.dispatch_threadgroups(grid, threads);
    dispatched_ = true;
}

void MetalStream::dispatch(const char* kernel, std::initializer_list<FunctionConstant> constants,
                           std::initializer_list<Arg> args, std::initializer_list<uint32_t> tg_mem, Size3 groups,
                           Size3 threads) {
    encode(kernel, constants, args, tg_mem, groups, threads, false);
}

void MetalStream::dispatch_threads(const char* kernel, std::initializer_list<FunctionConstant> constants,
                                   std::initializer_list<Arg> args, std::initializer_list<uint32_t> tg_mem, Size3 grid,
                                   Size3 threads) {
    encode(kernel, constants, args, tg_mem, grid, threads, true);
}

void MetalStream::blit(const Arg& src, const Arg& dst, uint64_t bytes) {
    if (!bytes) return;
    Encoder& enc = queue_->encoder();
    if (dispatched_) enc.barrier();
    enc.copy(*src.buffer, src.offset, *dst.buffer, dst.offset, bytes);
    dispatched_ = true;
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
