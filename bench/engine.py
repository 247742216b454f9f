"""Engine benchmark: prefill and decode speed, memory, and decode bandwidth vs the machine's copy bandwidth.

    PYTHONPATH=python python bench/engine.py                       # `small` synthetic model
    PYTHONPATH=python python bench/engine.py --model tiny --prefill 128,512 --depths 0,256
    PYTHONPATH=python python bench/engine.py --baseline old.json   # ratios against an earlier run
    PYTHONPATH=python python bench/engine.py --backend metal       # the Apple GPU (ds4.available_backends())

Prints a table and writes JSON (machine, git commit, threads, median and spread of each figure).
Decode GB/s = weight bytes one decode step reads (dense tensors + the used experts) / step time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def copy_bandwidth_gbs(nbytes: int = 256 << 20, reps: int = 5) -> float:
    """Median memcpy bandwidth (read + write bytes per second) of a large numpy copy."""
    a = np.ones(nbytes // 8)
    b = np.empty_like(a)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - t)
    return 2 * nbytes / statistics.median(times) / 1e9


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        return "unknown"


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def warm_file(path: Path) -> None:
    """Read the model file through the page cache. The weights are mapped, not copied, so a timing
    must not include reading them from disk: on hosts that page out cold memory (the development
    VMs run DAMON's proactive pageout of pages idle for ~1 s) the first prefill after a pause
    otherwise measured 118-153 instead of ~400 tokens/s (docs/bench.md). The read goes through a
    map that asks for 2 MiB pages, as the engine's does, so pages read back from disk return as
    2 MiB folios; read() would bring them back in small ones (docs/pagecache.md). It runs in a
    child process so that the map does not count in this process's peak RSS."""
    _in_child("pagecache.probe", path)


def _in_child(fn: str, path: Path) -> str:
    """Run ds4.<fn>(path) in a child process (its map must not count in this process's peak RSS);
    returns what it prints (the page-cache state)."""
    code = f"import sys; from ds4 import pagecache; print({fn}(sys.argv[1]))"
    return subprocess.run([sys.executable, "-c", code, str(path)], check=True, capture_output=True, text=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="small", help="ds4.testing preset name or a GGUF path")
    ap.add_argument("--experts", default="q2", choices=["q2", "q4"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--backend", default="auto", help="cpu, metal, metal-emu, ... (ds4.available_backends())")
    ap.add_argument("--prefill", default="512,2048,8192", help="prompt lengths")
    ap.add_argument("--depths", default="0,2048,8192", help="context depths for decode")
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the results as JSON to this file")
    ap.add_argument("--baseline", default=None)
    ap.add_argument("--no-warm", action="store_true",
                    help="do not read the model file before each timed section (see warm_file)")
    ap.add_argument("--page-cache", default="huge", choices=["huge", "as-is"],
                    help="huge (default): first re-read the model file into 2 MiB page-cache pages "
                         "(ds4.pagecache.recache); as-is: leave the page cache alone (docs/pagecache.md)")
    args = ap.parse_args()

    import ds4
    import ds4.testing

    path = Path(args.model) if Path(args.model).is_file() else ds4.testing.cached_model(args.model, experts=args.experts)
    # One read of the file before the sections' own warm-ups; the call reports its page-cache state.
    if args.page_cache == "huge":
        page_cache = _in_child("pagecache.recache", path)
    elif not args.no_warm:
        page_cache = _in_child("pagecache.probe", path)
    else:
        page_cache = "not read (--page-cache as-is --no-warm)"
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    eng = ds4.Engine(path, backend=args.backend, threads=args.threads)
    vocab = eng.shape.n_vocab
    prefill = [int(x) for x in args.prefill.split(",") if x]
    depths = [int(x) for x in args.depths.split(",") if x]
    ctx = max(prefill + [d + args.decode_steps for d in depths]) + 8
    rng = np.random.default_rng(0)
    results: dict[str, dict] = {}
    rows = []

    for n in prefill:
        times, cpu = [], []
        for _ in range(args.reps):
            s = eng.session(ctx=ctx)
            toks = rng.integers(0, vocab, n).tolist()
            if not args.no_warm:
                warm_file(path)
            t, c = time.perf_counter(), time.process_time()
            s.sync(toks)
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        tps = [n / x for x in times]
        # CPU ms per token (all threads): the work done, less sensitive to other load than tok/s.
        cms = [1e3 * x / n for x in cpu]
        results[f"prefill_{n}_tok_s"] = summary(tps)
        results[f"prefill_{n}_cpu_ms_per_tok"] = summary(cms)
        rows.append((f"prefill {n}", f"{statistics.median(tps):.1f} tok/s  {statistics.median(cms):.2f} CPU ms/token"))

    wbytes = eng._model.decode_weight_bytes
    kv_bytes = 0
    for d in depths:
        s = eng.session(ctx=ctx)
        kv_bytes = s.kv_bytes
        if d:
            s.sync(rng.integers(0, vocab, d).tolist())
        else:
            s.eval(1)
        if not args.no_warm:
            warm_file(path)
        times = []
        c0 = time.process_time()
        for _ in range(args.decode_steps):
            t = time.perf_counter()
            s.eval(int(rng.integers(0, vocab)))
            times.append(time.perf_counter() - t)
        # CPU ms per token (all threads, pool spin included): on a loaded machine wall time swings
        # with the CPU share the process gets; compare builds on this figure there.
        cms = 1e3 * (time.process_time() - c0) / max(1, args.decode_steps)
        tps = [1 / x for x in times]
        gbs = [wbytes / x / 1e9 for x in times]
        results[f"decode_depth_{d}_tok_s"] = summary(tps)
        results[f"decode_depth_{d}_GB_s"] = summary(gbs)
        results[f"decode_depth_{d}_cpu_ms_per_tok"] = summary([cms])
        rows.append((f"decode @{d}", (statistics.median(tps), statistics.median(gbs), cms)))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # before the copy test's buffers
    bw = copy_bandwidth_gbs()
    rows = [(n, v if isinstance(v, str) else
             f"{v[0]:.2f} tok/s  {v[1]:.2f} GB/s ({100 * v[1] / bw:.0f}% of copy bw)  {v[2]:.2f} CPU ms/token")
            for n, v in rows]
    rows += [("copy bandwidth", f"{bw:.2f} GB/s"), ("weights/decode step", f"{wbytes / 1e6:.1f} MB"),
             ("model file", f"{eng._model.file_bytes / 1e6:.1f} MB"), ("KV bytes (ctx %d)" % ctx, f"{kv_bytes / 1e6:.1f} MB"),
             ("peak RSS", f"{peak / 1e6:.1f} MB (before open {rss0 / 1e6:.1f} MB)")]
    out = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": sys.version.split()[0]},
           "git": git_commit(), "model": str(path), "backend": eng.backend, "threads": eng.threads, "ctx": ctx,
           "copy_bandwidth_GB_s": bw, "decode_weight_bytes": wbytes, "kv_bytes": kv_bytes, "peak_rss": peak,
           "results": results}
    base = json.loads(Path(args.baseline).read_text())["results"] if args.baseline else {}
    w = max(len(r[0]) for r in rows)
    print(f"ds4 engine bench: {path.name}, backend {eng.backend}, {eng.threads} threads, git {out['git']}")
    print(f"  page cache: {page_cache}")
    for name, val in rows:
        print(f"  {name:<{w}}  {val}")
    for k, v in results.items():
        if k in base:
            print(f"  {k}: x{v['median'] / base[k]['median']:.2f} vs baseline")
    if args.json:  # like the other benches: a file only when asked for (none left in the working tree)
        Path(args.json).write_text(json.dumps(out, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
