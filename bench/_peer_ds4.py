"""ds4 side of bench/llama_peer.py: the same measurements as llama_peer_driver.cpp, same JSON.

    python bench/_peer_ds4.py MODEL IDS THREADS CTX PREFILLS DECODE WARMUP [LOGITS_OUT]

IDS is a file of little-endian int32 ids. WARMUP ids are evaluated first (not timed, like the
driver's warmup); each prefill length is a prefix of IDS synced on an empty session (the logits of
its last position come with it); DECODE greedy steps (eval + argmax) continue the first prompt.
LOGITS_OUT, if given, receives the float32 logits of the first prompt's last position.
Run as its own process so its peak RSS is ds4's alone (plus the interpreter's).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def proc_kb_bytes(proc_file: str, key: str) -> int:
    """A "key: N kB" line of a /proc/self file, in bytes (0 where unavailable)."""
    try:
        for line in open(proc_file):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM); the parent's wait4 rusage would include the
    high-water mark it had when it forked us."""
    return proc_kb_bytes("/proc/self/status", "VmHWM")


def file_huge_bytes() -> int:
    """Bytes of this process's file maps backed by 2 MiB page-table entries (FilePmdMapped): how
    the weights were read (docs/pagecache.md)."""
    return proc_kb_bytes("/proc/self/smaps_rollup", "FilePmdMapped")


def main(argv: list[str]) -> int:
    model, ids_path, threads, ctx, prefills, n_decode, n_warmup = argv[:7]
    logits_out = argv[7] if len(argv) > 7 else None
    import ds4

    ids = np.fromfile(ids_path, dtype="<i4").tolist()
    prefill_lens = [int(x) for x in prefills.split(",") if x]
    t0 = time.perf_counter()
    eng = ds4.Engine(model, threads=int(threads))
    s = eng.session(ctx=int(ctx))
    load_s = time.perf_counter() - t0
    if int(n_warmup) > 0:
        s.sync(ids[:int(n_warmup)])
    out: dict = {"load_seconds": load_s, "threads": eng.threads, "prefill_chunk": eng.prefill_chunk,
                 "decode_weight_bytes": eng._model.decode_weight_bytes,
                 "prefill": {}, "decode_step_seconds": [], "decode_tokens": []}
    for k, n in enumerate(prefill_lens):
        s.reset()
        t = time.perf_counter()
        s.sync(ids[:n])
        dt = time.perf_counter() - t
        top = s.argmax()
        out["prefill"][str(n)] = {"seconds": dt, "argmax": top}
        if k == 0 and logits_out:
            np.asarray(s.logits, dtype=np.float32).tofile(logits_out)
        if k == 0:  # greedy decode continues the first prompt
            tok = top
            for _ in range(int(n_decode)):
                out["decode_tokens"].append(tok)
                t = time.perf_counter()
                s.eval(tok)
                tok = s.argmax()
                out["decode_step_seconds"].append(time.perf_counter() - t)
    out["peak_rss_bytes"] = peak_rss_bytes()
    out["file_huge_bytes"] = file_huge_bytes()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
