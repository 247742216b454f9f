// MSL as C++17: the subset of the Metal Shading Language our kernels use, for clang on a CPU.
//
// The emulator build force-includes this header in front of every metal/*.metal file (whose
// `#include <metal_stdlib>` line the loader blanks). Address-space qualifiers are erased, `half`
// is _Float16 (compiled with -ffloat16-excess-precision=none so every half operation rounds like
// the GPU's), vectors have Metal's sizes and alignments (float3 is 16 bytes, half4 is 8), and the
// synchronising operations call the SIMT runtime (simt.h), which runs each GPU thread on a fiber.
// Every synchronising call records its source line through __builtin_FILE/LINE default arguments
// so a divergence fault names the kernel's line.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "simt.h"

// ---- address spaces and stages: no meaning on a CPU --------------------------------------------
// `threadgroup` is erased too; threadgroup memory must therefore be a [[threadgroup(i)]] kernel
// argument (the loader rejects `threadgroup T x[N];` declarations inside kernel bodies, which would
// silently become one private copy per thread here).
#define kernel
#define device
#define constant
#define thread
#define threadgroup

typedef _Float16 half;
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

// MSL's half literal suffix: 1.0h.
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wuser-defined-literals"
constexpr half operator""h(long double v) { return (half)v; }
constexpr half operator""h(unsigned long long v) { return (half)v; }
#pragma clang diagnostic pop

namespace metal {

// ---- vectors ---------------------------------------------------------------------------------
template <class T, int N> struct vstore;
template <class T> struct alignas(2 * sizeof(T)) vstore<T, 2> { union { T e[2]; struct { T x, y; }; }; };
template <class T> struct alignas(4 * sizeof(T)) vstore<T, 3> { union { T e[3]; struct { T x, y, z; }; }; };
template <class T> struct alignas(4 * sizeof(T)) vstore<T, 4> { union { T e[4]; struct { T x, y, z, w; }; }; };

template <class T, int N>
struct vec : vstore<T, N> {
    using value_type = T;
    static constexpr int size = N;
    vec() { for (int i = 0; i < N; ++i) this->e[i] = T(0); }
    // Scalars convert implicitly (splat), as in MSL.
    template <class U, class = std::enable_if_t<std::is_arithmetic<U>::value || std::is_same<U, half>::value>>
    vec(U s) { for (int i = 0; i < N; ++i) this->e[i] = T(s); }
    template <class... A, class = std::enable_if_t<sizeof...(A) == N && (N > 1)>>
    vec(A... a) { T v[N] = {T(a)...}; for (int i = 0; i < N; ++i) this->e[i] = v[i]; }
    // Other element types convert explicitly only (MSL has no implicit vector conversions).
    template <class U>
    explicit vec(const vec<U, N>& o) { for (int i = 0; i < N; ++i) this->e[i] = T(o.e[i]); }
    // Concatenations MSL allows: float4(float2, float2), float4(float3, float), float3(float2, float), ...
    template <int M, class... A, class = std::enable_if_t<(M < N) && (M + sizeof...(A) == N)>>
    vec(const vec<T, M>& head, A... tail) {
        T v[N - M] = {T(tail)...};
        for (int i = 0; i < M; ++i) this->e[i] = head.e[i];
        for (int i = M; i < N; ++i) this->e[i] = v[i - M];
    }
    template <int M = N, class = std::enable_if_t<M == 4>>
    vec(const vec<T, 2>& a, const vec<T, 2>& b) {
        this->e[0] = a.e[0]; this->e[1] = a.e[1]; this->e[2] = b.e[0]; this->e[3] = b.e[1];
    }
    vec(const vec&) = default;
    vec& operator=(const vec&) = default;
    T& operator[](int i) { return this->e[i]; }
    const T& operator[](int i) const { return this->e[i]; }
    vec<T, 2> xy() const { return vec<T, 2>(this->e[0], this->e[1]); }
};

template <class T> struct is_vec : std::false_type {};
template <class T, int N> struct is_vec<vec<T, N>> : std::true_type {};
template <class U> using scalar_ok = std::enable_if_t<std::is_arithmetic<U>::value || std::is_same<U, half>::value, int>;

#define DS4EMU_VEC_BINOP(OP)                                                                         \
    template <class T, int N> vec<T, N> operator OP(const vec<T, N>& a, const vec<T, N>& b) {         \
        vec<T, N> r; for (int i = 0; i < N; ++i) r.e[i] = T(a.e[i] OP b.e[i]); return r; }           \
    template <class T, int N, class U, scalar_ok<U> = 0> vec<T, N> operator OP(const vec<T, N>& a, U s) { \
        vec<T, N> r; for (int i = 0; i < N; ++i) r.e[i] = T(a.e[i] OP T(s)); return r; }             \
    template <class T, int N, class U, scalar_ok<U> = 0> vec<T, N> operator OP(U s, const vec<T, N>& a) { \
        vec<T, N> r; for (int i = 0; i < N; ++i) r.e[i] = T(T(s) OP a.e[i]); return r; }             \
    template <class T, int N, class U> vec<T, N>& operator OP##=(vec<T, N>& a, const U& b) {          \
        a = a OP b; return a; }
