// Switches for the decode-glue changes (docs/kernels.md, "Decode glue"), all on by default, and
// the Q8_0 matvec's prefetch distance. They change only timing, never a result: tests flip them
// to prove that, and benches flip them to compare both sides in one process (A/B under a loaded
// machine's noise).
#pragma once
#include <atomic>

namespace ds4 {

struct DecodeSwitches {
    std::atomic<bool> tapered{true};  // weight-streaming products use Split::Tapered (quant/matvec.cpp)
    std::atomic<bool> warm_hc{true};  // hc_pre's side job warms the mix weights (backend/cpu)
    std::atomic<bool> prewake{true};  // a CPU command batch wakes the pool's workers first
    // Bytes ahead of the row that the Q8_0 matvec (and matvec_group's Q8_0 parts) software-
    // prefetches into L2, 0: none (quant/matvec.cpp; docs/kernels.md, "The Q8_0 weight streaming
    // at 2 threads"). 3 KiB before; a timing knob like the others, never a result.
    std::atomic<int> q8_prefetch{16384};
    // Where the Q8_0 prefetches are issued: inside the one-activation kernel, a few per 16 blocks as
    // it goes (true), or by matvec before each row, the whole row at once (false: a burst of
    // row_bytes / 64 prefetches, which stalls on long rows).
    std::atomic<bool> q8_prefetch_inline{true};
    // The same for F16/BF16 rows in half_block's few-token forms (quant/dot_half_tile.inc); 2 KiB before.
    std::atomic<int> half_prefetch{8192};
};

DecodeSwitches& decode_switches();

}  // namespace ds4
