#include "common/range_split.h"

#include <algorithm>

namespace ds4 {

int64_t even_task_count(int64_t n, int threads, int64_t min_chunk, int ranges_per_thread) {
    if (n <= 0) return 0;
    if (min_chunk < 1) min_chunk = 1;
    if (ranges_per_thread < 1) ranges_per_thread = 1;
    if (threads <= 1) return 1;
    return std::min<int64_t>((int64_t)ranges_per_thread * threads, std::max<int64_t>(1, n / min_chunk));
}

void split_bounds(int64_t n, int threads, int64_t min_chunk, int ranges_per_thread, Split split,
                  std::vector<int64_t>& bounds) {
    bounds.clear();
    if (n <= 0) return;
    if (min_chunk < 1) min_chunk = 1;
    const int64_t tasks = even_task_count(n, threads, min_chunk, ranges_per_thread);
    bounds.push_back(0);
    if (split == Split::Even || tasks == 1) {
        for (int64_t i = 1; i <= tasks; ++i) bounds.push_back(n * i / tasks);
        return;
    }
    // Guided self-scheduling with a fixed schedule: a range is what is left divided by twice the
    // thread count, never longer than the even split's and never shorter than min_chunk. Near the
    // end the ranges shrink geometrically (by 1 - 1/(2*threads) each), so whichever thread takes
    // the last one, the others wait at most about min_chunk's worth.
    const int64_t even_len = (n + tasks - 1) / tasks;
    const int64_t div = 2 * (int64_t)std::max(threads, 1);
    int64_t pos = 0;
    while (pos < n) {
        const int64_t left = n - pos;
        int64_t len = (left + div - 1) / div;
        len = std::max(len, min_chunk);
        len = std::min(len, even_len);
        len = std::min(len, left);
        pos += len;
        bounds.push_back(pos);
    }
}

}  // namespace ds4