DS4EMU_VEC_BINOP(+)
DS4EMU_VEC_BINOP(-)
DS4EMU_VEC_BINOP(*)
DS4EMU_VEC_BINOP(/)
DS4EMU_VEC_BINOP(&)
DS4EMU_VEC_BINOP(|)
DS4EMU_VEC_BINOP(^)
DS4EMU_VEC_BINOP(<<)
DS4EMU_VEC_BINOP(>>)
#undef DS4EMU_VEC_BINOP

template <class T, int N> vec<T, N> operator-(const vec<T, N>& a) {
    vec<T, N> r; for (int i = 0; i < N; ++i) r.e[i] = -a.e[i]; return r;
}

#define DS4EMU_VEC_CMP(OP)                                                                           \
    template <class T, int N> vec<bool, N> operator OP(const vec<T, N>& a, const vec<T, N>& b) {      \
        vec<bool, N> r; for (int i = 0; i < N; ++i) r.e[i] = a.e[i] OP b.e[i]; return r; }            \
    template <class T, int N, class U, scalar_ok<U> = 0> vec<bool, N> operator OP(const vec<T, N>& a, U s) { \
        vec<bool, N> r; for (int i = 0; i < N; ++i) r.e[i] = a.e[i] OP T(s); return r; }              \
    template <class T, int N, class U, scalar_ok<U> = 0> vec<bool, N> operator OP(U s, const vec<T, N>& a) { \
        vec<bool, N> r; for (int i = 0; i < N; ++i) r.e[i] = T(s) OP a.e[i]; return r; }
DS4EMU_VEC_CMP(<)
DS4EMU_VEC_CMP(>)
DS4EMU_VEC_CMP(<=)
DS4EMU_VEC_CMP(>=)
DS4EMU_VEC_CMP(==)
DS4EMU_VEC_CMP(!=)
#undef DS4EMU_VEC_CMP

template <int N> bool all(const vec<bool, N>& v) { for (int i = 0; i < N; ++i) if (!v.e[i]) return false; return true; }
template <int N> bool any(const vec<bool, N>& v) { for (int i = 0; i < N; ++i) if (v.e[i]) return true; return false; }

// ---- matrices (column-major, columns of vec<T, R>) ---------------------------------------------
template <class T, int C, int R>
struct mat {
    vec<T, R> columns[C];
    vec<T, R>& operator[](int c) { return columns[c]; }
    const vec<T, R>& operator[](int c) const { return columns[c]; }
};
template <class T, int C, int R> vec<T, R> operator*(const mat<T, C, R>& m, const vec<T, C>& v) {
    vec<T, R> r(T(0));
    for (int c = 0; c < C; ++c) r = r + m.columns[c] * v.e[c];
    return r;
}

// ---- math ------------------------------------------------------------------------------------
// The float/double overloads are the C library's own (brought in by name, so an unqualified call
// in a kernel that says `using namespace metal;` is never ambiguous); half runs in float and
// rounds once; vectors apply element-wise.
using std::exp; using std::exp2; using std::log; using std::log2; using std::sqrt; using std::fabs;
using std::floor; using std::ceil; using std::round; using std::rint; using std::trunc; using std::pow;
using std::tanh; using std::sin; using std::cos; using std::fma; using std::copysign; using std::ldexp;
using std::isnan; using std::isinf; using std::isfinite; using std::fmax; using std::fmin; using std::abs;
using std::log1p; using std::expm1; using std::signbit;

