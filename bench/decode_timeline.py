"""Where the wall time of one decode step goes: a per-op timeline (docs/kernels.md).

    DS4_OP_TIMELINE=1 PYTHONPATH=python python bench/decode_timeline.py --model small --steps 40

Times every Stream op of each decode step on the calling thread (csrc/common/op_timeline.h) and
prints, per op kind (the op and its weight's tensor name with the layer number removed), calls,
wall microseconds, weight MB and GB/s per step, and what the thread pool did inside: hand-offs
to the other thread, the time until the helper started its first range (wake), the time the
caller waited for the helper after its own ranges (tail) and the helper's busy time. Then the
step's split: ops that stream weights, ops that do not, host time between ops, Python.
Medians over the steps (each step's figures summed first). Sessions are timed only when
DS4_OP_TIMELINE=1 is set (the script sets it itself before importing ds4).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("DS4_OP_TIMELINE", "1")

import numpy as np  # noqa: E402

STREAMING_MIN_BYTES = 256 << 10  # an op reading at least this much weight counts as streaming


def kind_of(e: dict) -> str:
    label = re.sub(r"^blk\.\d+\.", "blk.*.", e["label"]).removesuffix(".weight")
    return f'{e["op"]} {label}'.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--read-gbs", type=float, default=31.5,
                    help="read bandwidth for the floor column (default: the quiet development machine's "
                         "2-thread figure; under load a measured figure says little)")
    ap.add_argument("--json", default=None, help="write per-step events here")
    ap.add_argument("--q8-prefetch", type=int, default=None,
                    help="bytes ahead that the Q8_0 matvec prefetches (common/decode_switches.h; default: the build's)")
    ap.add_argument("--half-prefetch", type=int, default=None,
                    help="the same for the F16/BF16 one-token tiles")
    ap.add_argument("--q8-burst", action="store_true",
                    help="Q8_0 prefetches issued per row by matvec, not inside the kernel (q8_prefetch_inline off)")
    args = ap.parse_args()

    import ds4
    import ds4.testing
    from ds4 import _core

    if not _core.op_timeline_wanted():
        raise SystemExit("DS4_OP_TIMELINE=1 must be set before ds4 is imported")
    if args.q8_prefetch is not None:
        _core._decode_switches(q8_prefetch=args.q8_prefetch)
    if args.half_prefetch is not None:
        _core._decode_switches(half_prefetch=args.half_prefetch)
    if args.q8_burst:
        _core._decode_switches(q8_prefetch_inline=False)
    path = Path(args.model) if Path(args.model).is_file() else ds4.testing.cached_model(args.model)
    eng = ds4.Engine(path, threads=args.threads)
    s = eng.session(ctx=args.prompt + args.warmup + args.steps + 8)
    rng = np.random.default_rng(0)
    s.sync(rng.integers(0, eng.shape.n_vocab, args.prompt).tolist())
    toks = rng.integers(0, eng.shape.n_vocab, args.warmup + args.steps).tolist()
    for t in toks[:args.warmup]:
        s.eval(int(t))

    steps = []
    for t in toks[args.warmup:]:
        _core.op_timeline_take()
        _core.op_timeline_record(True)
        t0 = time.monotonic_ns()
        s.eval(int(t))
        t1 = time.monotonic_ns()
        _core.op_timeline_record(False)
        steps.append((t0, t1, _core.op_timeline_take()))

    # Under load the wall time of an op includes the time its threads were not scheduled. Every
    # step runs the same op sequence, so the minimum over steps of each op instance (kind, k-th
    # occurrence in the step) is close to its time on a quiet machine; "min" columns sum those.
    inst_min: dict[tuple[str, int], dict[str, float]] = {}
    per_kind: dict[str, list[dict]] = defaultdict(list)
    split = defaultdict(list)
    order: list[str] = []
    for t0, t1, ev in steps:
        acc: dict[str, dict] = defaultdict(lambda: defaultdict(float))
        seen: dict[str, int] = defaultdict(int)
        stream_ns = other_ns = 0
        for e in ev:
            k = kind_of(e)
            if k not in order:
                order.append(k)
            a = acc[k]
            dt = e["t1"] - e["t0"]
            a["calls"] += 1
            a["ns"] += dt
            a["bytes"] += e["bytes"]
            for f in ("handoffs", "wake_ns", "tail_ns", "helper_ns", "no_helper"):
                a[f] += e[f]
            # CPU time doing the op's work: both threads, less the caller's spin for the helper.
            a["work_ns"] += e["cpu_ns"] + e["helper_cpu_ns"] - e["tail_ns"]
            key = (k, seen[k])
            seen[k] += 1
            cur = {"ns": dt, "wake_ns": e["wake_ns"], "tail_ns": e["tail_ns"], "bytes": e["bytes"]}
            if key not in inst_min or dt < inst_min[key]["ns"]:
                inst_min[key] = cur
            if e["bytes"] >= STREAMING_MIN_BYTES:
                stream_ns += dt
            else:
                other_ns += dt
        for k, a in acc.items():
            per_kind[k].append(a)
        span = ev[-1]["t1"] - ev[0]["t0"] if ev else 0
        split["step"].append(t1 - t0)
        split["streaming ops"].append(stream_ns)
        split["other ops"].append(other_ns)
        split["between ops (host)"].append(span - stream_ns - other_ns)
        split["outside the graph (Python, bindings)"].append((t1 - t0) - span)
        split["bytes"].append(sum(e["bytes"] for e in ev))
        split["handoffs"].append(sum(e["handoffs"] for e in ev))
        split["wake"].append(sum(e["wake_ns"] for e in ev))
        split["tail"].append(sum(e["tail_ns"] for e in ev))

    mins: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for (k, _), m in inst_min.items():
        for f, v in m.items():
            mins[k][f] += v

    read_gbs = args.read_gbs
    med = statistics.median
    n = len(steps)
    print(f"model {args.model}, {args.threads} threads, {n} steps after a {args.prompt}-token prompt; "
          f"floor at {read_gbs:.1f} GB/s; load average {os.getloadavg()[0]:.1f}")
    print("per step: median wall; the sum of each op instance's fastest wall over the steps (min) and the "
          "helper's start latency inside those; CPU time of the op's work on all threads (work), its weight "
          "GB per CPU-second, and an estimate for a quiet machine: max(work / threads, floor)")
    print("| op (weight) | calls | MB | floor µs | wall µs | min wall µs | wake in min µs | hand-offs | work CPU µs "
          "| GB/CPU-s | quiet est. µs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for k in order:
        xs = per_kind[k]
        while len(xs) < n:
            xs.append(defaultdict(float))
        m = {f: med([x[f] for x in xs]) for f in ("calls", "ns", "bytes", "handoffs", "wake_ns", "tail_ns", "work_ns")}
        rows.append((k, m))
    rows.sort(key=lambda r: -r[1]["work_ns"])
    tot = defaultdict(float)
    for k, m in rows:
        mn = mins[k]
        floor = m["bytes"] / read_gbs / 1e3 if m["bytes"] else 0.0
        cgbs = m["bytes"] / m["work_ns"] if m["work_ns"] > 0 and m["bytes"] else 0.0
        est = max(m["work_ns"] / 1e3 / args.threads, floor)
        tot["min"] += mn["ns"]
        tot["wake"] += mn["wake_ns"]
        tot["work"] += m["work_ns"]
        tot["est"] += est
        tot["est_stream" if m["bytes"] >= STREAMING_MIN_BYTES else "est_other"] += est
        print(f'| {k} | {m["calls"]:.0f} | {m["bytes"]/1e6:.1f} | {floor:.0f} | {m["ns"]/1e3:.0f} | '
              f'{mn["ns"]/1e3:.0f} | {mn["wake_ns"]/1e3:.0f} | {m["handoffs"]:.0f} | {m["work_ns"]/1e3:.0f} | '
              f'{cgbs:.1f} | {est:.0f} |')
    print(f'| total | | {med(split["bytes"])/1e6:.0f} | {med(split["bytes"])/read_gbs/1e3:.0f} | '
          f'{med(split["step"])/1e3:.0f} (step) | {tot["min"]/1e3:.0f} | {tot["wake"]/1e3:.0f} | '
          f'{med(split["handoffs"]):.0f} | {tot["work"]/1e3:.0f} | | {tot["est"]:.0f} |')
    print(f'quiet estimate: streaming ops {tot["est_stream"]:.0f} µs, other ops {tot["est_other"]:.0f} µs')
    step = med(split["step"])
    print()
    print(f"step wall {step/1e3:.0f} µs (median; min {min(split['step'])/1e3:.0f}), "
          f"weights {med(split['bytes'])/1e6:.0f} MB -> floor {med(split['bytes'])/read_gbs/1e3:.0f} µs")
    for k in ("streaming ops", "other ops", "between ops (host)", "outside the graph (Python, bindings)"):
        v = med(split[k])
        print(f"  {k}: {v/1e3:.0f} µs ({100*v/step:.0f} %)")
    print(f"  hand-offs {med(split['handoffs']):.0f}, wake {med(split['wake'])/1e3:.0f} µs, "
          f"tail {med(split['tail'])/1e3:.0f} µs (inside the ops above)")
    if args.json:
        Path(args.json).write_text(json.dumps([{"t0": a, "t1": b, "events": ev} for a, b, ev in steps]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
