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

import numpy as np

from _common import decode_switch_ab

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
    import ds4.testing

    names = args.configs.split(",")
    eng = ds4.Engine(ds4.testing.cached_model(args.model), threads=args.threads)
    runs = decode_switch_ab(eng, {c: CONFIGS[c] for c in names}, args.rounds, args.block)
    res = {c: ([w for b in runs[c] for w, _ in b], [cpu for b in runs[c] for _, cpu in b]) for c in names}
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