#define DS4EMU_UNARY(NAME, EXPR)                                                                     \
    inline half NAME(half x) { return (half)(EXPR((float)x)); }                                      \
    template <class T, int N> vec<T, N> NAME(const vec<T, N>& v) {                                    \
        vec<T, N> r; for (int i = 0; i < N; ++i) r.e[i] = NAME(v.e[i]); return r; }
DS4EMU_UNARY(exp, std::exp)
DS4EMU_UNARY(exp2, std::exp2)
DS4EMU_UNARY(log, std::log)
DS4EMU_UNARY(log2, std::log2)
DS4EMU_UNARY(sqrt, std::sqrt)
DS4EMU_UNARY(fabs, std::fabs)
DS4EMU_UNARY(floor, std::floor)
DS4EMU_UNARY(ceil, std::ceil)
DS4EMU_UNARY(round, std::round)
DS4EMU_UNARY(rint, std::rint)
DS4EMU_UNARY(trunc, std::trunc)
DS4EMU_UNARY(tanh, std::tanh)
DS4EMU_UNARY(sin, std::sin)
DS4EMU_UNARY(cos, std::cos)
#undef DS4EMU_UNARY

inline half abs(half x) { return (half)std::fabs((float)x); }
template <class T, int N> vec<T, N> abs(const vec<T, N>& v) {
    vec<T, N> r; for (int i = 0; i < N; ++i) r.e[i] = abs(v.e[i]); return r;
}
inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline half rsqrt(half x) { return (half)(1.0f / std::sqrt((float)x)); }
template <class T, int N> vec<T, N> rsqrt(const vec<T, N>& v) {
    vec<T, N> r; for (int i = 0; i < N; ++i) r.e[i] = rsqrt(v.e[i]); return r;
}

// max/min: MSL's are fmax/fmin for floating point (a NaN operand yields the other one).
template <class T, std::enable_if_t<std::is_integral<T>::value, int> = 0> T max(T a, T b) { return a > b ? a : b; }
template <class T, std::enable_if_t<std::is_integral<T>::value, int> = 0> T min(T a, T b) { return a < b ? a : b; }
inline float max(float a, float b) { return std::fmax(a, b); }
inline float min(float a, float b) { return std::fmin(a, b); }
inline half max(half a, half b) { return (half)std::fmax((float)a, (float)b); }
inline half min(half a, half b) { return (half)std::fmin((float)a, (float)b); }
inline half fmax(half a, half b) { return max(a, b); }
inline half fmin(half a, half b) { return min(a, b); }
template <class T, int N> vec<T, N> max(const vec<T, N>& a, const vec<T, N>& b) {
    vec<T, N> r; for (int i = 0; i < N; ++i) r.e[i] = max(a.e[i], b.e[i]); return r;
}
template <class T, int N> vec<T, N> min(const vec<T, N>& a, const vec<T, N>& b) {
    vec<T, N> r; for (int i = 0; i < N; ++i) r.e[i] = min(a.e[i], b.e[i]); return r;
}
template <class T> T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
template <class T> T saturate(T x) { return clamp(x, T(0), T(1)); }
template <class T> T mix(T a, T b, T t) { return a + (b - a) * t; }
template <class T> T select(T a, T b, bool c) { return c ? b : a; }
template <class T, int N> vec<T, N> select(const vec<T, N>& a, const vec<T, N>& b, const vec<bool, N>& c) {
    vec<T, N> r; for (int i = 0; i < N; ++i) r.e[i] = c.e[i] ? b.e[i] : a.e[i]; return r;
}
inline half pow(half a, half b) { return (half)std::pow((float)a, (float)b); }
inline float powr(float a, float b) { return std::pow(a, b); }
inline float fract(float x) { return x - std::floor(x); }
inline float sign(float x) { return x > 0 ? 1.0f : x < 0 ? -1.0f : x; }
inline float precise_divide(float a, float b) { return a / b; }

