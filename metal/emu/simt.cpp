// The SIMT runtime of the Metal emulator: threadgroups one after another, one fiber per thread
// inside a group, a scheduler that releases barriers and simd collectives when every live
// participant reached the same site, and the checks that make kernel bugs visible (Metal's
// limits, divergent synchronisation, NaN-poisoned threadgroup memory).
//
// Single-threaded by design: a dispatch runs to completion on the calling OS thread, so the
// emulator's results depend only on the chosen thread order (forward, reverse, shuffled), which
// is what the race check varies.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "ds4_metal_emu.h"
#include "simt.h"

#define DS4EMU_EXPORT extern "C" __attribute__((visibility("default")))

namespace ds4emu {
namespace {

// ---------------------------------------------------------------------------------------------
// Fibers. A hand-written switch saves only the callee-saved registers and the stack pointer:
// ucontext's swapcontext makes a signal-mask system call on every switch, which dominated the
// cost in the feasibility study. Other architectures fall back to ucontext.
// ---------------------------------------------------------------------------------------------

struct Fiber;
void fiber_main(Fiber* f);

#if defined(__x86_64__)
extern "C" void ds4emu_ctx_switch(void** save_sp, void* load_sp);
extern "C" void ds4emu_ctx_start();
asm(R"(
.text
.p2align 4
.globl ds4emu_ctx_switch
.hidden ds4emu_ctx_switch
.type ds4emu_ctx_switch,@function
ds4emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size ds4emu_ctx_switch, .-ds4emu_ctx_switch
.p2align 4
.globl ds4emu_ctx_start
.hidden ds4emu_ctx_start
.type ds4emu_ctx_start,@function
ds4emu_ctx_start:
    movq %r12, %rdi
    callq *%r13
    ud2
.size ds4emu_ctx_start, .-ds4emu_ctx_start
)");
constexpr bool kAsmSwitch = true;
#elif defined(__aarch64__)
extern "C" void ds4emu_ctx_switch(void** save_sp, void* load_sp);
extern "C" void ds4emu_ctx_start();
asm(R"(
.text
.p2align 4
.globl ds4emu_ctx_switch
.hidden ds4emu_ctx_switch
.type ds4emu_ctx_switch,%function
ds4emu_ctx_switch:
    sub sp, sp, #176
    stp x19, x20, [sp, #0]
    stp x21, x22, [sp, #16]
    stp x23, x24, [sp, #32]
    stp x25, x26, [sp, #48]
    stp x27, x28, [sp, #64]
    stp x29, x30, [sp, #80]
    stp d8, d9, [sp, #96]
    stp d10, d11, [sp, #112]
    stp d12, d13, [sp, #128]
    stp d14, d15, [sp, #144]
    mov x9, sp
    str x9, [x0]
    mov sp, x1
    ldp x19, x20, [sp, #0]
    ldp x21, x22, [sp, #16]
    ldp x23, x24, [sp, #32]
    ldp x25, x26, [sp, #48]
    ldp x27, x28, [sp, #64]
    ldp x29, x30, [sp, #80]
    ldp d8, d9, [sp, #96]
    ldp d10, d11, [sp, #112]
    ldp d12, d13, [sp, #128]
    ldp d14, d15, [sp, #144]
    add sp, sp, #176
    ret
.size ds4emu_ctx_switch, .-ds4emu_ctx_switch
.p2align 4
.globl ds4emu_ctx_start
.hidden ds4emu_ctx_start
.type ds4emu_ctx_start,%function
ds4emu_ctx_start:
    mov x0, x19
    blr x20
    brk #0
.size ds4emu_ctx_start, .-ds4emu_ctx_start
)");
constexpr bool kAsmSwitch = true;
#else
#include <ucontext.h>
constexpr bool kAsmSwitch = false;
#endif

constexpr size_t kStackBytes = 256 * 1024;  // per fiber; a guard page below each catches overflow
constexpr uint32_t kMaxThreads = 1024;
constexpr uint32_t kMaxTgMemory = 32 * 1024;

enum class State : uint8_t { Runnable, AtBarrier, AtSimd, Done };

struct Fiber {
    void* sp = nullptr;           // saved stack pointer while parked
    unsigned char* stack = nullptr;
#if !defined(__x86_64__) && !defined(__aarch64__)
    ucontext_t uc;
#endif
    State state = State::Done;
    const char* site_file = nullptr;  // where it is parked
    unsigned site_line = 0;
    const char* site_op = nullptr;
    uint32_t exchanges = 0;       // collectives this lane completed (selects the double buffer)
    uint32_t barriers = 0;        // barriers this thread passed
    ThreadIds ids;
};

struct SimdGroupState {
    Exchange buf[2];
};

struct Runtime {
    std::vector<const KernelInfo*> kernels;
    uint32_t max_threads = kMaxThreads;
    ds4emu_stats stats{};

    // Per dispatch.
    const KernelInfo* kernel = nullptr;
    std::string error;
    Fiber fibers[kMaxThreads];
    unsigned char* stacks = nullptr;
    void* sched_sp = nullptr;
#if !defined(__x86_64__) && !defined(__aarch64__)
    ucontext_t sched_uc;
#endif
    Fiber* current = nullptr;  // null: scheduler or fast path
    bool fast_path = false;
    SimdGroupState sg[kMaxThreads / kSimdWidth];
    ThreadCtx ctx_template{};
    uint32_t group_threads = 0;
};

Runtime& rt() {
    static Runtime r;
    return r;
}

void set_error(const char* fmt, ...) {
    Runtime& r = rt();
    if (!r.error.empty()) return;  // keep the first fault
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    r.error = std::string("kernel '") + (r.kernel ? r.kernel->name : "?") + "': " + buf;
}

bool ensure_stacks() {
    Runtime& r = rt();
    if (r.stacks) return true;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t total = kStackBytes * kMaxThreads;
    void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    r.stacks = static_cast<unsigned char*>(p);
    for (uint32_t i = 0; i < kMaxThreads; ++i) {
        mprotect(r.stacks + i * kStackBytes, page, PROT_NONE);
        r.fibers[i].stack = r.stacks + i * kStackBytes;
    }
    return true;
}

void switch_to_scheduler(Fiber* f) {
    Runtime& r = rt();
    r.current = nullptr;
#if defined(__x86_64__) || defined(__aarch64__)
    ds4emu_ctx_switch(&f->sp, r.sched_sp);
#else
    swapcontext(&f->uc, &r.sched_uc);
#endif
}

void resume(Fiber* f) {
    Runtime& r = rt();
    r.current = f;
    ++r.stats.fiber_switches;
#if defined(__x86_64__) || defined(__aarch64__)
    ds4emu_ctx_switch(&r.sched_sp, f->sp);
#else
    swapcontext(&r.sched_uc, &f->uc);
#endif
    r.current = nullptr;
}

void fiber_main(Fiber* f) {
    Runtime& r = rt();
    ThreadCtx c = r.ctx_template;
    c.ids = &f->ids;
    r.kernel->thunk(c);
    f->state = State::Done;
    switch_to_scheduler(f);
    __builtin_trap();  // a finished fiber is never resumed
}

#if !defined(__x86_64__) && !defined(__aarch64__)
void fiber_main_uc(unsigned lo, unsigned hi) {
    fiber_main(reinterpret_cast<Fiber*>(((uintptr_t)hi << 32) | lo));
}
#endif

void start_fiber(Fiber* f) {
    f->state = State::Runnable;
    f->exchanges = 0;
    f->barriers = 0;
    f->site_file = nullptr;
    f->site_line = 0;
    f->site_op = nullptr;
    unsigned char* top = f->stack + kStackBytes;  // 16-byte aligned (page aligned)
#if defined(__x86_64__)
    // Frame popped by ds4emu_ctx_switch: r15 r14 r13 r12 rbx rbp, then the return address.
    // sp = top - 72 leaves rsp 16-byte aligned when ds4emu_ctx_start calls fiber_main.
    void** sp = reinterpret_cast<void**>(top - 72);
    sp[0] = nullptr;                                   // r15
    sp[1] = nullptr;                                   // r14
    sp[2] = reinterpret_cast<void*>(&fiber_main);      // r13: entry
    sp[3] = f;                                         // r12: argument
    sp[4] = nullptr;                                   // rbx
    sp[5] = nullptr;                                   // rbp
    sp[6] = reinterpret_cast<void*>(&ds4emu_ctx_start);
    sp[7] = nullptr;
    f->sp = sp;
#elif defined(__aarch64__)
    unsigned char* frame = top - 176;
    std::memset(frame, 0, 176);
    void** regs = reinterpret_cast<void**>(frame);
    regs[0] = f;                                                // x19: argument
    regs[1] = reinterpret_cast<void*>(&fiber_main);             // x20: entry
    regs[11] = reinterpret_cast<void*>(&ds4emu_ctx_start);      // x30: return address
    f->sp = frame;
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack + (size_t)sysconf(_SC_PAGESIZE);
    f->uc.uc_stack.ss_size = kStackBytes - (size_t)sysconf(_SC_PAGESIZE);
    f->uc.uc_link = nullptr;
    const uintptr_t p = reinterpret_cast<uintptr_t>(f);
    makecontext(&f->uc, (void (*)())fiber_main_uc, 2, (unsigned)(p & 0xffffffffu), (unsigned)(p >> 32));
#endif
}

// ---------------------------------------------------------------------------------------------
// Scheduling one threadgroup.
// ---------------------------------------------------------------------------------------------

struct Order {
    int mode;
    uint64_t state;
    uint64_t next() {  // splitmix64: a fixed, portable sequence per seed
        uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    void permute(std::vector<uint32_t>& v) {
        for (uint32_t i = 0; i < v.size(); ++i) v[i] = i;
        if (mode == DS4EMU_ORDER_REVERSE) std::reverse(v.begin(), v.end());
        if (mode == DS4EMU_ORDER_SHUFFLE) {
            for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next() % i]);
        }
    }
};

const char* site_str(const Fiber& f, char* buf, size_t n) {
    snprintf(buf, n, "%s at %s:%u", f.site_op ? f.site_op : "?", f.site_file ? f.site_file : "?", f.site_line);
    return buf;
}

bool same_site(const Fiber& a, const Fiber& b) {
    return a.site_line == b.site_line && a.site_op == b.site_op &&
           (a.site_file == b.site_file || (a.site_file && b.site_file && !strcmp(a.site_file, b.site_file)));
}

// Releases every simdgroup whose live lanes all wait at one collective. Returns how many were
// released, or -1 after recording a divergence fault.
int release_simdgroups(uint32_t n_threads) {
    Runtime& r = rt();
    int released = 0;
    char a[256], b[256];
    for (uint32_t s0 = 0; s0 < n_threads; s0 += kSimdWidth) {
        const uint32_t s1 = std::min(n_threads, s0 + kSimdWidth);
        Fiber* first_simd = nullptr;
        Fiber* first_barrier = nullptr;
        uint32_t live = 0, at_simd = 0;
        for (uint32_t t = s0; t < s1; ++t) {
            Fiber& f = r.fibers[t];
            if (f.state == State::Done) continue;
            ++live;
            if (f.state == State::AtSimd) {
                if (!first_simd) {
                    first_simd = &f;
                } else if (!same_site(*first_simd, f) || f.exchanges != first_simd->exchanges) {
                    set_error("divergent simd collective in simdgroup %u: lane %u waits at %s (its collective #%u), "
                              "lane %u at %s (#%u)",
                              s0 / kSimdWidth, first_simd->ids.thread_index_in_simdgroup,
                              site_str(*first_simd, a, sizeof a), first_simd->exchanges,
                              f.ids.thread_index_in_simdgroup, site_str(f, b, sizeof b), f.exchanges);
                    return -1;
                }
                ++at_simd;
            } else if (f.state == State::AtBarrier && !first_barrier) {
                first_barrier = &f;
            }
        }
        if (!first_simd) continue;
        if (first_barrier) {
            set_error("divergent simdgroup %u: lane %u waits at %s while lane %u waits at %s", s0 / kSimdWidth,
                      first_simd->ids.thread_index_in_simdgroup, site_str(*first_simd, a, sizeof a),
                      first_barrier->ids.thread_index_in_simdgroup, site_str(*first_barrier, b, sizeof b));
            return -1;
        }
        if (at_simd != live) continue;  // unreachable: every live lane is parked here
        // All live lanes are at the same collective: publish who took part, poison the others.
        Exchange& ex = r.sg[s0 / kSimdWidth].buf[first_simd->exchanges & 1];
        ex.active = 0;
        ex.shared_ready = false;
        for (uint32_t t = s0; t < s0 + kSimdWidth; ++t) {
            const uint32_t lane = t - s0;
            if (t < s1 && r.fibers[t].state == State::AtSimd) {
                ex.active |= 1u << lane;
                r.fibers[t].state = State::Runnable;
            } else {
                std::memset(ex.slot[lane], 0xff, kExchangeBytes);
            }
        }
        ++released;
    }
    return released;
}

// Every live thread is parked and no simdgroup could be released: all must be at one barrier.
bool release_barrier(uint32_t n_threads) {
    Runtime& r = rt();
    Fiber* first = nullptr;
    uint32_t done = 0;
    char a[256], b[256];
    for (uint32_t t = 0; t < n_threads; ++t) {
        Fiber& f = r.fibers[t];
        if (f.state == State::Done) { ++done; continue; }
        if (f.state != State::AtBarrier) {
            set_error("deadlock: thread %u is parked at %s", t, site_str(f, a, sizeof a));
            return false;
        }
        if (!first) {
            first = &f;
        } else if (!same_site(*first, f) || f.barriers != first->barriers) {
            set_error("divergent threadgroup_barrier: thread %u waits at %s (its barrier #%u), thread %u at %s (#%u)",
                      first->ids.thread_index_in_threadgroup, site_str(*first, a, sizeof a), first->barriers,
                      f.ids.thread_index_in_threadgroup, site_str(f, b, sizeof b), f.barriers);
            return false;
        }
    }
    if (done) {
        set_error("%s reached by %u of %u threads: the other %u returned before it (Metal requires every "
                  "thread of the threadgroup to reach each barrier)",
                  site_str(*first, a, sizeof a), n_threads - done, n_threads, done);
        return false;
    }
    for (uint32_t t = 0; t < n_threads; ++t) {
        r.fibers[t].state = State::Runnable;
        ++r.fibers[t].barriers;
    }
    return true;
}

bool run_group_fibers(uint32_t n_threads, const std::vector<uint32_t>& order) {
    Runtime& r = rt();
    for (uint32_t t = 0; t < n_threads; ++t) start_fiber(&r.fibers[t]);
    for (;;) {
        uint32_t live = 0;
        for (uint32_t t : order) {
            Fiber& f = r.fibers[t];
            if (f.state == State::Runnable) resume(&f);
            if (!r.error.empty()) return false;
            if (f.state != State::Done) ++live;
        }
        if (!live) return true;
        const int released = release_simdgroups(n_threads);
        if (released < 0) return false;
        if (released == 0 && !release_barrier(n_threads)) return false;
    }
}

bool run_group_fast(uint32_t n_threads, const std::vector<uint32_t>& order) {
    Runtime& r = rt();
    r.fast_path = true;
    for (uint32_t t : order) {
        ThreadCtx c = r.ctx_template;
        c.ids = &r.fibers[t].ids;
        r.kernel->thunk(c);
        if (!r.error.empty()) break;
    }
    r.fast_path = false;
    return r.error.empty();
}

uint32_t divup(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

const KernelInfo* find_kernel(const char* name) {
    for (const KernelInfo* k : rt().kernels) {
        if (!strcmp(k->name, name)) return k;
    }
    return nullptr;
}

bool bind_constants(const ds4emu_dispatch* d) {
    const KernelInfo* k = rt().kernel;
    for (const FunctionConstant* const* pc = k->constants; pc && *pc; ++pc) {
        const FunctionConstant* fc = *pc;
        const ds4emu_constant* given = nullptr;
        for (uint32_t i = 0; i < d->n_constants; ++i) {
            if (d->constants[i].index == fc->index) given = &d->constants[i];
        }
        if (!given) {
            set_error("function constant %u (%s %s) is not set: Metal fails to build this pipeline", fc->index,
                      fc->type, fc->name);
            return false;
        }
        if (given->size != fc->size || !given->value) {
            set_error("function constant %u (%s %s) is %u bytes, the value given has %u", fc->index, fc->type,
                      fc->name, fc->size, given->size);
            return false;
        }
        std::memcpy(fc->storage, given->value, fc->size);
    }
    return true;
}

int run(const ds4emu_dispatch* d) {
    Runtime& r = rt();
    r.kernel = find_kernel(d->kernel ? d->kernel : "");
    if (!r.kernel) {
        r.error = std::string("no kernel named '") + (d->kernel ? d->kernel : "(null)") + "' in the library";
        return 1;
    }
    const uint32_t tx = d->threads[0], ty = d->threads[1], tz = d->threads[2];
    const uint64_t tg_threads = (uint64_t)tx * ty * tz;
    if (!tx || !ty || !tz || !d->grid[0] || !d->grid[1] || !d->grid[2]) {
        set_error("empty grid or threadgroup (%u,%u,%u) x (%u,%u,%u)", d->grid[0], d->grid[1], d->grid[2], tx, ty, tz);
        return 2;
    }
    if (tg_threads > r.max_threads) {
        set_error("%llu threads per threadgroup exceed the pipeline's maxTotalThreadsPerThreadgroup (%u)",
                  (unsigned long long)tg_threads, r.max_threads);
        return 2;
    }
    // Threadgroup memory: Metal's limits, then NaN-filled storage for each group.
    void* tg_ptrs[32] = {};
    if (d->n_tg_mem > 32) { set_error("more than 32 threadgroup memory bindings"); return 2; }
    uint64_t tg_total = 0;
    for (uint32_t i = 0; i < d->n_tg_mem; ++i) {
        if (d->tg_mem[i] % 16) {
            set_error("threadgroup memory %u is %u bytes: Metal requires a multiple of 16", i, d->tg_mem[i]);
            return 2;
        }
        tg_total += d->tg_mem[i];
    }
    if (tg_total > kMaxTgMemory) {
        set_error("%llu bytes of threadgroup memory exceed Metal's %u", (unsigned long long)tg_total, kMaxTgMemory);
        return 2;
    }
    for (uint32_t i = 0; i < 32; ++i) {
        if ((r.kernel->tg_mask >> i) & 1u) {
            if (i >= d->n_tg_mem || d->tg_mem[i] == 0) {
                set_error("threadgroup(%u) is declared but no threadgroup memory length is set", i);
                return 2;
            }
        }
    }
    std::vector<unsigned char> tg_storage((size_t)tg_total + 16 * (d->n_tg_mem + 1));
    {
        uintptr_t p = (reinterpret_cast<uintptr_t>(tg_storage.data()) + 15) & ~(uintptr_t)15;
        for (uint32_t i = 0; i < d->n_tg_mem; ++i) {
            tg_ptrs[i] = reinterpret_cast<void*>(p);
            p += d->tg_mem[i];
        }
    }
    // Buffers.
    void* bufs[64] = {};
    if (d->n_buffers > 64) { set_error("more than 64 buffer bindings"); return 2; }
    for (uint32_t i = 0; i < d->n_buffers; ++i) {
        const ds4emu_buffer& b = d->buffers[i];
        if (!b.base) continue;
        if (b.offset > b.length) {
            set_error("buffer(%u) offset %llu is past its length %llu", i, (unsigned long long)b.offset,
                      (unsigned long long)b.length);
            return 2;
        }
        bufs[i] = static_cast<unsigned char*>(b.base) + b.offset;
        if (b.poison) std::memset(bufs[i], 0xff, (size_t)(b.length - b.offset));
    }
    for (uint32_t i = 0; i < 64; ++i) {
        if (((r.kernel->buffer_mask >> i) & 1u) && !bufs[i]) {
            set_error("buffer(%u) is declared by the kernel but not bound", i);
            return 2;
        }
    }
    if (!bind_constants(d)) return 2;
    if (r.kernel->needs_fibers && !ensure_stacks()) {
        set_error("cannot map fiber stacks");
        return 3;
    }

    // Grid geometry.
    U3 groups, total;
    if (d->grid_is_threads) {
        total = {d->grid[0], d->grid[1], d->grid[2]};
        groups = {divup(total.x, tx), divup(total.y, ty), divup(total.z, tz)};
    } else {
        groups = {d->grid[0], d->grid[1], d->grid[2]};
        total = {groups.x * tx, groups.y * ty, groups.z * tz};
    }
    const uint64_t n_groups = (uint64_t)groups.x * groups.y * groups.z;
    Order ord{d->order, d->seed};
    std::vector<uint32_t> group_order((size_t)std::min<uint64_t>(n_groups, UINT32_MAX));
    ord.permute(group_order);
    r.ctx_template.buffers = bufs;
    r.ctx_template.tg_mem = tg_ptrs;
    std::vector<uint32_t> thread_order;
    ++r.stats.dispatches;

    for (uint32_t gi : group_order) {
        const U3 g = {gi % groups.x, (gi / groups.x) % groups.y, gi / (groups.x * groups.y)};
        // Partial edge groups exist only for dispatchThreads-style grids.
        const U3 size = {std::min(tx, total.x - g.x * tx), std::min(ty, total.y - g.y * ty),
                         std::min(tz, total.z - g.z * tz)};
        const uint32_t n = size.x * size.y * size.z;
        for (uint32_t t = 0; t < n; ++t) {
            ThreadIds& id = r.fibers[t].ids;
            const U3 l = {t % size.x, (t / size.x) % size.y, t / (size.x * size.y)};
            id.thread_position_in_threadgroup = l;
            id.threadgroup_position_in_grid = g;
            id.thread_position_in_grid = {g.x * tx + l.x, g.y * ty + l.y, g.z * tz + l.z};
            id.threads_per_threadgroup = size;
            id.dispatch_threads_per_threadgroup = {tx, ty, tz};
            id.threadgroups_per_grid = groups;
            id.threads_per_grid = total;
            id.thread_index_in_threadgroup = t;
            id.thread_index_in_simdgroup = t % kSimdWidth;
            id.simdgroup_index_in_threadgroup = t / kSimdWidth;
            id.simdgroups_per_threadgroup = divup(n, kSimdWidth);
            id.threads_per_simdgroup = kSimdWidth;
        }
        thread_order.resize(n);
        ord.permute(thread_order);
        for (uint32_t i = 0; i < d->n_tg_mem; ++i) std::memset(tg_ptrs[i], 0xff, d->tg_mem[i]);
        r.group_threads = n;
        const bool ok = r.kernel->needs_fibers ? run_group_fibers(n, thread_order) : run_group_fast(n, thread_order);
        ++r.stats.threadgroups;
        r.stats.threads += n;
        if (!r.kernel->needs_fibers) r.stats.fast_path_threads += n;
        if (!ok) {
            if (r.error.empty()) set_error("threadgroup failed");
            char where[96];
            snprintf(where, sizeof where, " (threadgroup %u,%u,%u)", g.x, g.y, g.z);
            r.error += where;
            return 4;
        }
    }
    return 0;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Entry points for the shim.
// ---------------------------------------------------------------------------------------------

namespace {
Fiber* sync_fiber(const char* op, const char* file, unsigned line) {
    Runtime& r = rt();
    if (!r.current) {
        set_error("%s at %s:%u ran outside a fiber: the kernel was classified as free of barriers and "
                  "collectives (the build step missed a helper that uses them)",
                  op, file, line);
        // A fast-path thread cannot park; let it continue with garbage and fail the dispatch.
        return nullptr;
    }
    return r.current;
}
}  // namespace

void barrier(const char* file, unsigned line) {
    Fiber* f = sync_fiber("threadgroup_barrier", file, line);
    if (!f) return;
    f->state = State::AtBarrier;
    f->site_file = file;
    f->site_line = line;
    f->site_op = "threadgroup_barrier";
    switch_to_scheduler(f);
}

const Exchange& simd_exchange(const char* op, const void* value, size_t bytes, const char* file, unsigned line) {
    static Exchange dummy;
    Fiber* f = sync_fiber(op, file, line);
    if (!f) return dummy;
    Runtime& r = rt();
    const uint32_t lane = f->ids.thread_index_in_simdgroup;
    Exchange& ex = r.sg[f->ids.simdgroup_index_in_threadgroup].buf[f->exchanges & 1];
    std::memcpy(ex.slot[lane], value, bytes);
    f->state = State::AtSimd;
    f->site_file = file;
    f->site_line = line;
    f->site_op = op;
    switch_to_scheduler(f);
    ++f->exchanges;
    return ex;
}

uint32_t current_lane() {
    Runtime& r = rt();
    return r.current ? r.current->ids.thread_index_in_simdgroup : 0;
}

int register_kernels(const KernelInfo* kernels, size_t n) {
    for (size_t i = 0; i < n; ++i) rt().kernels.push_back(&kernels[i]);
    return (int)n;
}

}  // namespace ds4emu

using ds4emu::rt;

// The runtime is one per process and not reentrant: callers on several threads (the C++
// metal-emu backend's streams, Python's ctypes driver) are serialised here, whoever they are.
static std::mutex& dispatch_mutex() {
    static std::mutex m;
    return m;
}

DS4EMU_EXPORT int ds4emu_dispatch_run(const ds4emu_dispatch* d, char* err, size_t err_len) {
    std::lock_guard<std::mutex> lock(dispatch_mutex());
    ds4emu::Runtime& r = rt();
    r.error.clear();
    r.current = nullptr;
    const int rc = ds4emu::run(d);
    r.kernel = nullptr;
    if (rc && err && err_len) snprintf(err, err_len, "%s", r.error.c_str());
    return rc;
}

DS4EMU_EXPORT uint32_t ds4emu_kernel_count(void) { return (uint32_t)rt().kernels.size(); }

DS4EMU_EXPORT const char* ds4emu_kernel_name(uint32_t i) {
    return i < rt().kernels.size() ? rt().kernels[i]->name : nullptr;
}

DS4EMU_EXPORT int ds4emu_kernel_constant(const char* kernel, uint32_t k, uint32_t* index, uint32_t* size,
                                         const char** name) {
    const ds4emu::KernelInfo* info = ds4emu::find_kernel(kernel ? kernel : "");
    if (!info || !info->constants) return -1;
    for (uint32_t i = 0; info->constants[i]; ++i) {
        if (i == k) {
            *index = info->constants[i]->index;
            *size = info->constants[i]->size;
            *name = info->constants[i]->name;
            return 0;
        }
    }
    return -1;
}

DS4EMU_EXPORT void ds4emu_set_max_threads_per_threadgroup(uint32_t n) {
    rt().max_threads = std::max<uint32_t>(ds4emu::kSimdWidth, std::min<uint32_t>(n, ds4emu::kMaxThreads));
}

DS4EMU_EXPORT uint32_t ds4emu_max_threads_per_threadgroup(void) { return rt().max_threads; }
DS4EMU_EXPORT uint32_t ds4emu_max_threadgroup_memory(void) { return ds4emu::kMaxTgMemory; }
DS4EMU_EXPORT void ds4emu_get_stats(ds4emu_stats* out) { *out = rt().stats; }
DS4EMU_EXPORT void ds4emu_reset_stats(void) { rt().stats = ds4emu_stats{}; }
