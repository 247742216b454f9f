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
plain decode, at zero acceptance (random drafts and the synthetic model's random MTP block, with
the policy generate() uses: back-off, MTP gate) at most 5% slower, both over the ``--tokens``
window and over ``--long`` tokens (the steady state: the back-off's waits reach their longest).
Every figure of one length is measured in the same round as its plain-decode reference (rounds
repeated ``--repeats`` times, medians reported), so slow phases of a loaded machine hit both.
The load average is recorded with the results: numbers from a loaded machine are not comparable.
On a loaded machine, ``--clock cpu`` times everything in the process's CPU time (all threads)
instead of wall time: slower cores still inflate it, but waiting for a core does not.
``--margin`` sets the MTP gate's floor (Speculator's ``margin``; 0: the margin test off).
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
from _common import Result, add_common_args, machine_info, measure, report  # noqa: E402

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


def decode_spec(session, prompt, n, n_draft, draft, policy=False, margin=3.0):
    """Greedy decoding of n tokens with drafts from ``draft(out)`` (None: the MTP block): every
    cycle drafting, or (``policy``) the Speculator generate() uses. Returns the tokens, the time,
    and the counts (drafted, accepted, gated cycles)."""
    session.sync(prompt)
    out: list[int] = []
    drafted = accepted = 0
    spec = Speculator(n_draft, margin=margin)
    t = CLOCK()
    while len(out) < n:
        first = argmax(session.logits)
        if policy:
            spec.n, spec.draft = min(n_draft, n - len(out) - 1), draft(out)
            cyc = spec.cycle(session, first)
        else:
            cyc = greedy_cycle(session, first, min(n_draft, n - len(out) - 1), draft(out))
        out += cyc.committed
        drafted += cyc.drafted
        accepted += cyc.accepted
    return out, CLOCK() - t, drafted, accepted, spec.gated


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--model", default="small", help="ds4.testing preset (written with an MTP block)")
    p.add_argument("--tokens", type=int, default=48, help="tokens generated per run")
    p.add_argument("--drafts", default="1,2,3,4", help="draft lengths N")
    p.add_argument("--sources", default="oracle,random,mtp", help="draft sources to run")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall time or process CPU time")
    p.add_argument("--long", type=int, default=160,
                   help="also run the policy runs (and plain decode) over this many tokens (0: off)")
    p.add_argument("--margin", type=float, default=3.0, help="the MTP gate's margin (Speculator's margin)")
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

    # One decode step, one verification pass over k tokens, and the MTP's steps, at the same
    # depth, in rounds (every operation once per round, so a slow phase of a loaded machine hits
    # them all). Each starts from a snapshot plus one evaluated token (the MTP needs its hidden
    # state, which snapshots do not keep); that prefix is timed alone and subtracted.
    s.sync(prompt)
    snap = s.snapshot()
    f0 = s.argmax()
    s.eval(f0)
    first = s.argmax()
    g = np.random.default_rng(1)
    toks = g.integers(0, eng.shape.n_vocab, 5).tolist()

    def prefix():
        s.restore(snap)
        s.eval(f0)

    ops = {"prefix": prefix, "decode": lambda: (prefix(), s.eval(first))}
    for k in range(1, 6):
        ops[f"verify_{k}"] = lambda k=k: (prefix(), s.verify(toks[:k]), s.accept(k))
    ops["mtp_step0"] = lambda: (prefix(), s.mtp_draft())
    ops["mtp_chain_1"] = lambda: (prefix(), s.mtp_drafts(first, 1))
    secs: dict[str, list[float]] = {k: [] for k in ops}
    for fn in ops.values():
        fn()   # warm-up
    for _ in range(args.repeats):
        for name, fn in ops.items():
            t = CLOCK()
            fn()
            secs[name].append(CLOCK() - t)
    pre = float(np.median(secs["prefix"]))
    dec = [t - pre for t in secs["decode"]]
    dec_med = float(np.median(dec))
    r = measure("decode_step", "ms", [x * 1e3 for x in dec])
    results.append(r)
    rows.append({"what": "decode step", "value": r.median, "unit": "ms", "_names": {"value": r.name}})
    for k in range(1, 6):
        r = measure(f"verify_{k}_over_decode", "x", [(t - pre) / dec_med for t in secs[f"verify_{k}"]])
        results.append(r)
        rows.append({"what": f"verify {k} tokens / decode step", "value": r.median, "unit": "x",
                     "_names": {"value": r.name}})
    step0 = float(np.median(secs["mtp_step0"])) - pre
    r = measure("mtp_step0_over_decode", "x", [(t - pre) / dec_med for t in secs["mtp_step0"]])
    results.append(r)
    rows.append({"what": "MTP step 0 (the gate) / decode step", "value": r.median, "unit": "x",
                 "_names": {"value": r.name}})
    r = measure("mtp_draft_step_over_decode", "x", [(t - pre - step0) / dec_med for t in secs["mtp_chain_1"]])
    results.append(r)
    rows.append({"what": "MTP draft step / decode step", "value": r.median, "unit": "x",
                 "_names": {"value": r.name}})

    n = args.tokens
    lengths = [n] + ([args.long] if args.long > n else [])
    oracle_full, _ = decode_plain(s, prompt, max(lengths) + 20)
    sources = {
        "oracle": lambda out: (lambda sess, f, k: oracle_full[len(out) + 1: len(out) + 1 + k]),
        "random": lambda out: (lambda sess, f, k: g.integers(0, eng.shape.n_vocab, k).tolist()),
        "mtp": lambda out: None,
    }
    chosen = [x for x in args.sources.split(",") if x in sources]
    # (source, N, policy, length); the policy runs at every length, the rest at the window
    runs = [(name, N, False, n) for name in chosen for N in [int(x) for x in args.drafts.split(",")]]
    runs += [(name, 3, True, length) for length in lengths for name in chosen]
    plain_secs: dict[int, list[float]] = {length: [] for length in lengths}
    secs: dict[tuple, list[float]] = {run: [] for run in runs}
    counts: dict[tuple, tuple[int, int, int]] = {}
    for _ in range(args.repeats):   # one round: every figure once, next to its plain reference
        for length in lengths:
            _, dt = decode_plain(s, prompt, length)
            plain_secs[length].append(dt)
        for run in runs:
            name, N, policy, length = run
            out, dt, drafted, accepted, gated = decode_spec(s, prompt, length, N, sources[name], policy,
                                                            args.margin)
            assert out[:length] == oracle_full[:length], f"{run}: speculative output differs from plain greedy"
            secs[run].append(dt)
            counts[run] = (drafted, accepted, gated)
    plain_tps = {}
    for length in lengths:
        tag = "" if length == n else f"_t{length}"
        r = measure(f"plain{tag}_tok_s", "tok/s", [length / x for x in plain_secs[length]])
        plain_tps[length] = r.median
        results.append(r)
        rows.append({"what": f"plain decode, {length} tokens", "value": r.median, "unit": "tok/s",
                     "_names": {"value": r.name}})
    for run in runs:
        name, N, policy, length = run
        drafted, accepted, gated = counts[run]
        acc = accepted / max(drafted, 1)
        tag = ("_backoff" if policy else "") + ("" if length == n else f"_t{length}")
        r = measure(f"spec_{name}_N{N}{tag}_tok_s", "tok/s", [length / x for x in secs[run]], acceptance=acc,
                    drafted=drafted, gated=gated)
        results.append(r)
        what = f"{name} N={N}{' policy' if policy else ''}, {length} tokens (accept {accepted}/{drafted}"
        what += f", gated {gated})" if name == "mtp" and policy else ")"
        rows.append({"what": what, "value": r.median, "unit": "tok/s", "x plain": r.median / plain_tps[length],
                     "_names": {"value": r.name}})
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"model {args.model}, {eng.threads} threads, {n} tokens per run, depth {len(prompt)}, {args.clock} time, "
          f"load average {load[0]:.1f}\n" if load else "\n")
    report(results, machine_info(threads=eng.threads, model=args.model, load_average=load, clock=args.clock), args,
           ["what", "value", "unit", "x plain"], rows)
    print()
    for line in goal_lines({r.name: r.median for r in results}):
        print(line)


