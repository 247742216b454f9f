// Which threads the sampler's whole-vocabulary passes may split over (docs/sampling.md, "Seventh
// round"). Results never depend on it: the split passes give the serial ones' bits.
#pragma once

namespace ds4 {

class ThreadPool;

// The process-wide default: 1 (the calling thread alone) or more (the global pool).
int sampling_threads();
void set_sampling_threads(int n);

// The pool to split over, or null for the calling thread alone: the pool a SamplingPoolScope set
// on this thread, else the global pool when sampling_threads() > 1. A pool of one thread is
// returned as null too.
ThreadPool* sampling_pool();

// For the lifetime of the scope, this thread's sampler calls split over `pool` (null: none). The
// generation path passes the engine's own workers, which idle while the host samples and, right
// after a decode step, are still spinning (the global pool's would have to be woken).
class SamplingPoolScope {
public:
    explicit SamplingPoolScope(ThreadPool* pool);
    ~SamplingPoolScope();
    SamplingPoolScope(const SamplingPoolScope&) = delete;
    SamplingPoolScope& operator=(const SamplingPoolScope&) = delete;

private:
    ThreadPool* prev_;
    bool prev_set_;
};

}  // namespace ds4
