// Persistent worker pool. One job at a time: the calling thread and size()-1 workers take the
// job's contiguous ranges from a shared counter, so each range is computed by exactly one thread
// and the partition depends only on (n, size, min_chunk), never on timing.
#include "common/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#include <sys/types.h>
#endif

#include "common/errors.h"
#include "common/op_timeline.h"

namespace ds4 {

namespace {

// Nesting guard: a parallel_for issued from inside a running job executes inline, which avoids
// deadlocking a pool whose threads are all busy with the outer job.
thread_local int t_pool_depth = 0;

// Decode issues a parallel_for every few microseconds; waking a sleeping thread through the
// kernel costs about as long as a small job. So a waiting thread first spins this long on the
// flag it waits for, then sleeps as before (the machine may be shared: the spin stays short).
constexpr auto kSpin = std::chrono::microseconds(50);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

// Spins until ready() or kSpin has passed; true when ready() was seen.
template <class Ready>
bool spin_until(Ready ready) {
    const auto deadline = std::chrono::steady_clock::now() + kSpin;
    for (;;) {
        for (int i = 0; i < 32; ++i) {
            if (ready()) return true;
            cpu_relax();
        }
        if (std::chrono::steady_clock::now() >= deadline) return ready();
    }
}

int physical_cores() {
#if defined(__linux__)
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
    std::set<std::pair<int, int>> cores;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (!CPU_ISSET(cpu, &set)) continue;
        const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
        std::ifstream pkg(base + "physical_package_id"), core(base + "core_id");
        int p = -1, c = -1;
        if (!(pkg >> p) || !(core >> c)) return CPU_COUNT(&set);  // no topology: count allowed CPUs
        cores.insert({p, c});
    }
    return (int)cores.size();
#elif defined(__APPLE__)
    int n = 0;
    size_t len = sizeof(n);
    if (sysctlbyname("hw.perflevel0.physicalcpu", &n, &len, nullptr, 0) == 0 && n > 0) return n;
    len = sizeof(n);
    if (sysctlbyname("hw.physicalcpu", &n, &len, nullptr, 0) == 0 && n > 0) return n;
    return 0;
#else
    return 0;
#endif
}

}  // namespace

int default_thread_count() {
    if (const char* env = std::getenv("DS4_THREADS")) {
        char* end = nullptr;
        const long v = std::strtol(env, &end, 10);
        if (end != env && *end == '\0' && v > 0 && v <= 1024) return (int)v;
    }
    int n = physical_cores();
    if (n <= 0) n = (int)std::thread::hardware_concurrency();
    return n > 0 ? n : 1;
}

struct ThreadPool::Impl {
    // One parallel_for call. It lives on the caller's stack; workers take a reference under `mu`
    // and the caller returns only once every task is finished and every reference released.
    struct Job {
        const std::function<void(int64_t, int64_t)>* fn;
        int64_t n;
        int64_t n_tasks;
        const int64_t* bounds = nullptr;  // n_tasks + 1 range boundaries, or null for the even split
        std::atomic<int64_t> next{0};
        int64_t finished = 0;  // guarded by mu
        int refs = 0;          // guarded by mu
        std::atomic<bool> complete{false};  // set under mu once finished == n_tasks and refs == 0
        std::exception_ptr error;
        bool side = false;  // a SideJob: the caller takes no share, and unstarted ranges may be dropped
        // Hand-off figures for the op timeline (common/op_timeline.h), only when `timed`.
        bool timed = false;
        int64_t first_helper_range = 0;  // guarded by mu: steady ns when a helper began its first range
        int64_t helper_ns = 0;           // guarded by mu: helpers' time from their first range to leaving
        int64_t helper_cpu_ns = 0;       // guarded by mu: the same in the helpers' CPU time
    };

    std::atomic<int> size{1};
    std::vector<std::thread> workers;

    std::mutex call_mu;  // serialises parallel_for calls (and resizes) from different client threads
    Job side;            // the running SideJob's job (guarded by call_mu, held by the SideJob)