def goal_lines(med: dict) -> list[str]:
    """The verify-cost ratios and the issue's two goals, from the medians by result name (each
    figure over the plain decode of the same length)."""
    out = ["verify cost / decode step: " + ", ".join(f"k={k} {med[f'verify_{k}_over_decode']:.2f}x"
                                                     for k in range(1, 6) if f"verify_{k}_over_decode" in med)]
    lengths = sorted({name[len("plain"):-len("_tok_s")] for name in med if name.startswith("plain")})
    for tag in lengths:
        plain = med[f"plain{tag}_tok_s"]
        span = f"{tag[2:]} tokens" if tag else "window"
        for name, what, goal in (("oracle_N3", "full acceptance, N=3", ">= 1.8x"),
                                 ("oracle_N3_backoff", "full acceptance, N=3 with the policy", ">= 1.8x"),
                                 ("random_N3_backoff", "zero acceptance (random drafts), N=3 with the policy", ">= 0.95x"),
                                 ("mtp_N3_backoff", "zero acceptance (random MTP), N=3 with the policy", ">= 0.95x")):
            v = med.get(f"spec_{name}{tag}_tok_s")
            if v:
                out.append(f"{what}, {span}: {v / plain:.2f}x plain (goal {goal})")
    return out


if __name__ == "__main__":
    main()
