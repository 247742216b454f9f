// The GGML tensor types the core understands, their block sizes and the activation block layouts
// (format facts shared by every backend).
#pragma once
#include <cstdint>

namespace ds4 {

enum class GgmlType : uint32_t {
    F32 = 0, F16 = 1, Q8_0 = 8, Q2_K = 10, Q4_K = 12, Q8_K = 15, IQ2_XXS = 16, I32 = 26, BF16 = 30,
};

struct TypeTraits {
    const char* name;
    int64_t block_elems;   // elements per block (1 for plain types)
    int64_t block_bytes;   // bytes per block
};

bool is_known_type(uint32_t t) noexcept;
const TypeTraits& type_traits(GgmlType t);                 // throws Unsupported for unknown types
int64_t row_bytes(GgmlType t, int64_t n_elems);            // throws InvalidArgument if n % block != 0

struct BlockQ8_0Act { float d; int8_t qs[32]; };
struct BlockQ8K { float d; int8_t qs[256]; int16_t bsums[16]; };
static_assert(sizeof(BlockQ8K) == 292, "Q8_K block layout");

}  // namespace ds4
