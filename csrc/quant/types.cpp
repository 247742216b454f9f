// Type traits of the GGML tensor types the core understands (block sizes are format facts).
#include <string>

#include "common/errors.h"
#include "quant/kernels.h"

namespace ds4 {

namespace {

const TypeTraits kF32{"F32", 1, 4};
const TypeTraits kF16{"F16", 1, 2};
const TypeTraits kQ8_0{"Q8_0", 32, 34};
const TypeTraits kQ2_K{"Q2_K", 256, 84};
const TypeTraits kQ4_K{"Q4_K", 256, 144};
const TypeTraits kQ8_K{"Q8_K", 256, 292};
const TypeTraits kIQ2_XXS{"IQ2_XXS", 256, 66};
const TypeTraits kI32{"I32", 1, 4};
const TypeTraits kBF16{"BF16", 1, 2};

const TypeTraits* lookup(uint32_t t) noexcept {
    switch (static_cast<GgmlType>(t)) {
        case GgmlType::F32: return &kF32;
        case GgmlType::F16: return &kF16;
        case GgmlType::Q8_0: return &kQ8_0;
        case GgmlType::Q2_K: return &kQ2_K;
        case GgmlType::Q4_K: return &kQ4_K;
        case GgmlType::Q8_K: return &kQ8_K;
        case GgmlType::IQ2_XXS: return &kIQ2_XXS;
        case GgmlType::I32: return &kI32;
        case GgmlType::BF16: return &kBF16;
    }
    return nullptr;
}

}  // namespace

bool is_known_type(uint32_t t) noexcept { return lookup(t) != nullptr; }

const TypeTraits& type_traits(GgmlType t) {
    const TypeTraits* tr = lookup(static_cast<uint32_t>(t));
    if (!tr) {
        fail(ErrorKind::Unsupported,
             "unsupported GGML tensor type " + std::to_string(static_cast<uint32_t>(t)) +
                 " (known: F32=0, F16=1, Q8_0=8, Q2_K=10, Q4_K=12, Q8_K=15, IQ2_XXS=16, I32=26, BF16=30)");
    }
    return *tr;
}

int64_t row_bytes(GgmlType t, int64_t n_elems) {
    const TypeTraits& tr = type_traits(t);
    if (n_elems < 0 || n_elems % tr.block_elems != 0) {
        fail(ErrorKind::InvalidArgument, std::string(tr.name) + " row of " + std::to_string(n_elems) +
                                             " elements: expected a non-negative multiple of the block size " +
                                             std::to_string(tr.block_elems));
    }
    return n_elems / tr.block_elems * tr.block_bytes;
}

}  // namespace ds4