template <class T, int N> T dot(const vec<T, N>& a, const vec<T, N>& b) {
    T s = a.e[0] * b.e[0];
    for (int i = 1; i < N; ++i) s += a.e[i] * b.e[i];
    return s;
}
inline float dot(float a, float b) { return a * b; }
template <class T, int N> T length(const vec<T, N>& a) { return sqrt(dot(a, a)); }

namespace precise {
using std::exp; using std::log; using std::sqrt; using std::tanh; using std::exp2; using std::log2;
inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline float divide(float a, float b) { return a / b; }
}  // namespace precise
namespace fast {
using std::exp; using std::log; using std::sqrt; using std::tanh; using std::exp2; using std::log2;
inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline float divide(float a, float b) { return a / b; }
}  // namespace fast

// Integer bit functions.
inline uint clz(uint x) { return x ? (uint)__builtin_clz(x) : 32u; }
inline uint ctz(uint x) { return x ? (uint)__builtin_ctz(x) : 32u; }
inline uint popcount(uint x) { return (uint)__builtin_popcount(x); }

// Bit casts between same-sized types.
template <class To, class From> To as_type(const From& v) {
    static_assert(sizeof(To) == sizeof(From), "as_type needs types of the same size");
    To r;
    std::memcpy(&r, &v, sizeof r);
    return r;
}

// ---- synchronisation -------------------------------------------------------------------------
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }

inline void threadgroup_barrier(mem_flags, const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
    ds4emu::barrier(file, line);
}
inline void simdgroup_barrier(mem_flags, const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
    const char nothing = 0;
    ds4emu::simd_exchange("simdgroup_barrier", &nothing, 1, file, line);
}

namespace detail {
template <class T> const T& slot(const ds4emu::Exchange& ex, uint32_t lane) {
    static_assert(sizeof(T) <= ds4emu::kExchangeBytes, "value too large for a simd collective");
    return *reinterpret_cast<const T*>(ex.slot[lane]);
}
template <class T> const ds4emu::Exchange& exchange(const char* op, const T& v, const char* f, unsigned l) {
    return ds4emu::simd_exchange(op, &v, sizeof(T), f, l);
}
// Reduction over the lanes that took part, as a fixed pairwise tree (lane i with lane i+16, then
// i+8, ...): every lane computes the same value from the same slots, whatever the fiber order.
template <class T, class Op> T reduce(const ds4emu::Exchange& ex, T identity, Op op) {
    T v[ds4emu::kSimdWidth];
    for (uint32_t i = 0; i < ds4emu::kSimdWidth; ++i) v[i] = ((ex.active >> i) & 1u) ? slot<T>(ex, i) : identity;
    for (uint32_t off = ds4emu::kSimdWidth / 2; off > 0; off >>= 1) {
        for (uint32_t i = 0; i < off; ++i) v[i] = op(v[i], v[i + off]);
    }
    return v[0];
}
template <class T> T lowest() {
    if constexpr (std::is_floating_point<T>::value || std::is_same<T, half>::value) return T(-INFINITY);
    else return std::numeric_limits<T>::lowest();
}
template <class T> T highest() {
    if constexpr (std::is_floating_point<T>::value || std::is_same<T, half>::value) return T(INFINITY);
    else return std::numeric_limits<T>::max();
}
}  // namespace detail

#define DS4EMU_SITE const char *file = __builtin_FILE(), unsigned line = __builtin_LINE()

