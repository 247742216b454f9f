"""In-process A/B of the Q8_0 matvec's software prefetch distance (docs/kernels.md, "The Q8_0
weight streaming at 2 threads").

    PYTHONPATH=python python bench/stream_ab.py --model bench --rounds 30 \
        --prefetch 3072:2048:burst,16384:8192,16384:8192:burst,0:0

Two parts, both alternating the settings round by round in one process (forward, then reverse
order), so every setting sees the same machine load:

* ``head``: the model's output head (the largest Q8_0 matrix, mapped from the GGUF file like the
  engine maps it) as one ``matvec`` per setting, next to ``stream_read`` over the same bytes (the
  read bandwidth: the ceiling). Prints CPU ms (both threads) and wall ms per pass, GB per
  CPU-second per thread, and each setting's median paired ratio to the first one.
* ``decode``: one session decodes blocks of ``--block`` steps per setting (random tokens after a
  16-token prompt); step wall time and process CPU time per setting.

The prefetch distance changes timing only, never a result (tests/test_stream_prefetch.py).
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import time

import numpy as np

from _common import decode_switch_ab


def _switches(setting: str) -> dict:
    """'Q8[:HALF[:burst]]' -> the decode switches: bytes ahead for Q8_0 rows and for F16/BF16
    tiles; `burst`: the Q8_0 prefetches issued by matvec before each row instead of inside the
    one-activation kernel (q8_prefetch_inline off)."""
    q8, half, burst = (setting.split(":") + ["", ""])[:3]
    out = dict(q8_prefetch=int(q8), q8_prefetch_inline=burst != "burst")
    if half:
        out["half_prefetch"] = int(half)
    return out


def _ratios(res: dict, names: list[str], k: int) -> dict:
    base = res[names[0]]
    return {c: statistics.median(v[k] / b[k] for v, b in zip(res[c], base)) for c in names}


def _report(title: str, res: dict, names: list[str], nbytes: int | None) -> None:
    print(title)
    cpu_r, wall_r = _ratios(res, names, 0), _ratios(res, names, 1)
    for c in names:
        cp = statistics.median(v[0] for v in res[c])
        w = statistics.median(v[1] for v in res[c])
        # Bytes per CPU-second summed over the threads: the per-thread rate while running.
        rate = f"  {nbytes / cp / 1e9:5.1f} GB/CPU-s" if nbytes else ""
        print(f"  {c:10s} CPU {cp * 1e3:7.2f} ms  wall {w * 1e3:7.2f} ms{rate}"
              f"  paired CPU / {names[0]} {cpu_r[c]:.3f}  wall / {names[0]} {wall_r[c]:.3f}")


def head_ab(model_path, settings: list[str], rounds: int) -> None:
    import ds4._core as core
    from ds4.gguf_header import read_header

    t = read_header(model_path).tensors["output.weight"]
    n, rows = t.dims
    mm = np.memmap(model_path, np.uint8, "r")
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mm._mmap.madvise(mmap.MADV_HUGEPAGE)  # as the engine asks (docs/pagecache.md)
    head = mm[t.offset:t.offset + t.nbytes]
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    names = ["read"] + [f"pf{s}" for s in settings]
    before = core._decode_switches()

    def run(c: str) -> None:
        if c == "read":
            core.stream_read(head)
        else:
            core._decode_switches(**_switches(c[2:]))
            core.matvec(t.type, head, [n, rows], x)

    for c in names:  # warm-up: page the head in
        run(c)
    res = {c: [] for c in names}
    try:
        for r in range(rounds):
            for c in names if r % 2 == 0 else names[::-1]:
                c0, t0 = time.process_time(), time.perf_counter()
                run(c)
                res[c].append((time.process_time() - c0, time.perf_counter() - t0))
    finally:
        core._decode_switches(**before)
    _report(f"head: {t.nbytes / 1e6:.1f} MB Q8_0 ({rows} x {n}), {rounds} rounds, load average "
            f"{os.getloadavg()[0]:.1f}", res, names[1:] + ["read"], t.nbytes)


def decode_ab(model_path, settings: list[str], rounds: int, block: int, threads: int) -> None:
    import ds4

    names = [f"pf{s}" for s in settings]
    eng = ds4.Engine(model_path, threads=threads)
    runs = decode_switch_ab(eng, {c: _switches(c[2:]) for c in names}, rounds, block)
    res = {c: [(statistics.median(cpu for _, cpu in b), statistics.median(w for w, _ in b)) for b in runs[c]]
           for c in names}
    _report(f"decode: {threads} threads, {rounds} rounds x {block} steps per setting (per-block medians), "
            f"load average {os.getloadavg()[0]:.1f}", res, names, None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--prefetch", default="3072,0,8192,16384",
                    help="comma list of settings, each Q8[:HALF[:burst]]: bytes ahead that Q8_0 rows (q8_prefetch) and "
                         "F16/BF16 one-token tiles (half_prefetch) prefetch, 0: none; `burst`: Q8_0 prefetches issued "
                         "per row by matvec, not inside the kernel; the first is the baseline")
    ap.add_argument("--parts", default="head,decode")
    args = ap.parse_args()

    import ds4._core as core
    import ds4.testing

    path = ds4.testing.cached_model(args.model)
    settings = args.prefetch.split(",")
    core.set_threads(args.threads)
    parts = args.parts.split(",")
    if "head" in parts:
        head_ab(path, settings, args.rounds)
    if "decode" in parts:
        decode_ab(path, settings, args.rounds, args.block, args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
