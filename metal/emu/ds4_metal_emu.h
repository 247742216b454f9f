/* C ABI of the Metal emulator library (the compiled metal/*.metal kernels plus the SIMT runtime).
 *
 * The shape of a dispatch is the one a Metal compute encoder sees, so that a host written once
 * against it can drive either Apple's GPU or this emulator: a pipeline (kernel name + function
 * constant values), buffers bound at indices with byte offsets (inline bytes are a buffer that
 * points at a host copy), threadgroup memory lengths, and a grid of threadgroups (or of threads,
 * for dispatchThreads-style partial edge groups). Python drives it through ctypes
 * (ds4.metal_emu); the C++ core can dlopen the same library.
 *
 * The runtime is a process-wide singleton and is not reentrant: one dispatch at a time (callers
 * on several threads serialise; ds4.metal_emu.Library holds a lock).
 *
 * Every function returns 0 on success; on failure a non-zero code and a message in `err`
 * naming the kernel and, for synchronisation faults, the .metal file and line. */
#ifndef DS4_METAL_EMU_H
#define DS4_METAL_EMU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum ds4emu_order {
    DS4EMU_ORDER_FORWARD = 0, /* threadgroups and threads in index order */
    DS4EMU_ORDER_REVERSE = 1, /* both reversed */
    DS4EMU_ORDER_SHUFFLE = 2  /* both permuted by a seeded generator */
};

typedef struct {
    uint32_t index;      /* [[function_constant(index)]] */
    uint32_t size;       /* bytes of value; must equal the constant's type size */
    const void* value;
} ds4emu_constant;

typedef struct {
    void* base;          /* buffer start (host memory) */
    uint64_t offset;     /* byte offset bound with the buffer */
    uint64_t length;     /* bytes valid from base (for the bounds message on poisoning) */
    int poison;          /* non-zero: fill [base+offset, base+length) with NaN bytes before the run */
} ds4emu_buffer;

typedef struct {
    const char* kernel;
    const ds4emu_constant* constants;
    uint32_t n_constants;
    const ds4emu_buffer* buffers; /* index i = [[buffer(i)]]; base NULL = unbound */
    uint32_t n_buffers;
    const uint32_t* tg_mem;       /* bytes for [[threadgroup(i)]] */
    uint32_t n_tg_mem;
    uint32_t grid[3];             /* threadgroups per grid, or threads per grid if grid_is_threads */
    uint32_t threads[3];          /* threads per threadgroup */
    int grid_is_threads;
    int order;                    /* ds4emu_order */
    uint64_t seed;                /* for DS4EMU_ORDER_SHUFFLE */
} ds4emu_dispatch;

typedef struct {
    uint64_t dispatches;
    uint64_t threadgroups;
    uint64_t threads;
    uint64_t fiber_switches;     /* resumptions of a parked or fresh fiber */
    uint64_t fast_path_threads;  /* threads run without a fiber (kernel has no sync op) */
} ds4emu_stats;

int ds4emu_dispatch_run(const ds4emu_dispatch* d, char* err, size_t err_len);

/* Kernels in the library. */
uint32_t ds4emu_kernel_count(void);
const char* ds4emu_kernel_name(uint32_t i);
/* Function constants a kernel reads: index and size of the k-th one; returns -1 past the end. */
int ds4emu_kernel_constant(const char* kernel, uint32_t k, uint32_t* index, uint32_t* size, const char** name);

/* Metal's limits, as a pipeline reports them. max_threads may be lowered (down to 32) to test a
 * host's handling of maxTotalThreadsPerThreadgroup < 1024. */
void ds4emu_set_max_threads_per_threadgroup(uint32_t n);
uint32_t ds4emu_max_threads_per_threadgroup(void);
uint32_t ds4emu_max_threadgroup_memory(void);

void ds4emu_get_stats(ds4emu_stats* out);
void ds4emu_reset_stats(void);

#ifdef __cplusplus
}
#endif

#endif