template <class T> T simd_sum(T x, DS4EMU_SITE) {
    const auto& ex = detail::exchange("simd_sum", x, file, line);
    return detail::reduce<T>(ex, T(0), [](T a, T b) { return T(a + b); });
}
template <class T> T simd_max(T x, DS4EMU_SITE) {
    const auto& ex = detail::exchange("simd_max", x, file, line);
    return detail::reduce<T>(ex, detail::lowest<T>(), [](T a, T b) { return max(a, b); });
}
template <class T> T simd_min(T x, DS4EMU_SITE) {
    const auto& ex = detail::exchange("simd_min", x, file, line);
    return detail::reduce<T>(ex, detail::highest<T>(), [](T a, T b) { return min(a, b); });
}
// Lane `src`'s value; a lane that did not take part yields NaN bytes.
template <class T> T simd_shuffle(T x, ushort src, DS4EMU_SITE) {
    const auto& ex = detail::exchange("simd_shuffle", x, file, line);
    return detail::slot<T>(ex, src % ds4emu::kSimdWidth);
}
template <class T> T simd_broadcast(T x, ushort src, DS4EMU_SITE) {
    const auto& ex = detail::exchange("simd_broadcast", x, file, line);
    return detail::slot<T>(ex, src % ds4emu::kSimdWidth);
}
template <class T> T simd_broadcast_first(T x, DS4EMU_SITE) {
    const auto& ex = detail::exchange("simd_broadcast_first", x, file, line);
    return detail::slot<T>(ex, ex.active ? (uint32_t)__builtin_ctz(ex.active) : 0u);
}
// Lanes whose source falls outside the simdgroup keep their own value.
template <class T> T simd_shuffle_down(T x, ushort delta, DS4EMU_SITE) {
    const uint32_t lane = ds4emu::current_lane();
    const auto& ex = detail::exchange("simd_shuffle_down", x, file, line);
    return lane + delta < ds4emu::kSimdWidth ? detail::slot<T>(ex, lane + delta) : x;
}
template <class T> T simd_shuffle_up(T x, ushort delta, DS4EMU_SITE) {
    const uint32_t lane = ds4emu::current_lane();
    const auto& ex = detail::exchange("simd_shuffle_up", x, file, line);
    return lane >= delta ? detail::slot<T>(ex, lane - delta) : x;
}
template <class T> T simd_shuffle_xor(T x, ushort mask, DS4EMU_SITE) {
    const uint32_t lane = ds4emu::current_lane();
    const auto& ex = detail::exchange("simd_shuffle_xor", x, file, line);
    return detail::slot<T>(ex, (lane ^ mask) % ds4emu::kSimdWidth);
}
template <class T> T simd_prefix_exclusive_sum(T x, DS4EMU_SITE) {
    const uint32_t lane = ds4emu::current_lane();
    const auto& ex = detail::exchange("simd_prefix_exclusive_sum", x, file, line);
    T s = T(0);
    for (uint32_t i = 0; i < lane; ++i) if ((ex.active >> i) & 1u) s += detail::slot<T>(ex, i);
    return s;
}
inline bool simd_any(bool b, DS4EMU_SITE) {
    const auto& ex = detail::exchange("simd_any", b, file, line);
    for (uint32_t i = 0; i < ds4emu::kSimdWidth; ++i) if (((ex.active >> i) & 1u) && detail::slot<bool>(ex, i)) return true;
    return false;
}
inline bool simd_all(bool b, DS4EMU_SITE) {
    const auto& ex = detail::exchange("simd_all", b, file, line);
    for (uint32_t i = 0; i < ds4emu::kSimdWidth; ++i) if (((ex.active >> i) & 1u) && !detail::slot<bool>(ex, i)) return false;
    return true;
}

