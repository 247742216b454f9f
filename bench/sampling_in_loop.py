"""What a pick costs inside the generation loop: one sampler call right after each ``Session.eval``.

    PYTHONPATH=python python bench/sampling_in_loop.py --model small --steps 40
    PYTHONPATH=python python bench/sampling_in_loop.py --model tiny --quick

A decode step streams the weights through the caches, so the pick that follows reads the logits and
writes its scratch from memory: bench/sampling.py's warm loops do not see that (its ``--cold``
column imitates it with a 64 MiB read). Per step and setting the session decodes one token, then
one call is timed (wall and the calling thread's CPU time), alternating one and two sampler threads
(the engine's own workers, ``Engine.sampler_threads``; which count goes first alternates by step).
Reported: median and 10th percentile per setting and count (docs/sampling.md, "Cold caches").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
from _common import Result, add_common_args, machine_info, put, report  # noqa: E402

import ds4  # noqa: E402
from ds4.sampling import Rng, argmax, probabilities, sample  # noqa: E402
from ds4.testing import cached_model  # noqa: E402

SETTINGS = [
    ("greedy", None),
    ("default (T1, top_p 1, min_p .05)", dict()),
    ("min_p 0", dict(min_p=0.0)),
    ("top_p .9, min_p 0", dict(top_p=0.9, min_p=0.0)),
    ("T 100, top_p .9, min_p 0", dict(temperature=100.0, top_p=0.9, min_p=0.0)),
    ("probabilities(), min_p 0", "probs"),
]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--model", default="small", help="ds4.testing preset (small and bench have the real vocabulary)")
    p.add_argument("--steps", type=int, default=40, help="decode steps per setting and thread count")
    args = p.parse_args(argv)
    steps = 4 if args.quick else args.steps
    eng = ds4.Engine(cached_model(args.model), threads=args.threads)
    s = eng.session(ctx=4096)
    s.sync(list(range(1, 40)))
    rng, tok = Rng(1), 5
    counts = (1, 2) if args.threads > 1 else (1,)
    times: dict[tuple[str, int], tuple[list[float], list[float]]] = {}
    for step in range(steps):
        for label, kw in SETTINGS:
            for n in (counts if step % 2 == 0 else counts[::-1]):
                s.eval(tok)
                tok = (tok * 7 + 3) % min(1000, eng.shape.n_vocab - 1) + 1
                eng.sampler_threads = n
                logits = s.logits
                c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
                if kw is None:
                    argmax(logits)
                elif kw == "probs":
                    probabilities(logits, min_p=0.0, engine=eng)
                else:
                    sample(logits, rng=rng, engine=eng, **kw)
                t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
                w, c = times.setdefault((label, n), ([], []))
                w.append((t1 - t0) / 1e3)
                c.append((c1 - c0) / 1e3)
    results: list[Result] = []
    rows: list[dict] = []
    for label, _ in SETTINGS:
        row = {"case": label, "_names": {}}
        for n in counts:
            w, c = times[(label, n)]
            for col, vals in ((f"wall {n}T", w), (f"cpu {n}T", c)):
                put(results, row, col, f"in_loop/{args.model}/{label}/{col}", vals)
            row[f"wall p10 {n}T"] = sorted(w)[len(w) // 10]
        rows.append(row)
    print(f"{args.model}: vocabulary {eng.shape.n_vocab}, {args.threads} engine threads, {steps} steps; "
          f"one call right after each eval, median (and 10th percentile) µs\n")
    cols = ["case"] + [f"{k} {n}T" for n in counts for k in ("wall", "wall p10", "cpu")]
    report(results, machine_info(threads=args.threads, n_vocab=eng.shape.n_vocab), args, cols, rows)


if __name__ == "__main__":
    main()
