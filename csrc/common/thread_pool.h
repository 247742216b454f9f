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

    // Work for the workers only, while the calling thread goes on with its own: fn(begin, end)
    // over the ranges of [0, n) (n_ranges of them, at least 1). finish() (or the destructor) stops
    // handing out ranges and waits for the ones started, so ranges may be skipped: for optional
    // work such as warming caches (docs/kernels.md, "Decode glue"). Holds the pool for its
    // lifetime: the caller must not issue parallel_for on this pool until finish(). With one
    // thread nothing runs.
    class SideJob {
    public:
        SideJob(ThreadPool& pool, int64_t n, int64_t n_ranges, const std::function<void(int64_t, int64_t)>& fn);
        ~SideJob();
        SideJob(const SideJob&) = delete;
        SideJob& operator=(const SideJob&) = delete;
        // Returns how many ranges ran (for tests).
        int64_t finish();

    private:
        ThreadPool& pool_;
        void* job_ = nullptr;  // the pool's side-job slot while running
        int64_t ran_ = -1;
    };

    // Wakes sleeping workers without giving them work: they spin again for a while (then sleep),
    // so a parallel_for issued soon after finds them awake. For a caller about to start a burst
    // of jobs after a pause, e.g. a decode step after the host's time between tokens.
    void wake_workers();

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