// ---- simdgroup_matrix (8x8) ------------------------------------------------------------------
// The hardware executes these as one instruction of the whole simdgroup (lanes in lock step).
// Here: a load is one collective after which the first lane resumed reads the matrix for all
// (memory as of the moment every lane arrived) and every lane keeps a full copy; a
// multiply-accumulate computes only the two elements the lane owns (elements 2*lane and
// 2*lane+1, row-major), leaving the others NaN, so the multiply costs each lane 1/32 of the work;
// a store, or a product used again as a multiply operand, first gathers the owned elements from
// every lane through one collective. A store then writes the whole matrix once. Two simdgroups
// storing to one place without a barrier still race visibly under different thread orders.
template <class T, int R, int C>
struct simdgroup_matrix {
    static_assert(R * C == 2 * ds4emu::kSimdWidth, "8x8 simdgroup matrices: two elements per lane");
    T m[R][C];              // row-major: m[row][col]
    bool distributed = false;  // true: only this lane's two elements are valid
    simdgroup_matrix() { for (int r = 0; r < R; ++r) for (int c = 0; c < C; ++c) m[r][c] = T(0); }
    explicit simdgroup_matrix(T v) { for (int r = 0; r < R; ++r) for (int c = 0; c < C; ++c) m[r][c] = v; }
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;

template <class T, int R, int C> simdgroup_matrix<T, R, C> make_filled_simdgroup_matrix(T v) {
    return simdgroup_matrix<T, R, C>(v);
}

namespace detail {
// Every lane contributes its two owned elements; each gets the full matrix back.
template <class T, int R, int C>
simdgroup_matrix<T, R, C> gather(const simdgroup_matrix<T, R, C>& a, const ds4emu::Exchange*& ex_out,
                                 const char* op, const char* file, unsigned line) {
    const uint32_t lane = ds4emu::current_lane();
    T own[2] = {a.m[(2 * lane) / C][(2 * lane) % C], a.m[(2 * lane + 1) / C][(2 * lane + 1) % C]};
    const ds4emu::Exchange& ex = ds4emu::simd_exchange(op, own, sizeof own, file, line);
    simdgroup_matrix<T, R, C> full;
    for (uint32_t l = 0; l < ds4emu::kSimdWidth; ++l) {
        const T* v = reinterpret_cast<const T*>(ex.slot[l]);
        full.m[(2 * l) / C][(2 * l) % C] = v[0];
        full.m[(2 * l + 1) / C][(2 * l + 1) % C] = v[1];
    }
    ex_out = &ex;
    return full;
}
}  // namespace detail

// origin = (column, row) of the block's first element, as in MSL's ulong2 origin.
template <class T, class S, int R, int C>
void simdgroup_load(simdgroup_matrix<T, R, C>& d, const S* src, ulong elements_per_row = C,
                    vec<ulong, 2> origin = vec<ulong, 2>(0, 0), bool transpose = false, DS4EMU_SITE) {
    static_assert(sizeof(T) * R * C <= sizeof(ds4emu::Exchange::shared), "matrix too large");
    const char nothing = 0;
    const ds4emu::Exchange& ex = ds4emu::simd_exchange("simdgroup_load", &nothing, 1, file, line);
    T* snap = reinterpret_cast<T*>(ex.shared);
    if (!ex.shared_ready) {
        const S* base = src + origin.y * elements_per_row + origin.x;
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < C; ++c)
                snap[r * C + c] = transpose ? T(base[(ulong)c * elements_per_row + r]) : T(base[(ulong)r * elements_per_row + c]);
        ex.shared_ready = true;
    }
    std::memcpy(d.m, snap, sizeof d.m);
    d.distributed = false;
}

template <class T, class S, int R, int C>
void simdgroup_store(const simdgroup_matrix<T, R, C>& a, S* dst, ulong elements_per_row = C,
                     vec<ulong, 2> origin = vec<ulong, 2>(0, 0), bool transpose = false, DS4EMU_SITE) {
    const ds4emu::Exchange* ex = nullptr;
    const simdgroup_matrix<T, R, C> full = detail::gather(a, ex, "simdgroup_store", file, line);
    if (!ex->shared_ready) {
        S* base = dst + origin.y * elements_per_row + origin.x;
        for (uint32_t l = 0; l < ds4emu::kSimdWidth; ++l) {
            if (!((ex->active >> l) & 1u)) continue;  // a lane that is not there stores nothing
            for (uint32_t k = 2 * l; k < 2 * l + 2; ++k) {
                const int r = (int)k / C, c = (int)k % C;
                if (transpose) base[(ulong)c * elements_per_row + r] = S(full.m[r][c]);
                else base[(ulong)r * elements_per_row + c] = S(full.m[r][c]);
            }
        }
        ex->shared_ready = true;
    }
}

