// A persistent pool of worker threads. Work is split by contiguous ranges of output rows,
// never inside a reduction, so results do not depend on the thread count.
#pragma once
#include <cstdint>
#include <functional>

#include "common/range_split.h"

namespace ds4 {

class ThreadPool {
public:
    // n_threads <= 0 means "physical cores" (default_thread_count()).
    explicit ThreadPool(int n_threads = 0);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const noexcept;

    // Calls fn(begin, end) over disjoint ranges covering [0, n). Ranges are at least
    // min_chunk long (except the last), at most ranges_per_thread per thread (more, shorter
    // ranges shorten the wait for the last one; fewer keep per-range setup low). Runs inline when
    // n is small or size() == 1. Exceptions thrown by fn are rethrown (the first one) on the
    // calling thread. Split::Tapered ends the job with shorter ranges (common/range_split.h).
    void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1,
                      int ranges_per_thread = 4, Split split = Split::Even);

    // The process-wide pool used when callers pass no pool explicitly.
    static ThreadPool& global();
    // Resize the global pool in place (waits for a running parallel_for; references stay valid).
    static void set_global_threads(int n_threads);

private:
    struct Impl;
    Impl* impl_;
};

int default_thread_count();  // physical cores if known, else hardware_concurrency, at least 1

}  // namespace ds4
