"""Where a prefill's CPU time goes, from `perf script` output of a frame-pointer build.

    cmake -S . -B build/prof -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
          "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O3 -g -DNDEBUG -fno-omit-frame-pointer" \
          -DDS4_DEV_OUTPUT_DIR=$PWD/python/ds4 && cmake --build build/prof
    perf record -F 999 -g -e cpu-clock -o prefill.data python my_prefill.py   # 2 threads, a few prefills
    perf script -i prefill.data -F tid,ip,sym > prefill.txt
    python scripts/prefill_profile.py prefill.txt

(RelWithDebInfo, because pybind11 strips a Release module; the explicit flags keep Release's -O3.)
Only samples inside a forward pass count: the calling thread's under `forward_batch`, and the pool
workers'. Three tables (docs/gemm.md, "Prefill profile"):
  * kernel kinds, by the innermost frame a pattern below matches (every thread);
  * stream ops (CpuStream::<op>) of the calling thread's samples; a worker's stack does not show
    which op queued its range, so this table covers the calling thread only;
  * serial work: the calling thread's samples outside any pool job, i.e. while the other threads
    wait. With T threads a serial share s of the CPU is about s / (s + (1 - s) / T) of the wall time.
"""

from __future__ import annotations

import argparse
import collections
import re

# (pattern on a frame, kind): the first frame from the leaf outwards that matches one decides.
KINDS = [
    (r"tile_q8_0|decode_q8_0|q8_0_isum", "GEMM Q8_0 (tiles + panel decode)"),
    (r"tile_iq2_xxs|decode_iq2_xxs", "GEMM IQ2_XXS experts (tiles + panel decode)"),
    (r"tile_q2_k|decode_q2_k", "GEMM Q2_K experts (tiles + panel decode)"),
    (r"tile_q4_k|decode_q4_k", "GEMM Q4_K (tiles + panel decode)"),
    (r"half_tile|half_block|matmul_half", "F16/BF16 tiles"),
    (r"attend_queries|attend\b|attention", "attention"),
    (r"quantize_q8_0_act|quantize_q8_K|quantize_act", "activation quantisation"),
    (r"q8_0_dot|dot_q|lanes_row_dots|matvec|dot_n|dot_rows", "row kernels (matvec, experts below the GEMM)"),
    (r"hc_post|hc_pre|hc_split|hc_weighted|sinkhorn|hc_collapse", "hyper-connections"),
    (r"compressor|indexer|select_top_k|hadamard|fp4_roundtrip", "compressor / indexer"),
    (r"route_token|topk_desc", "router"),
    (r"routed_experts_batch|matmul_experts|gemm_grouped$|corrections", "MoE gather / corrections / slot sums"),
    (r"rope_tail", "RoPE"),
    (r"rms_norm", "RMSNorm"),
    (r"swiglu", "SwiGLU"),
    (r"fp8|store_row_f16|f16_round", "FP8 / f16 rounding"),
    (r"spin_until|worker_loop|run_tasks|_M_run|ThreadPool|futex|schedule", "thread pool (spin, wake, dispatch)"),
]
OP = re.compile(r"CpuStream::(\w+)")


def read_samples(path: str) -> list[tuple[str, list[str]]]:
    """(tid, stack from the leaf outwards) per sample of `perf script -F tid,ip,sym`."""
    out: list[tuple[str, list[str]]] = []
    tid, stack = None, []
    for line in open(path, errors="replace"):
        if not line.strip():
            if tid is not None:
                out.append((tid, stack))
            tid, stack = None, []
        elif not line.startswith("\t"):
            tid, stack = line.split()[0], []
        else:
            parts = line.strip().split(None, 1)
            stack.append(parts[1] if len(parts) > 1 else "?")
    if tid is not None:
        out.append((tid, stack))
    return out


def kind_of(stack: list[str]) -> str:
    for frame in stack:
        for rx, kind in KINDS:
            if re.search(rx, frame):
                return kind
    return "other: " + (stack[0][:40] if stack else "?")


def table(title: str, counts: collections.Counter, total: int, limit: int) -> None:
    print(f"\n{title} ({sum(counts.values())} samples; shares of {total})")
    for key, n in counts.most_common(limit):
        print(f"{100 * n / total:6.2f} %  {n:6d}  {key}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("perf_script_output")
    ap.add_argument("--threads", type=int, default=2, help="threads of the profiled run (for the wall estimate)")
    ap.add_argument("--limit", type=int, default=20, help="rows per table")
    args = ap.parse_args()
    samples = [(t, s) for t, s in read_samples(args.perf_script_output)
               if any("forward_batch" in f or "start_workers" in f for f in s)]
    if not samples:
        raise SystemExit("no samples inside a forward pass (a build without frame pointers?)")
    caller = next(t for t, s in samples if any("forward_batch" in f for f in s))
    kinds, ops, serial = collections.Counter(), collections.Counter(), collections.Counter()
    for tid, stack in samples:
        kinds[kind_of(stack)] += 1
        if tid != caller:
            continue
        names = [m.group(1) for m in map(OP.search, stack) if m]
        op = names[0] if names else "graph (engine/forward.cpp, session)"
        ops[op] += 1
        if not any("parallel_for" in f or "run_tasks" in f for f in stack):
            serial[f"{op}: {re.sub(r'[(<].*', '', stack[0])[:50]}"] += 1
    total = len(samples)
    print(f"{total} samples in forward passes; threads (tid: samples): "
          f"{dict(collections.Counter(t for t, _ in samples))}, calling thread {caller}")
    table("kernel kinds, all threads", kinds, total, args.limit)
    table("stream ops, calling thread only", ops, sum(ops.values()), args.limit)
    s = sum(serial.values()) / total
    print(f"\nserial (calling thread outside pool jobs): {100 * s:.1f} % of the CPU samples, about "
          f"{100 * s / (s + (1 - s) / args.threads):.1f} % of the wall time at {args.threads} threads")
    table("serial work by op: leaf", serial, total, args.limit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
