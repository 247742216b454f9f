// Run-time choice of the SIMD path: what the CPU supports (and the build compiled), the env
// override DS4_SIMD, and the table of row kernels of the active path.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/errors.h"
#include "quant/dot_kernels.h"
#include "quant/simd.h"

#if defined(DS4_ARCH_X86)
#define DS4_HAVE_X86_KERNELS 1
#endif
#if defined(DS4_ARCH_ARM64)
#define DS4_HAVE_NEON_KERNELS 1
#if defined(__linux__)
#include <sys/auxv.h>
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#endif
#endif

namespace ds4 {

using namespace quant;

namespace {

#if defined(DS4_ARCH_ARM64) && defined(DS4_HAVE_NEON_KERNELS)
// dot_neon.cpp is built for armv8.2-a+dotprod+fp16: require SDOT and half-precision SIMD.
bool arm_has_dotprod_fp16() {
#if defined(__linux__)
    const unsigned long hw = getauxval(AT_HWCAP);
    const unsigned long kAsimdHp = 1ul << 10, kAsimdDp = 1ul << 20;  // HWCAP_ASIMDHP, HWCAP_ASIMDDP
    return (hw & kAsimdHp) && (hw & kAsimdDp);
#elif defined(__APPLE__)
    int v = 0;
    size_t len = sizeof(v);
    if (sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &len, nullptr, 0) != 0 || !v) return false;
    v = 0;
    len = sizeof(v);
    return sysctlbyname("hw.optional.arm.FEAT_FP16", &v, &len, nullptr, 0) == 0 && v;
#else
    return false;
#endif
}
#endif

bool cpu_has(SimdPath p) {
#if defined(DS4_ARCH_X86) && defined(DS4_HAVE_X86_KERNELS)
    __builtin_cpu_init();  // idempotent; makes the checks safe even from static initialisers
#endif
    switch (p) {
        case SimdPath::Scalar: return true;
#if defined(DS4_ARCH_X86) && defined(DS4_HAVE_X86_KERNELS)
        case SimdPath::AVX2:
            return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
        case SimdPath::AVX512:
            return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                   __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
        case SimdPath::AVX512VNNI:
            // VBMI too: its IQ2_XXS kernel expands the grid with vpermb / vpmultishiftqb (every
            // CPU with both is Ice Lake / Zen 4 or later; VNNI-only Cascade Lake uses avx512).
            return cpu_has(SimdPath::AVX512) && __builtin_cpu_supports("avx512vnni") &&
                   __builtin_cpu_supports("avx512vbmi");
#endif
#if defined(DS4_ARCH_ARM64) && defined(DS4_HAVE_NEON_KERNELS)
        case SimdPath::NEON: {
            static const bool ok = arm_has_dotprod_fp16();
            return ok;
        }
#endif
        default: return false;
    }
}

const DotKernels& table_of(SimdPath p) {
    switch (p) {
#if defined(DS4_ARCH_X86) && defined(DS4_HAVE_X86_KERNELS)
        case SimdPath::AVX2: return avx2_kernels();
        case SimdPath::AVX512: return avx512_kernels();
        case SimdPath::AVX512VNNI: return avx512vnni_kernels();
#endif
#if defined(DS4_ARCH_ARM64) && defined(DS4_HAVE_NEON_KERNELS)
        case SimdPath::NEON: return neon_kernels();
#endif
        default: return scalar_kernels();
    }
}

SimdPath best_path() {
    SimdPath best = SimdPath::Scalar;
    for (SimdPath p : available_simd_paths()) best = p;  // listed from slowest to fastest
    return best;
}

SimdPath initial_path() {
    const char* env = std::getenv("DS4_SIMD");
    if (env && *env) {
        for (SimdPath p : available_simd_paths()) {
            if (std::strcmp(env, simd_path_name(p)) == 0) return p;
        }
        // An unknown or unavailable request falls back to the best path rather than failing at
        // import; simd_path() tells the caller what is actually running.
    }
    return best_path();
}

struct Active {
    std::atomic<int> path;
    std::atomic<const DotKernels*> table;
    Active() {
        const SimdPath p = initial_path();
        path.store((int)p);
        table.store(&table_of(p));
    }
};

Active& active() {
    static Active a;
    return a;
}

}  // namespace

const char* simd_path_name(SimdPath p) {
    switch (p) {
        case SimdPath::Scalar: return "scalar";
        case SimdPath::AVX2: return "avx2";
        case SimdPath::AVX512: return "avx512";
        case SimdPath::AVX512VNNI: return "avx512vnni";
        case SimdPath::NEON: return "neon";
    }
    return "unknown";
}

std::vector<SimdPath> available_simd_paths() {
    std::vector<SimdPath> out;
    for (SimdPath p : {SimdPath::Scalar, SimdPath::NEON, SimdPath::AVX2, SimdPath::AVX512, SimdPath::AVX512VNNI}) {
        if (cpu_has(p)) out.push_back(p);
    }
    return out;
}

SimdPath simd_path() { return (SimdPath)active().path.load(); }

void set_simd_path(SimdPath p) {
    if (!cpu_has(p)) {
        std::string avail;
        for (SimdPath q : available_simd_paths()) avail += std::string(avail.empty() ? "" : ", ") + simd_path_name(q);
        fail(ErrorKind::Unsupported, std::string("SIMD path '") + simd_path_name(p) +
                                         "' is not available on this CPU/build (available: " + avail + ")");
    }
    active().table.store(&table_of(p));
    active().path.store((int)p);
}

namespace quant {

const DotKernels& active_kernels() { return *active().table.load(std::memory_order_relaxed); }

DotFn dot_fn(const DotKernels& k, GgmlType t) {
    switch (t) {
        case GgmlType::F32: return k.f32;
        case GgmlType::F16: return k.f16;
        case GgmlType::BF16: return k.bf16;
        case GgmlType::Q8_0: return k.q8_0;
        case GgmlType::Q2_K: return k.q2_k;
        case GgmlType::Q4_K: return k.q4_k;
        case GgmlType::IQ2_XXS: return k.iq2_xxs;
        default: break;
    }
    fail(ErrorKind::Unsupported,
         std::string("type ") + type_traits(t).name + " has no CPU dot kernel (not a weight type)");
}

DotNFn dot_n_fn(const DotKernels& k, GgmlType t) {
    switch (t) {
        case GgmlType::Q8_0: return k.q8_0_n;
        case GgmlType::Q2_K: return k.q2_k_n;
        case GgmlType::Q4_K: return k.q4_k_n;
        case GgmlType::IQ2_XXS: return k.iq2_xxs_n;
        default: return nullptr;
    }
}

PreparedDot prepared_dot(const DotKernels& k, GgmlType t) {
    return t == GgmlType::Q8_0 ? k.q8_0_prep : PreparedDot{};
}

PreparedDot prepared_vec_dot(const DotKernels& k, GgmlType t) {
    if (t == GgmlType::Q8_0 && k.q8_0_vec_prep.dot) return k.q8_0_vec_prep;
    return prepared_dot(k, t);
}

DotRowsFn dot_rows_fn(const DotKernels& k, GgmlType t) {
    return t == GgmlType::Q2_K ? k.q2_k_rows : t == GgmlType::IQ2_XXS ? k.iq2_xxs_rows : nullptr;
}

}  // namespace quant

}  // namespace ds4