    std::mutex mu;
    std::condition_variable wake;
    std::condition_variable done;
    std::atomic<uint64_t> generation{0};  // written under mu; also read without it while spinning
    bool stop = false;
    Job* job = nullptr;  // the current job, null between calls

    void run_tasks(Job& j, bool helper) {
        ++t_pool_depth;
        int64_t completed = 0;
        int64_t t_first = 0, cpu_first = 0;
        std::exception_ptr err;
        for (;;) {
            const int64_t i = j.next.fetch_add(1);
            if (i >= j.n_tasks) break;
            if (helper && j.timed && t_first == 0) {
                t_first = timeline::now_ns();
                cpu_first = timeline::thread_cpu_ns();
            }
            const int64_t b = j.bounds ? j.bounds[i] : j.n * i / j.n_tasks;
            const int64_t e = j.bounds ? j.bounds[i + 1] : j.n * (i + 1) / j.n_tasks;
            if (!err) {
                try {
                    (*j.fn)(b, e);
                } catch (...) {
                    err = std::current_exception();
                }
            }
            ++completed;
        }
        --t_pool_depth;
        const int64_t t_last = t_first ? timeline::now_ns() : 0;
        const int64_t cpu_last = t_first ? timeline::thread_cpu_ns() : 0;
        std::lock_guard<std::mutex> lk(mu);
        if (t_first) {
            j.helper_ns += t_last - t_first;
            j.helper_cpu_ns += cpu_last - cpu_first;
            if (j.first_helper_range == 0 || t_first < j.first_helper_range) j.first_helper_range = t_first;
        }
        if (err && !j.error) j.error = err;
        j.finished += completed;
        --j.refs;
        if (j.refs == 0 && (j.side || j.finished == j.n_tasks)) {
            j.complete.store(true, std::memory_order_release);
            done.notify_all();
        }
    }

    void start_workers(int n) {
        size.store(n);
        for (int i = 1; i < n; ++i) workers.emplace_back([this] { worker_loop(); });
    }

    void stop_workers() {
        {
            std::lock_guard<std::mutex> lk(mu);
            stop = true;
        }
        wake.notify_all();
        for (auto& t : workers) t.join();
        workers.clear();
        std::lock_guard<std::mutex> lk(mu);
        stop = false;
    }

    void worker_loop() {
        uint64_t seen = 0;
        for (;;) {
            Job* j = nullptr;
            spin_until([&] { return generation.load(std::memory_order_acquire) != seen; });
            {
                std::unique_lock<std::mutex> lk(mu);
                wake.wait(lk, [&] { return stop || generation != seen; });
                if (stop) return;
                seen = generation;
                j = job;
                if (!j) continue;
                ++j->refs;
            }
            run_tasks(*j, true);
        }
    }
};

ThreadPool::ThreadPool(int n_threads) : impl_(new Impl) {
    try {
        impl_->start_workers(n_threads > 0 ? n_threads : default_thread_count());
    } catch (...) {
        impl_->stop_workers();
        delete impl_;
        throw;
    }
}

ThreadPool::~ThreadPool() {
    impl_->stop_workers();
    delete impl_;
}

