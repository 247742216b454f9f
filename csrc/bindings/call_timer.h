// Per-call timing for the benchmarks' C++ loops (bench/sampling.py): each call timed alone, its
// wall and calling-thread CPU nanoseconds, with the GIL released for the whole loop.
#pragma once

#include <pybind11/pybind11.h>
#include <time.h>

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

namespace ds4_bind {

inline int64_t thread_cpu_ns() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// (wall ns, thread CPU ns) of each of `reps` calls of call(); call() returns false to stop early.
template <class Call>
std::vector<std::pair<int64_t, int64_t>> time_calls(int reps, Call&& call) {
    std::vector<std::pair<int64_t, int64_t>> r;
    r.reserve(reps > 0 ? (size_t)reps : 0);
    pybind11::gil_scoped_release nogil;
    for (int i = 0; i < reps; ++i) {
        const int64_t c0 = thread_cpu_ns();
        const auto w0 = std::chrono::steady_clock::now();
        const bool go_on = call();
        const auto w1 = std::chrono::steady_clock::now();
        const int64_t c1 = thread_cpu_ns();
        if (!go_on) break;
        r.emplace_back(std::chrono::duration_cast<std::chrono::nanoseconds>(w1 - w0).count(), c1 - c0);
    }
    return r;
}

}  // namespace ds4_bind
