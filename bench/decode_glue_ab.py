"""In-process A/B of the decode-glue switches (docs/kernels.md, "Decode glue").

    PYTHONPATH=python python bench/decode_glue_ab.py --model bench --rounds 30 --block 4 --configs off,on

One session decodes blocks of `--block` steps, alternating between switch settings
(ds4._core._decode_switches) round by round, so both sides of the comparison see the same machine
load; prints the median and 25th percentile of step wall time and process CPU time (both threads,
spin included) per setting. The switches change timing only, never a result.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

CONFIGS = {
    "off": dict(tapered=False, warm_hc=False, prewake=False),
    "tapered": dict(tapered=True, warm_hc=False, prewake=False),
    "warm": dict(tapered=False, warm_hc=True, prewake=False),
    "prewake": dict(tapered=False, warm_hc=False, prewake=True),
    "on": dict(tapered=True, warm_hc=True, prewake=True),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--configs", default="off,on", help="comma list of " + ", ".join(CONFIGS))
    args = ap.parse_args()

    import ds4
    import ds4._core as core
    import ds4.testing

    names = args.configs.split(",")
    eng = ds4.Engine(ds4.testing.cached_model(args.model), threads=args.threads)
    n_steps = args.rounds * len(names) * args.block + 4
    s = eng.session(ctx=n_steps + 32)
    rng = np.random.default_rng(0)
    s.sync(rng.integers(0, eng.shape.n_vocab, 16).tolist())
    toks = iter(rng.integers(0, eng.shape.n_vocab, n_steps).tolist())
    for _ in range(4):
        s.eval(int(next(toks)))
    res = {c: ([], []) for c in names}
    before = core._decode_switches()
    try:
        for r in range(args.rounds):
            for c in names if r % 2 == 0 else names[::-1]:
                core._decode_switches(**CONFIGS[c])
                for _ in range(args.block):
                    c0, t0 = time.process_time(), time.perf_counter()
                    s.eval(int(next(toks)))
                    res[c][0].append(time.perf_counter() - t0)
                    res[c][1].append(time.process_time() - c0)
    finally:
        core._decode_switches(**before)
    print(f"{args.model}, {args.threads} threads: {args.rounds} rounds x {args.block} steps per setting, "
          f"load average {os.getloadavg()[0]:.1f}")
    base = statistics.median(res[names[0]][1])
    for c in names:
        w, cp = res[c]
        print(f"  {c:8s} step wall median {statistics.median(w) * 1e3:6.2f} ms (p25 {np.percentile(w, 25) * 1e3:6.2f})"
              f"  CPU median {statistics.median(cp) * 1e3:6.2f} ms (p25 {np.percentile(cp, 25) * 1e3:6.2f})"
              f"  CPU / {names[0]} {statistics.median(cp) / base:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
