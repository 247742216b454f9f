"""Speculative decoding on the `small` synthetic model: decode tokens/s against acceptance rate.

    PYTHONPATH=python python bench/speculative.py
    PYTHONPATH=python python bench/speculative.py --quick --json /tmp/spec.json

Greedy decoding of the same tokens three ways for draft lengths N = 1..4, the draft source
injected: ``oracle`` (the target's own greedy continuation: every draft accepted), ``random``
(uniform tokens: none accepted) and ``mtp`` (the model's MTP block; a synthetic model's random
weights make it ~0% too, but it pays the drafting cost a real model pays). Each figure is tokens
committed per second over a fixed-length generation; ``plain`` is one eval() per token. Also:
the cost of one verification pass over k tokens (k = 1..5 = the first token plus N drafts)
divided by one decode step, the quantity that bounds the speed-up (N+1 tokens committed for the
cost of verify(N+1) at full acceptance).

The baseline file is written by a quiet run (nothing else on the machine):

    PYTHONPATH=python python bench/speculative.py --json bench/baselines/speculative-small.json

The summary under the table checks the issue's goals: at full acceptance with N = 3 at least 1.8x
plain decode, at zero acceptance (random drafts, with the back-off policy) at most 5% slower.
The load average is recorded with the results: numbers from a loaded machine are not comparable.
On a loaded machine, ``--clock cpu`` times everything in the process's CPU time (all threads)
instead of wall time: slower cores still inflate it, but waiting for a core does not.
``--probe`` sets the back-off's draft count after a miss (Speculator's ``probe``) for A/B runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
from _common import Result, add_common_args, machine_info, measure, report, time_call  # noqa: E402

import ds4  # noqa: E402
import ds4.testing  # noqa: E402
from ds4.sampling import argmax  # noqa: E402
from ds4.speculative import Speculator, greedy_cycle  # noqa: E402


CLOCK = time.perf_counter   # time.process_time with --clock cpu


def decode_plain(session, prompt, n):
    session.sync(prompt)
    out = []
    t = CLOCK()
    for _ in range(n):
        tok = argmax(session.logits)
        out.append(tok)
        session.eval(tok)
    return out, CLOCK() - t


def decode_spec(session, prompt, n, n_draft, draft, backoff=False, probe=1):
    session.sync(prompt)
    out: list[int] = []
    drafted = accepted = 0
    spec = Speculator(n_draft, probe=probe)
    t = CLOCK()
    while len(out) < n:
        first = argmax(session.logits)
        if backoff:   # the policy generate() uses: plain steps after misses
            spec.n, spec.draft = min(n_draft, n - len(out) - 1), draft(out)
            cyc = spec.cycle(session, first)
        else:
            cyc = greedy_cycle(session, first, min(n_draft, n - len(out) - 1), draft(out))
        out += cyc.committed
        drafted += cyc.drafted
        accepted += cyc.accepted
    return out, CLOCK() - t, drafted, accepted


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--model", default="small", help="ds4.testing preset (written with an MTP block)")
    p.add_argument("--tokens", type=int, default=48, help="tokens generated per run")
    p.add_argument("--drafts", default="1,2,3,4", help="draft lengths N")
    p.add_argument("--sources", default="oracle,random,mtp", help="draft sources to run")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall time or process CPU time")
    p.add_argument("--probe", type=int, default=1, help="back-off: drafts per attempt after a miss")
    args = p.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.quick:
        args.repeats, args.tokens = min(args.repeats, 2), min(args.tokens, 16)
    eng = ds4.Engine(ds4.testing.cached_model(args.model, mtp=True), threads=args.threads)
    prompt = np.random.default_rng(0).integers(0, eng.shape.n_vocab, 64).tolist()
    s = eng.session(ctx=512)
    results: list[Result] = []
    rows: list[dict] = []

    # one decode step, and one verification pass over k tokens, at the same depth
    s.sync(prompt)
    snap = s.snapshot()
    first = s.argmax()

    def step():
        s.restore(snap)
        s.eval(first)

    def restore_only():
        s.restore(snap)

    base = np.median(time_call(restore_only, args.repeats, warmup=1, clock=CLOCK))
    dec = [t - base for t in time_call(step, args.repeats, warmup=1, clock=CLOCK)]
    r = measure("decode_step", "ms", [x * 1e3 for x in dec])
    results.append(r)
    rows.append({"what": "decode step", "value": r.median, "unit": "ms", "_names": {"value": r.name}})
    g = np.random.default_rng(1)
    for k in range(1, 6):
        toks = g.integers(0, eng.shape.n_vocab, k).tolist()

        def ver(toks=toks):
            s.restore(snap)
            s.verify(toks)
            s.accept(k)

        secs = [t - base for t in time_call(ver, args.repeats, warmup=1, clock=CLOCK)]
        r = measure(f"verify_{k}_over_decode", "x", [x / float(np.median(dec)) for x in secs])
        results.append(r)
        rows.append({"what": f"verify {k} tokens / decode step", "value": r.median, "unit": "x",
                     "_names": {"value": r.name}})

    n = args.tokens
    plain_out, _ = decode_plain(s, prompt, n + 20)
    plain_out = plain_out[:n]
    secs = []
    for _ in range(args.repeats):
        _, dt = decode_plain(s, prompt, n)
        secs.append(dt)
    r = measure("plain_tok_s", "tok/s", [n / x for x in secs])
    plain_tps = r.median
    results.append(r)
    rows.append({"what": "plain decode", "value": r.median, "unit": "tok/s", "_names": {"value": r.name}})
    oracle_full, _ = decode_plain(s, prompt, n + 20)

    sources = {
        "oracle": lambda out: (lambda sess, f, k: oracle_full[len(out) + 1: len(out) + 1 + k]),
        "random": lambda out: (lambda sess, f, k: g.integers(0, eng.shape.n_vocab, k).tolist()),
        "mtp": lambda out: None,
    }
    chosen = [x for x in args.sources.split(",") if x in sources]
    runs = [(name, N, False) for name in chosen for N in [int(x) for x in args.drafts.split(",")]]
    runs += [(name, 3, True) for name in ("random", "mtp") if name in chosen]
    for name, N, backoff in runs:
        src = sources[name]
        if True:
            secs, acc = [], 0.0
            for _ in range(args.repeats):
                out, dt, drafted, accepted = decode_spec(s, prompt, n, N, src, backoff, args.probe)
                assert out[:n] == plain_out, f"{name} N={N}: speculative output differs from plain greedy"
                secs.append(dt)
                acc = accepted / max(drafted, 1)
            tag = "_backoff" if backoff else ""
            r = measure(f"spec_{name}_N{N}{tag}_tok_s", "tok/s", [n / x for x in secs], acceptance=acc)
            results.append(r)
            rows.append({"what": f"{name} N={N}{' back-off' if backoff else ''} (accept {acc:.0%})", "value": r.median, "unit": "tok/s",
                         "x plain": r.median / plain_tps, "_names": {"value": r.name}})
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"model {args.model}, {eng.threads} threads, {n} tokens per run, depth {len(prompt)}, {args.clock} time, "
          f"load average {load[0]:.1f}\n" if load else "\n")
    report(results, machine_info(threads=eng.threads, model=args.model, load_average=load, clock=args.clock), args,
           ["what", "value", "unit", "x plain"], rows)
    print()
    for line in goal_lines({r.name: r.median for r in results}, plain_tps):
        print(line)


def goal_lines(med: dict, plain_tps: float) -> list[str]:
    """The verify-cost ratios and the issue's two goals, from the medians by result name."""
    out = ["verify cost / decode step: " + ", ".join(f"k={k} {med[f'verify_{k}_over_decode']:.2f}x"
                                                     for k in range(1, 6) if f"verify_{k}_over_decode" in med)]
    full = med.get("spec_oracle_N3_tok_s")
    if full:
        out.append(f"full acceptance, N=3: {full / plain_tps:.2f}x plain (goal >= 1.8x)")
    zero = med.get("spec_random_N3_backoff_tok_s")
    if zero:
        out.append(f"zero acceptance, N=3 with back-off: {zero / plain_tps:.2f}x plain (goal >= 0.95x)")
    return out


if __name__ == "__main__":
    main()