int ThreadPool::size() const noexcept { return impl_->size.load(); }

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk,
                              int ranges_per_thread, Split split) {
    if (n <= 0) return;
    // Up to ranges_per_thread ranges per thread, taken from a shared counter: a thread slowed down
    // by other load on the machine does not hold the others back. (Which thread computes a row
    // never changes its value.) A resize racing with the size read only changes how many ranges
    // there are.
    const int threads = impl_->size.load();
    int64_t n_tasks = even_task_count(n, threads, min_chunk, ranges_per_thread);
    if (n_tasks == 1 || t_pool_depth > 0) {
        fn(0, n);
        return;
    }
    // The caller's own boundary list: it outlives the job (the caller returns last), and a nested
    // call from inside fn runs inline above without touching it.
    thread_local std::vector<int64_t> bounds;
    if (split == Split::Tapered) {
        split_bounds(n, threads, min_chunk, ranges_per_thread, split, bounds);
        n_tasks = (int64_t)bounds.size() - 1;
    }
    Impl& s = *impl_;
    std::lock_guard<std::mutex> call(s.call_mu);
    Impl::Job j;
    j.fn = &fn;
    j.n = n;
    j.n_tasks = n_tasks;
    if (split == Split::Tapered) j.bounds = bounds.data();
    j.timed = timeline::has_open();
    const int64_t t_pub = j.timed ? timeline::now_ns() : 0;
    {
        std::lock_guard<std::mutex> lk(s.mu);
        j.refs = 1;  // the caller's own share
        s.job = &j;
        ++s.generation;
    }
    s.wake.notify_all();
    s.run_tasks(j, false);
    const int64_t t_own = j.timed ? timeline::now_ns() : 0;
    spin_until([&] { return j.complete.load(std::memory_order_acquire); });
    {
        std::unique_lock<std::mutex> lk(s.mu);
        s.done.wait(lk, [&] { return j.finished == j.n_tasks && j.refs == 0; });
        s.job = nullptr;
    }
    if (j.timed) {
        const bool joined = j.first_helper_range != 0;
        timeline::add_handoff(joined ? j.first_helper_range - t_pub : t_own - t_pub, timeline::now_ns() - t_own,
                              j.helper_ns, j.helper_cpu_ns, joined);
    }
    if (j.error) std::rethrow_exception(j.error);
}

ThreadPool::SideJob::SideJob(ThreadPool& pool, int64_t n, int64_t n_ranges,
                             const std::function<void(int64_t, int64_t)>& fn)
    : pool_(pool) {
    Impl& s = *pool.impl_;
    if (n <= 0 || s.size.load() <= 1) return;
    s.call_mu.lock();
    Impl::Job& j = s.side;
    j.fn = &fn;
    j.n = n;
    j.n_tasks = std::max<int64_t>(1, std::min(n, n_ranges));
    j.bounds = nullptr;
    j.next.store(0);
    j.finished = 0;
    j.refs = 0;
    j.complete.store(false);
    j.error = nullptr;
    j.side = true;
    j.timed = false;  // not a hand-off of the op being timed
    {
        std::lock_guard<std::mutex> lk(s.mu);
        s.job = &j;
        ++s.generation;
    }
    s.wake.notify_all();
    job_ = &j;
}

int64_t ThreadPool::SideJob::finish() {
    if (!job_) return ran_ < 0 ? 0 : ran_;
    Impl& s = *pool_.impl_;
    Impl::Job& j = *static_cast<Impl::Job*>(job_);
    j.next.store(j.n_tasks);  // later fetch_adds hand out nothing; a range already taken runs on
    bool idle;
    {
        std::lock_guard<std::mutex> lk(s.mu);
        s.job = nullptr;  // no worker joins any more
        idle = j.refs == 0;
    }
    if (!idle) {
        spin_until([&] { return j.complete.load(std::memory_order_acquire); });
        std::unique_lock<std::mutex> lk(s.mu);
        s.done.wait(lk, [&] { return j.refs == 0; });
    }
    ran_ = j.finished;
    job_ = nullptr;
    s.call_mu.unlock();
    return ran_;
}

ThreadPool::SideJob::~SideJob() { finish(); }

void ThreadPool::wake_workers() {
    Impl& s = *impl_;
    if (s.size.load() <= 1) return;
    {
        // A new generation with no job: a worker takes it as "nothing to do", and spins before
        // sleeping again (worker_loop). A job running for another client meanwhile is unaffected:
        // a worker that sees it joins it as it would have anyway.
        std::lock_guard<std::mutex> lk(s.mu);
        ++s.generation;
    }
    s.wake.notify_all();
}

ThreadPool& ThreadPool::global() {
    // Never destroyed or replaced (resized in place instead), so references stay valid.
    static ThreadPool* pool = new ThreadPool(0);
    return *pool;
}

void ThreadPool::set_global_threads(int n_threads) {
    ThreadPool& g = global();
    // Waits for a running job on the pool to finish; later callers wait for the new workers.
    std::lock_guard<std::mutex> call(g.impl_->call_mu);
    g.impl_->stop_workers();
    g.impl_->start_workers(n_threads > 0 ? n_threads : default_thread_count());
}

}  // namespace ds4
