// The SIMT runtime's interface to the MSL shim (msl_emu.h) and to the generated thunks.
//
// One GPU thread = one fiber. The shim's synchronising operations (threadgroup_barrier, simd_*
// collectives, simdgroup_matrix load/store) call into the runtime, which parks the fiber until
// every live thread that must take part has reached the same operation at the same source line.
// Nothing here is Metal API: it is the emulator's own plumbing.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ds4emu {

constexpr uint32_t kSimdWidth = 32;
constexpr size_t kExchangeBytes = 64;  // largest value one lane can hand to a collective

struct U3 { uint32_t x, y, z; };

// Built-in thread positions of one thread (Metal's [[...]] attributes), filled by the scheduler.
struct ThreadIds {
    U3 thread_position_in_grid;
    U3 thread_position_in_threadgroup;
    U3 threadgroup_position_in_grid;
    U3 threads_per_threadgroup;           // this group's (possibly partial) size
    U3 dispatch_threads_per_threadgroup;  // the requested size
    U3 threadgroups_per_grid;
    U3 threads_per_grid;
    uint32_t thread_index_in_threadgroup;
    uint32_t thread_index_in_simdgroup;
    uint32_t simdgroup_index_in_threadgroup;
    uint32_t simdgroups_per_threadgroup;
    uint32_t threads_per_simdgroup;
};

// What a thunk receives: the bound buffers ([[buffer(i)]], offset already applied), the
// threadgroup allocations ([[threadgroup(i)]]) and the thread's ids.
struct ThreadCtx {
    void* const* buffers;
    void* const* tg_mem;
    const ThreadIds* ids;
};

// One lane-to-lane exchange: every participating lane's value, and which lanes took part.
// Slots of lanes that did not take part hold all-ones bytes (NaN for floats) so a shuffle from
// an inactive lane shows up in the result instead of passing silently.
//
// `shared` is a per-release scratch for operations the whole simdgroup performs as one
// instruction (simdgroup_matrix load/store): the first lane resumed after the release does the
// memory access for all lanes and sets shared_ready, so the access sees memory exactly as it
// was when the last lane arrived, whatever order the lanes then run in.
struct Exchange {
    alignas(16) unsigned char slot[kSimdWidth][kExchangeBytes];
    uint32_t active;  // bit i: lane i took part
    alignas(16) mutable unsigned char shared[512];
    mutable bool shared_ready;
};

// Park the calling fiber at a threadgroup barrier (returns when the whole group arrived).
void barrier(const char* file, unsigned line);
// Deposit `bytes` of `value` for this lane and park until every live lane of the simdgroup
// arrived at the same site; returns the exchange, valid until this lane's next collective.
const Exchange& simd_exchange(const char* op, const void* value, size_t bytes, const char* file, unsigned line);
// This lane's index in its simdgroup (for collectives that pick their own slot).
uint32_t current_lane();

// Kernel registry, filled by the generated thunk files at load time.
using ThunkFn = void (*)(const ThreadCtx&);

struct FunctionConstant {
    uint32_t index;
    const char* name;
    const char* type;   // the MSL type name as written (bool, int, uint, float, ushort, ...)
    uint32_t size;      // sizeof that type
    void* storage;      // the global the kernel reads
};

struct KernelInfo {
    const char* name;
    ThunkFn thunk;
    bool needs_fibers;          // uses a barrier or collective (directly or through a helper)
    uint64_t buffer_mask;       // [[buffer(i)]] indices the kernel declares
    uint32_t tg_mask;           // [[threadgroup(i)]] indices it declares
    const FunctionConstant* const* constants;  // function constants it reads (null-terminated)
    const char* file;           // .metal source, for messages
};

// Adds kernels to the registry (called by static initialisers of the generated files).
int register_kernels(const KernelInfo* kernels, size_t n);

}  // namespace ds4emu
