#include "model/tensor.h"

#include <sstream>

#include "common/errors.h"

namespace ds4 {

namespace {

std::string dims_str(const std::vector<int64_t>& d) {
    std::ostringstream o;
    o << "[";
    for (size_t i = 0; i < d.size(); ++i) o << (i ? ", " : "") << d[i];
    o << "]";
    return o.str();
}

std::vector<int64_t> trimmed(std::vector<int64_t> d) {
    while (d.size() > 1 && d.back() == 1) d.pop_back();
    return d;
}

}  // namespace

TensorTable::TensorTable(const uint8_t* base, uint64_t file_size, const std::string& file,
                         const std::vector<TensorDesc>& descs)
    : base_(base), size_(file_size), file_(file) {
    for (const TensorDesc& d : descs) {
        if (d.offset > size_ || d.nbytes > size_ - d.offset) {
            std::ostringstream o;
            o << file_ << ": tensor '" << d.name << "' data [" << d.offset << ", " << d.offset + d.nbytes
              << ") lies outside the file (" << size_ << " bytes); the file is truncated or corrupt";
            fail(ErrorKind::ModelFormat, o.str());
        }
        by_name_[d.name] = d;
    }
}

TensorRef TensorTable::get_optional(const std::string& name, std::vector<int64_t> dims,
                                    std::vector<GgmlType> types) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return TensorRef{};
    const TensorDesc& d = it->second;
    if (!is_known_type(d.type)) {
        fail(ErrorKind::Unsupported, file_ + ": tensor '" + name + "' has ggml type " + std::to_string(d.type) +
                                         " which the CPU engine does not support");
    }
    const GgmlType t = (GgmlType)d.type;
    if (!types.empty()) {
        bool ok = false;
        std::string want;
        for (GgmlType w : types) {
            ok = ok || w == t;
            want += std::string(want.empty() ? "" : " or ") + type_traits(w).name;
        }
        if (!ok) {
            fail(ErrorKind::ModelFormat, file_ + ": tensor '" + name + "' has type " + type_traits(t).name +
                                             ", expected " + want);
        }
    }
    if (trimmed(d.dims) != trimmed(dims)) {
        fail(ErrorKind::ModelFormat, file_ + ": tensor '" + name + "' has dims " + dims_str(d.dims) +
                                         ", expected " + dims_str(dims));
    }
    if (dims.size() > 3) fail(ErrorKind::ModelFormat, file_ + ": tensor '" + name + "' has more than 3 dims");
    int64_t n = 1;
    for (int64_t v : dims) n *= v;
    const TypeTraits& tr = type_traits(t);
    if (dims[0] % tr.block_elems != 0) {
        fail(ErrorKind::ModelFormat, file_ + ": tensor '" + name + "' row width " + std::to_string(dims[0]) +
                                         " is not a multiple of the " + tr.name + " block size");
    }
    const int64_t want_bytes = n / tr.block_elems * tr.block_bytes;
    if ((uint64_t)want_bytes > d.nbytes) {
        fail(ErrorKind::ModelFormat, file_ + ": tensor '" + name + "' holds " + std::to_string(d.nbytes) +
                                         " bytes, its type and dims need " + std::to_string(want_bytes));
    }
    if ((t == GgmlType::F32 || t == GgmlType::I32) && d.offset % 4 != 0) {
        fail(ErrorKind::ModelFormat, file_ + ": tensor '" + name + "' data offset " + std::to_string(d.offset) +
                                         " is not 4-byte aligned");
    }
    TensorRef r;
    r.data = base_ + d.offset;
    r.type = t;
    for (size_t i = 0; i < dims.size(); ++i) r.ne[i] = dims[i];
    r.nbytes = want_bytes;
    r.name = &it->first;
    return r;
}

TensorRef TensorTable::get(const std::string& name, std::vector<int64_t> dims, std::vector<GgmlType> types) const {
    TensorRef r = get_optional(name, dims, types);
    if (!r) fail(ErrorKind::ModelFormat, file_ + ": required tensor '" + name + "' is missing");
    return r;
}

}  // namespace ds4
