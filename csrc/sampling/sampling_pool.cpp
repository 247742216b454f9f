#include "sampling/sampling_pool.h"

#include <atomic>

#include "common/thread_pool.h"

namespace ds4 {

namespace {
std::atomic<int> g_sampling_threads{1};
// A scope's pool for this thread (set: a scope is active, even with a null pool).
thread_local ThreadPool* t_pool = nullptr;
thread_local bool t_set = false;
}  // namespace

int sampling_threads() { return g_sampling_threads.load(std::memory_order_relaxed); }
void set_sampling_threads(int n) { g_sampling_threads.store(n < 1 ? 1 : n, std::memory_order_relaxed); }

ThreadPool* sampling_pool() {
    ThreadPool* p = t_set ? t_pool : (sampling_threads() > 1 ? &ThreadPool::global() : nullptr);
    return p && p->size() > 1 ? p : nullptr;
}

SamplingPoolScope::SamplingPoolScope(ThreadPool* pool) : prev_(t_pool), prev_set_(t_set) {
    t_pool = pool;
    t_set = true;
}

SamplingPoolScope::~SamplingPoolScope() {
    t_pool = prev_;
    t_set = prev_set_;
}

}  // namespace ds4
