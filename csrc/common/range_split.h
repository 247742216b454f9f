// How ThreadPool::parallel_for cuts [0, n) into the ranges its threads take from a shared counter.
// The cut depends only on (n, threads, min_chunk, ranges_per_thread, split), never on timing, and
// every index lands in exactly one range, so results never depend on it (docs/kernels.md,
// "Decode glue: tapered ranges").
#pragma once
#include <cstdint>
#include <vector>

namespace ds4 {

enum class Split {
    // n_tasks ranges of (nearly) equal length: n*i/n_tasks .. n*(i+1)/n_tasks.
    Even,
    // The even split's range length until about 2*threads such ranges are left, then shorter
    // ranges (a quarter of what is left at 2 threads, down to min_chunk), so the last range one
    // thread runs while the others have nothing left is short. For weight-streaming products,
    // where an even split leaves the caller waiting up to a whole range at the end.
    Tapered,
};

// Number of ranges of the even split (1: run inline).
int64_t even_task_count(int64_t n, int threads, int64_t min_chunk, int ranges_per_thread);

// Fills bounds with b[0] = 0 < b[1] < ... < b[k] = n: the ranges of `split` (k >= 1 when n > 0;
// empty when n <= 0). min_chunk and ranges_per_thread below 1 count as 1.
void split_bounds(int64_t n, int threads, int64_t min_chunk, int ranges_per_thread, Split split,
                  std::vector<int64_t>& bounds);

}  // namespace ds4
