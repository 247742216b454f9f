"""CPU kernel throughput: weight bytes streamed per second by matvec, next to the machine's copy
bandwidth, and matmul GFLOP/s next to numpy float32 `@` on the same shape.

    PYTHONPATH=python python bench/kernels.py --threads 2 --json /tmp/kernels.json
    PYTHONPATH=python python bench/kernels.py --paths all --baseline /tmp/kernels.json

Shapes: a dense 4096 x 4096 matvec per weight type; a Flash-like routed expert tensor of 256
experts x 2048 rows x 4096 (6 experts selected per call, a different set each call so the
selected weights come from memory, not cache; --expert-shapes picks others, e.g. the short rows of
the `small` / `bench` models: 1024x512,512x1024,2048x256,256x2048); matmul 4096 x 4096 at batch 64 and 512 next to the measured int8 dot peak (int8_peak below); routed
experts for a prefill batch (64 / 512 tokens x 6 of 256 experts), batched (matmul_experts) vs
token by token (matvec_experts); F16/BF16 decode and small batches at the small model's F16
shapes (section "half").
Weights are random valid blocks built in memory (finite f16 scales, any codes).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (Result, add_common_args, copy_bandwidth, machine_info, measure, read_bandwidth, report,  # noqa: E402
                     time_call)

import ds4._core as core  # noqa: E402

DENSE_TYPES = (Q.F16, Q.BF16, Q.Q8_0, Q.Q2_K, Q.Q4_K, Q.IQ2_XXS)
EXPERT_TYPES = (Q.IQ2_XXS, Q.Q2_K, Q.Q4_K)
MATMUL_TYPES = (Q.Q8_0, Q.Q2_K, Q.Q4_K, Q.IQ2_XXS, Q.F16, Q.BF16)
SCALE_FIELDS = {Q.Q8_0: (0,), Q.Q2_K: (80, 82), Q.Q4_K: (0, 2), Q.IQ2_XXS: (0,)}


def random_weights(qtype: Q, n: int, rows: int, seed: int = 0, chunk_mb: int = 32) -> np.ndarray:
    """uint8 bytes of a [rows x n] tensor; a random chunk is tiled to keep huge tensors cheap."""
    rng = np.random.default_rng(seed)
    be, bb = GGML_QUANT_SIZES[qtype]
    nbytes = n * rows // be * bb
    if qtype == Q.F16:
        chunk = rng.standard_normal(min(nbytes, chunk_mb << 20) // 2).astype(np.float16).view(np.uint8)
    elif qtype == Q.BF16:
        f = rng.standard_normal(min(nbytes, chunk_mb << 20) // 2).astype(np.float32)
        chunk = (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    else:
        nblk = max(1, min(nbytes, chunk_mb << 20) // bb)
        blocks = rng.integers(0, 256, size=(nblk, bb), dtype=np.uint8)
        for off in SCALE_FIELDS[qtype]:
            scales = (np.exp2(rng.uniform(-12, -4, nblk))).astype(np.float16)
            blocks[:, off : off + 2] = scales.view(np.uint8).reshape(nblk, 2)
        chunk = blocks.reshape(-1)
    return np.resize(chunk, nbytes)  # repeats the chunk: whole blocks since chunk is block-aligned


def bench_dense(args, paths, copy_gbs, results, rows_out):
    n = rows = 1024 if args.quick else 4096
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    for qtype in DENSE_TYPES:
        raw = random_weights(qtype, n, rows)
        for path in paths:
            core.set_simd_path(path)
            secs = time_call(lambda: core.matvec(int(qtype), raw, (n, rows), x), args.repeats, warmup=2, min_time=0.05)
            name = f"matvec/{qtype.name}/{n}x{rows}/{path}/t{args.threads}"
            r = measure(name, "GB/s", [raw.size / s / 1e9 for s in secs], bytes=int(raw.size))
            results.append(r)
            rows_out.append({"case": f"matvec {n}x{rows}", "type": qtype.name, "path": path, "GB/s": r.median,
                             "spread": f"{r.min:.3g}-{r.max:.3g}", "of_copy": r.median / copy_gbs,
                             "_names": {"GB/s": name}})


HALF_SHAPES = ((1024, 1024), (512, 2048), (1024, 64), (4096, 24), (4096, 4096))  # n x rows


def bench_half(args, paths, results, rows_out):
    """F16/BF16 weights at the shapes of the small model's F16 tensors (compressor 1024 x 1024,
    indexer q_b 512 x 2048, router 1024 x 64, hyper-connection 4096 x 24) and 4096 x 4096: decode
    (batch 1) and small batches (2, 4: speculative verification), each weight byte read once per
    call. Enough copies of a matrix are cycled (>= 64 MiB) that the weights come from memory."""
    total = (16 if args.quick else 64) << 20
    rng = np.random.default_rng(6)
    for qtype in (Q.F16, Q.BF16):
        for n, rows in HALF_SHAPES:
            one = random_weights(qtype, n, rows, seed=7)
            copies = [one.copy() for _ in range(max(1, min(256, total // one.size)))]
            for nb in (1, 2, 4):
                X = rng.standard_normal((nb, n)).astype(np.float32)
                for path in paths:
                    core.set_simd_path(path)
                    if nb == 1:
                        fn = lambda: [core.matvec(int(qtype), w, (n, rows), X[0]) for w in copies]  # noqa: E731
                    else:
                        fn = lambda: [core.matmul(int(qtype), w, (n, rows), X) for w in copies]  # noqa: E731
                    secs, cpu = time_and_cpu(fn, args.repeats)
                    streamed = one.size * len(copies)
                    name = f"half/{qtype.name}/{n}x{rows}/b{nb}/{path}/t{args.threads}"
                    r = measure(name, "GB/s", [streamed / s / 1e9 for s in secs], bytes=int(streamed))
                    rc = measure(name + "/per_cpu_s", "GB/s", [streamed / c / 1e9 for c in cpu])
                    results += [r, rc]
                    rows_out.append({"case": f"{n}x{rows} b={nb}", "type": qtype.name, "path": path, "GB/s": r.median,
                                     "spread": f"{r.min:.3g}-{r.max:.3g}", "GB/cpu-s": rc.median,
                                     "us/call": 1e6 * float(np.median(secs)) / len(copies),
                                     "_names": {"GB/s": name}})
            del copies


def expert_shapes(spec: str, quick: bool) -> list[tuple[int, int, int]]:
    """(n, rows, n_expert) per comma item 'NxROWS' or 'NxROWSxEXPERTS'. Without EXPERTS the count
    is chosen so the tensor is ~256 MiB (32 MiB with --quick): larger than the caches, so the
    selected experts stream from memory as in decode."""
    out = []
    for item in spec.split(","):
        parts = [int(v) for v in item.lower().split("x")]
        n, rows = parts[0], parts[1]
        if len(parts) > 2:
            n_expert = parts[2]
        else:
            per_expert = rows * n // 256 * 84  # Q2_K (the largest of the 2-bit types) bytes
            n_expert = max(8, ((32 if quick else 256) << 20) // per_expert)
        out.append((n, rows, n_expert))
    return out


def bench_experts(args, paths, copy_gbs, results, rows_out):
    spec = args.expert_shapes or f"4096x2048x{32 if args.quick else 256}"
    for n, rows, n_expert in expert_shapes(spec, args.quick):
        _bench_experts_shape(args, paths, copy_gbs, results, rows_out, n, rows, n_expert)


def _bench_experts_shape(args, paths, copy_gbs, results, rows_out, n, rows, n_expert):
    k = 6
    rng = np.random.default_rng(2)
    x = rng.standard_normal(n).astype(np.float32)
    id_sets = [rng.choice(n_expert, size=k, replace=False).astype(np.int32) for _ in range(64)]
    for qtype in EXPERT_TYPES:
        raw = random_weights(qtype, n, rows * n_expert)
        streamed = k * rows * core.row_bytes(int(qtype), n)
        for path in paths:
            core.set_simd_path(path)
            it = iter(range(10**9))
            def call():
                return core.matvec_experts(int(qtype), raw, (n, rows, n_expert), id_sets[next(it) % 64], x)

            secs = time_call(call, args.repeats, warmup=2, min_time=0.05)
            # CPU time as well: under load the wall figures swing several-fold, CPU time does not
            # (docs/kernels.md "Measuring"); GB/cpu-s is per thread busy, best-of is the kernel's speed.
            cpu = time_call(call, args.repeats, warmup=0, min_time=0.05, clock=time.process_time)
            name = f"experts/{qtype.name}/{n_expert}x{rows}x{n}/k{k}/{path}/t{args.threads}"
            r = measure(name, "GB/s", [streamed / s / 1e9 for s in secs], bytes=int(streamed))
            rc = measure(name + "/per_cpu_s", "GB/s", [streamed / c / 1e9 for c in cpu])
            results += [r, rc]
            rows_out.append({"case": f"experts {n_expert}x{rows}x{n} k={k}", "type": qtype.name, "path": path,
                             "GB/s": r.median, "spread": f"{r.min:.3g}-{r.max:.3g}", "of_copy": r.median / copy_gbs,
                             "GB/cpu-s": rc.median, "GB/cpu-s best": rc.max, "_names": {"GB/s": name}})
        del raw


def int8_peak(threads: int) -> dict:
    """The machine's int8 dot-product peak, measured: core.int8_dot_peak runs 12 independent
    vpdpbusd zmm chains (64 int8 multiply-adds each) on every pool thread at once. Counted as 2 ops
    per multiply-add, like the GEMM's 2*n*rows*batch. 'wall' is ops / wall time (what the threads
    got, under whatever else runs); 'core' is ops per second of thread CPU time (one core's rate,
    load-resistant). Zeros where the CPU/build lacks AVX-512 VNNI."""
    p = max((core.int8_dot_peak(20_000_000) for _ in range(3)), key=lambda p: p["macs"] / max(p["wall_s"], 1e-12))
    if p["macs"] == 0:
        return {"wall": 0.0, "core": 0.0}
    return {"wall": 2 * p["macs"] / p["wall_s"] / 1e9, "core": 2 * p["macs"] / p["cpu_s"] / 1e9}


def time_and_cpu(fn, repeats: int) -> tuple[list[float], list[float]]:
    """(wall seconds, process CPU seconds) per call: CPU time counts only the time the threads ran."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def bench_matmul(args, paths, results, rows_out):
    n = rows = 1024 if args.quick else 4096
    peak = int8_peak(args.threads)
    name = f"int8_peak/t{args.threads}"
    results.append(measure(name + "/wall", "GOPS", [peak["wall"]]))
    results.append(measure(name + "/core", "GOPS", [peak["core"]]))
    print(f"int8 dot peak (vpdpbusd loop on {args.threads} threads): {peak['wall']:.0f} GOPS wall, "
          f"{peak['core']:.0f} GOPS per core-second of CPU time")
    for nb in (64, 512):
        X = np.random.default_rng(3).standard_normal((nb, n)).astype(np.float32)
        flops = 2.0 * n * rows * nb
        ours = []
        for qtype in MATMUL_TYPES:
            raw = random_weights(qtype, n, rows)
            for path in paths:
                core.set_simd_path(path)
                reps = max(3, args.repeats // 2) if nb == 512 else args.repeats
                secs, cpu = time_and_cpu(lambda: core.matmul(int(qtype), raw, (n, rows), X), reps)
                name = f"matmul/{qtype.name}/{n}x{rows}/b{nb}/{path}/t{args.threads}"
                r = measure(name, "GFLOP/s", [flops / s / 1e9 for s in secs])
                rc = measure(name + "/per_cpu_s", "GFLOP/s", [flops / c / 1e9 for c in cpu])
                results += [r, rc]
                row = {"case": f"matmul b={nb}", "type": qtype.name, "path": path, "GFLOP/s": r.median,
                       "spread": f"{r.min:.3g}-{r.max:.3g}", "GFLOP/cpu-s": rc.median, "_names": {"GFLOP/s": name}}
                if peak["core"] > 0:
                    # wall rate / wall peak (same threads, same load), and CPU-time rate / one core's rate.
                    row["of_peak"] = r.median / peak["wall"]
                    row["cpu_of_peak"] = rc.median / peak["core"]
                ours.append(row)
        # numpy last: OpenBLAS's threads keep spinning for a while after a call, and in this process
        # they would take cores (and CPU time) from the rows measured right after them.
        wf = np.random.default_rng(4).standard_normal((rows, n)).astype(np.float32)
        secs = time_call(lambda: X @ wf.T, args.repeats, warmup=1, min_time=0.05)
        name = f"matmul/numpy_f32/{n}x{rows}/b{nb}"
        r = measure(name, "GFLOP/s", [flops / s / 1e9 for s in secs])
        results.append(r)
        del wf
        rows_out.append({"case": f"matmul b={nb}", "type": "numpy f32 @", "path": "blas", "GFLOP/s": r.median,
                         "spread": f"{r.min:.3g}-{r.max:.3g}", "_names": {"GFLOP/s": name}})
        for row in ours:
            row["vs_numpy"] = row["GFLOP/s"] / r.median
        rows_out.extend(ours)


def bench_experts_prefill(args, results, rows_out):
    n, rows, n_expert, k = 4096, 2048, (32 if args.quick else 256), 6
    rng = np.random.default_rng(5)
    for qtype in (Q.IQ2_XXS, Q.Q2_K):
        raw = random_weights(qtype, n, rows * n_expert)
        for nt in (64, 512):
            ids = np.stack([rng.choice(n_expert, size=k, replace=False) for _ in range(nt)]).astype(np.int32)
            X = rng.standard_normal((nt, n)).astype(np.float32)
            flops = 2.0 * n * rows * k * nt
            for mode in ("batched", "per_token"):
                if mode == "batched":
                    fn = lambda: core.matmul_experts(int(qtype), raw, (n, rows, n_expert), ids, X)  # noqa: E731
                else:
                    fn = lambda: [core.matvec_experts(int(qtype), raw, (n, rows, n_expert), ids[b], X[b])  # noqa: E731
                                  for b in range(nt)]
                reps = 2 if (mode == "per_token" and nt == 512) else max(2, args.repeats // 2)
                secs = time_call(fn, reps, warmup=0)
                name = f"experts_prefill/{qtype.name}/{n_expert}x{rows}x{n}/k{k}/t{nt}/{mode}/t{args.threads}"
                r = measure(name, "GFLOP/s", [flops / s / 1e9 for s in secs])
                results.append(r)
                rows_out.append({"case": f"experts prefill T={nt}", "type": qtype.name, "path": mode,
                                 "GFLOP/s": r.median, "spread": f"{r.min:.3g}-{r.max:.3g}", "_names": {"GFLOP/s": name}})
        del raw


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--paths", default="active", help="'active', 'all' or a comma list (scalar,avx2,avx512)")
    p.add_argument("--only", default="dense,experts,half,matmul,experts_prefill", help="comma list of sections to run")
    p.add_argument("--expert-shapes", default="",
                   help="routed-expert matvec shapes, comma list of NxROWS[xEXPERTS] (row length x rows per "
                        "expert; default 4096x2048x256, Flash-like; the `small` model's are 1024x512,512x1024, "
                        "`bench`'s 2048x256,256x2048)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = min(args.repeats, 3)
    core.set_threads(args.threads)
    active = core.simd_path()
    paths = core.simd_paths() if args.paths == "all" else [active] if args.paths == "active" else args.paths.split(",")
    sections = set(args.only.split(","))

    results: list[Result] = []
    copy = copy_bandwidth(64 if args.quick else 256, repeats=args.repeats)
    results.append(copy)
    print(f"copy bandwidth (1 thread, numpy): {copy.median:.2f} GB/s (min {copy.min:.2f}, max {copy.max:.2f})")
    read = read_bandwidth(args.threads, 64 if args.quick else 256, repeats=args.repeats)
    results.append(read)
    print(f"read bandwidth ({args.threads} threads, ds4 stream_read): {read.median:.2f} GB/s "
          f"(min {read.min:.2f}, max {read.max:.2f}); decode is bandwidth-bound when matvec GB/s is near it")
    try:
        if sections & {"dense", "experts"}:
            rows_out: list[dict] = []
            if "dense" in sections:
                bench_dense(args, paths, copy.median, results, rows_out)
            if "experts" in sections:
                bench_experts(args, paths, copy.median, results, rows_out)
            for row in rows_out:
                row["of_read"] = row["GB/s"] / read.median
            print(f"\nweight streaming, {args.threads} threads (of_copy / of_read = GB/s / copy / read bandwidth)")
            _table(rows_out, ["case", "type", "path", "GB/s", "spread", "of_copy", "of_read", "GB/cpu-s", "GB/cpu-s best"],
                   results, args)
        if "half" in sections:
            rows_out = []
            bench_half(args, paths, results, rows_out)
            for row in rows_out:
                row["of_read"] = row["GB/s"] / read.median
            print(f"\nF16/BF16 decode and small batches, {args.threads} threads (of_read = GB/s / read bandwidth)")
            _table(rows_out, ["case", "type", "path", "GB/s", "spread", "of_read", "GB/cpu-s", "us/call"], results, args)
        if "matmul" in sections:
            rows_out = []
            bench_matmul(args, paths, results, rows_out)
            print(f"\nmatmul, {args.threads} threads (numpy uses its own BLAS threads)")
            _table(rows_out, ["case", "type", "path", "GFLOP/s", "spread", "vs_numpy", "of_peak", "GFLOP/cpu-s",
                              "cpu_of_peak"], results, args)
        if "experts_prefill" in sections:
            rows_out = []
            bench_experts_prefill(args, results, rows_out)
            print(f"\nrouted experts over a prefill batch, {args.threads} threads, {core.simd_path()}")
            _table(rows_out, ["case", "type", "path", "GFLOP/s", "spread"], results, args)
    finally:
        core.set_simd_path(active)
    if args.json:
        machine = machine_info(threads=args.threads, simd_paths=core.simd_paths(), copy_gbs=copy.median,
                               read_gbs=read.median)
        report(results, machine, argparse.Namespace(baseline=None, json=args.json), [], [])


def _table(rows, columns, results, args):
    report(results, {}, argparse.Namespace(baseline=args.baseline, json=None), columns, rows)


if __name__ == "__main__":
    main()