// d = a*b + c. Each element sums its eight products in k order in float, starting from c (the
// hardware's order and any fusion are unknown: tests compare with a tolerance), rounded once to
// the result type. Only the calling lane's two elements are computed.
template <class T, class TA, class TB, class TC, int M, int K, int N>
void simdgroup_multiply_accumulate(simdgroup_matrix<T, M, N>& d, const simdgroup_matrix<TA, M, K>& a,
                                   const simdgroup_matrix<TB, K, N>& b, const simdgroup_matrix<TC, M, N>& c,
                                   DS4EMU_SITE) {
    const ds4emu::Exchange* ex = nullptr;
    const simdgroup_matrix<TA, M, K> A = a.distributed ? detail::gather(a, ex, "simdgroup_multiply_accumulate", file, line) : a;
    const simdgroup_matrix<TB, K, N> B = b.distributed ? detail::gather(b, ex, "simdgroup_multiply_accumulate", file, line) : b;
    const uint32_t lane = ds4emu::current_lane();
    simdgroup_matrix<T, M, N> r(T(NAN));
    for (uint32_t k = 2 * lane; k < 2 * lane + 2; ++k) {
        const int i = (int)k / N, j = (int)k % N;
        float s = (float)c.m[i][j];
        for (int q = 0; q < K; ++q) s += (float)A.m[i][q] * (float)B.m[q][j];
        r.m[i][j] = T(s);
    }
    r.distributed = true;
    d = r;
}
template <class T, class TA, class TB, int M, int K, int N>
void simdgroup_multiply(simdgroup_matrix<T, M, N>& d, const simdgroup_matrix<TA, M, K>& a,
                        const simdgroup_matrix<TB, K, N>& b, DS4EMU_SITE) {
    simdgroup_multiply_accumulate(d, a, b, simdgroup_matrix<T, M, N>(), file, line);
}

#undef DS4EMU_SITE

}  // namespace metal

// Vector type names (MSL has them in namespace metal and at file scope via its headers).
#define DS4EMU_VEC_NAMES(T, NAME)                                                                    \
    typedef metal::vec<T, 2> NAME##2; typedef metal::vec<T, 3> NAME##3; typedef metal::vec<T, 4> NAME##4;
DS4EMU_VEC_NAMES(float, float)
DS4EMU_VEC_NAMES(half, half)
DS4EMU_VEC_NAMES(int, int)
DS4EMU_VEC_NAMES(uint, uint)
DS4EMU_VEC_NAMES(short, short)
DS4EMU_VEC_NAMES(ushort, ushort)
DS4EMU_VEC_NAMES(char, char)
DS4EMU_VEC_NAMES(uchar, uchar)
DS4EMU_VEC_NAMES(bool, bool)
DS4EMU_VEC_NAMES(ulong, ulong)
#undef DS4EMU_VEC_NAMES
typedef metal::mat<float, 2, 2> float2x2;
typedef metal::mat<float, 3, 3> float3x3;
typedef metal::mat<float, 4, 4> float4x4;

static_assert(sizeof(float3) == 16 && alignof(float3) == 16, "Metal float3 is 16 bytes");
static_assert(sizeof(float4) == 16 && alignof(float4) == 16, "Metal float4 is 16 bytes");
static_assert(sizeof(half4) == 8 && alignof(half4) == 8, "Metal half4 is 8 bytes");
static_assert(sizeof(half3) == 8, "Metal half3 is 8 bytes");
static_assert(sizeof(uint2) == 8 && alignof(uint2) == 8, "Metal uint2 is 8 bytes");

// ---- glue for the generated thunks ---------------------------------------------------------------
namespace ds4emu {
// A [[buffer(i)]] argument: pointers are cast, references and by-value structs read in place.
template <class P> struct BindBuffer {
    static P get(void* p) { return *reinterpret_cast<std::remove_reference_t<P>*>(p); }
};
template <class T> struct BindBuffer<T*> {
    static T* get(void* p) { return reinterpret_cast<T*>(p); }
};
template <class T> struct BindBuffer<T&> {
    static T& get(void* p) { return *reinterpret_cast<T*>(p); }
};
template <class P> decltype(auto) bind_buffer(void* p) { return BindBuffer<P>::get(p); }

// A built-in position: scalar types take .x, 2- and 3-vectors the leading components.
template <class T> struct BindIds {
    static T get(const U3& v) { return T(v.x); }
};
template <class E> struct BindIds<metal::vec<E, 2>> {
    static metal::vec<E, 2> get(const U3& v) { return metal::vec<E, 2>(E(v.x), E(v.y)); }
};
template <class E> struct BindIds<metal::vec<E, 3>> {
    static metal::vec<E, 3> get(const U3& v) { return metal::vec<E, 3>(E(v.x), E(v.y), E(v.z)); }
};
template <class T> T bind_id(const U3& v) { return BindIds<std::remove_cv_t<T>>::get(v); }
template <class T> T bind_id(uint32_t v) { return T(v); }
}  // namespace ds4emu
