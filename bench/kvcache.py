"""Disk KV cache: restoring a session from a ``.kv`` file vs re-prefilling the prompt.

For each prompt length N (default 2k / 8k / 32k tokens on the ``small`` synthetic model):

* ``prefill``   seconds to sync N tokens into a fresh session (what a cache miss costs);
* ``store``     seconds for ``KVCache.store`` (save payload + write + fsync + rename);
* ``restore``   seconds for ``KVCache.prepare`` on the same text: directory scan, read, SHA-1 and
                payload checks, ``Session.load_payload`` (the file is in the page cache: it was
                just written, so this is the warm-cache figure);
* ``load_payload`` seconds for ``Session.load_payload`` alone on bytes in memory;
* file bytes, and bytes per cached token.

    PYTHONPATH=python python bench/kvcache.py                        # small model, 2k/8k/32k
    PYTHONPATH=python python bench/kvcache.py --model tiny --sizes 512,1024 --repeats 3
    PYTHONPATH=python python bench/kvcache.py --json out.json --baseline old.json

Prints a table; ``--json`` writes {"machine": ..., "results": [{name, unit, median, min, max,
samples, extra}]}; ``--baseline`` prints new/old ratios of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))

WORDS = ("the cache keeps every token of a long prompt so the next request only pays for the new "
         "part ; restore reads the file and loads the payload 12 345 x+y=z def f(a, b): return a*b "
         "KV rows compress by four and by 128").split()


def prompt_of(tokenizer, n_tokens: int) -> tuple[str, list[int]]:
    """A rendered prompt of about ``n_tokens`` tokens (BOS + prose) and its tokens."""
    bos = "<｜begin▁of▁sentence｜>"
    words = []
    i = 0
    while True:
        words.extend(WORDS[(i * 7 + k) % len(WORDS)] for k in range(64))
        i += 1
        text = bos + " ".join(words)
        toks = tokenizer.encode_rendered(text)
        if len(toks) >= n_tokens:
            break
    # Cut at a token boundary. Re-tokenizing the cut text may merge differently at the very end,
    # so the prompt is whatever that text tokenizes to (N +- a token).
    cut = tokenizer.decode_bytes(toks[:n_tokens]).decode("utf-8", "ignore")
    return cut, tokenizer.encode_rendered(cut)


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def result(name: str, unit: str, values: list[float], **extra) -> dict:
    return {"name": name, "unit": unit, "median": statistics.median(values), "min": min(values),
            "max": max(values), "samples": values, "extra": extra}


def machine_info(threads: int) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "unknown"
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "platform": platform.platform(),
            "python": sys.version.split()[0], "git_commit": commit, "threads": threads,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="small", help="preset name (ds4.testing.cached_model) or GGUF path")
    p.add_argument("--sizes", default="2048,8192,32768", help="prompt lengths in tokens, comma separated")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per figure (median reported)")
    p.add_argument("--prefill-repeats", type=int, default=1, help="timed prefills per size (they are slow)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dir", type=Path, default=None, help="cache directory (default: a temp dir, removed)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--baseline", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="tiny model, 256/1024 tokens, 2 repeats")
    p.add_argument("--estimate", action="store_true",
                   help="no engine: payload bytes per token from the §6.1 size formula (cold-prefill row counts)")
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.sizes, args.repeats = "tiny", "256,1024", 2
    if args.estimate:
        return estimate(args)

    import ds4
    import ds4.testing
    from ds4.kvcache import KVCache

    path = Path(args.model) if os.path.exists(args.model) else ds4.testing.cached_model(args.model)
    eng = ds4.Engine(path, threads=args.threads)
    tok = eng.tokenizer
    sizes = [int(s) for s in args.sizes.split(",")]
    tmp = args.dir or Path(tempfile.mkdtemp(prefix="ds4-kvbench-"))
    results, rows = [], []
    try:
        for n in sizes:
            ctx = n + 1024
            text, tokens = prompt_of(tok, n)
            n = len(tokens)
            cache = KVCache(tmp / f"n{n}", max_bytes=1 << 40, min_tokens=1, cold_max_tokens=0,
                            continued_interval=0)
            live = eng.session(ctx=ctx)

            def prefill():
                live.reset() if hasattr(live, "reset") else None
                live.sync(tokens)

            t_prefill = timed(prefill, args.prefill_repeats)
            entries = []
            t_store = timed(lambda: entries.append(_store_fresh(cache, live, eng)), args.repeats)
            entry = entries[-1]
            payload = live.save_payload()

            sessions = [eng.session(ctx=ctx) for _ in range(args.repeats)]
            prepared = []
            t_restore = timed(lambda: prepared.append(cache.prepare(sessions[len(prepared)], text, eng)),
                              args.repeats)
            assert all(pp.source == "disk" and pp.cached_tokens == n for pp in prepared), "restore missed"
            target = eng.session(ctx=ctx)
            t_load = timed(lambda: target.load_payload(payload), args.repeats)

            res = [
                result(f"prefill_{n}", "s", t_prefill, tokens=n),
                result(f"store_{n}", "s", t_store, tokens=n),
                result(f"restore_{n}", "s", t_restore, tokens=n),
                result(f"load_payload_{n}", "s", t_load, tokens=n),
                result(f"file_bytes_{n}", "B", [float(entry.file_size)], tokens=n),
                result(f"bytes_per_token_{n}", "B/token", [entry.file_size / n], tokens=n),
            ]
            results += res
            med = {r["name"].rsplit("_", 1)[0]: r["median"] for r in res}
            rows.append({"tokens": n, "prefill_s": med["prefill"], "restore_s": med["restore"],
                         "speedup": med["prefill"] / med["restore"], "load_payload_s": med["load_payload"],
                         "store_s": med["store"], "file_MiB": entry.file_size / 2**20,
                         "B/token": entry.file_size / n})
    finally:
        if args.dir is None:
            shutil.rmtree(tmp, ignore_errors=True)

    cols = ["tokens", "prefill_s", "restore_s", "speedup", "load_payload_s", "store_s", "file_MiB", "B/token"]
    base = {}
    if args.baseline:
        base = {r["name"]: r["median"] for r in json.loads(args.baseline.read_text())["results"]}
        cols.append("restore new/old")
        for row in rows:
            old = base.get(f"restore_{row['tokens']}")
            row["restore new/old"] = row["restore_s"] / old if old else float("nan")
    print(f"model {path.name}  threads {args.threads}  repeats {args.repeats} (prefill {args.prefill_repeats})")
    widths = [max(len(c), 12) for c in cols]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for row in rows:
        print("  ".join(_fmt(row[c]).rjust(w) for c, w in zip(cols, widths)))
    if args.json:
        doc = {"bench": "kvcache", "model": str(path), "machine": machine_info(args.threads), "results": results}
        args.json.write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.json}")
    return 0


def estimate(args) -> int:
    """Payload size from the header formula, for sizes too slow to prefill on this machine."""
    from ds4.payload import PAYLOAD_MAGIC, PayloadHeader, default_prefill_cap, payload_bytes
    from ds4.testing import PRESETS

    if os.path.exists(args.model):
        from ds4.inspection import inspect
        shape = inspect(args.model).shape
    else:
        shape = PRESETS[args.model]
    print(f"estimate for {args.model}: payload bytes (no text, no KVC header), n_comp = T // ratio")
    print(f"{'tokens':>8s} {'payload_MiB':>12s} {'B/token':>10s}")
    for n in (int(x) for x in args.sizes.split(",")):
        ctx = n + 1024
        rows = min(shape.n_swa, n)
        h = PayloadHeader(PAYLOAD_MAGIC, 1, ctx, default_prefill_cap(ctx), rows, rows, ctx // 4 + 2, n,
                          shape.n_layer, shape.head_dim, shape.indexer_head_dim, shape.n_vocab, rows)
        size = payload_bytes(h, [n // r if r else 0 for r in shape.compress_ratios],
                             [n // r if r == 4 else 0 for r in shape.compress_ratios], shape.compress_ratios)
        print(f"{n:8d} {size / 2**20:12.2f} {size / n:10.0f}")
    return 0


def _store_fresh(cache, session, eng):
    """Store from scratch each time (an existing identical file would be kept, not rewritten)."""
    for e in cache.entries():
        cache.remove(e)
    entry = cache.store(session, "cold", eng)
    if entry is None:
        raise SystemExit("store was skipped; see the ds4.kvcache log")
    return entry


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


if __name__ == "__main__":
    sys.exit(main())
