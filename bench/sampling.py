"""Sampling latency over the full 129,280-entry DeepSeek V4 vocabulary (microseconds per token).

    PYTHONPATH=python python bench/sampling.py
    PYTHONPATH=python python bench/sampling.py --quick --json /tmp/sampling.json
    PYTHONPATH=python python bench/sampling.py --sampler-threads 2 --baseline /tmp/sampling.json

Four logit shapes: ``peaked`` (a few dozen strong candidates over a N(0, 2) floor, like a language
model's next-token logits), ``flat`` (N(0, 3): many tokens survive min-p, the worst case for the
walks), ``small`` (N(0, 1.5), like the bundled small model's real logits: top-p keeps tens of
thousands of tokens, docs/sampling.md "Ninth round") and ``equal`` (every logit the same: ties
everywhere, every token survives every filter).
Per setting: ``C++`` the sampler alone (``Sampler::sample`` in a C++ loop, median wall time),
``C++ cpu`` the same call's thread CPU time (steadier on a loaded machine), ``python`` one
``ds4.sampling.sample()`` call (argument checks, knob normalisation, RNG state in and out) and
``probs`` / ``probs cpu`` one C++ ``probabilities()`` call's wall / thread CPU time (what speculative
sampling uses). Target (issue 14):
every setting at most 0.1 ms. ``--sampler-threads 2`` lets the whole-vocabulary passes use the
global pool (docs/sampling.md); the default is one thread. ``--cold`` adds ``python cold``: one
``sample()`` call after a 64 MiB read has evicted the caches, as a decode step does in the
generation loop (docs/sampling.md, "Cold caches")::

    PYTHONPATH=python python bench/sampling.py --cold --kinds peaked,small

``--thread-ab`` instead compares one and two sampler threads on the settings that split (the
whole-vocabulary total and ``probabilities()``): per setting, ``--rounds`` rounds that alternate
the thread counts (which goes first alternates too), each round the 10th percentile and median of
``reps`` per-call wall times (and the calling thread's CPU time) per count; reported: the median
over rounds and the median of the per-round ratios (two threads over one). The global pool is
resized to ``--pool-threads`` (default 2) for it. Wall time is what the second thread can save, and
it means something only on an otherwise quiet machine (docs/sampling.md, "Seventh round")::

    PYTHONPATH=python nice -n -20 python bench/sampling.py --thread-ab --rounds 12
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
from _common import Result, add_common_args, machine_info, put, report  # noqa: E402

from ds4 import _core  # noqa: E402
from ds4.sampling import (Rng, argmax, sample, set_sampler_threads, token_and_top_logprobs,  # noqa: E402
                          top_logprobs)

N_VOCAB = 129280

CASES = [
    ("greedy (temp 0)", dict(temperature=0.0)),
    ("default (T1, top_p 1, min_p .05)", dict()),
    ("T .7 (top_p 1, min_p .05)", dict(temperature=0.7)),
    ("min_p 0", dict(min_p=0.0)),
    ("top_p .9", dict(top_p=0.9)),
    ("top_p .9, min_p 0", dict(top_p=0.9, min_p=0.0)),
    ("top_p .5, min_p 0", dict(top_p=0.5, min_p=0.0)),
    ("top_k 40", dict(top_k=40)),
    ("top_k 1024", dict(top_k=1024)),
    ("top_k 1024, top_p .95", dict(top_k=1024, top_p=0.95)),
    ("top_k 100000 (clamped to 1024), min_p 0", dict(top_k=100000, min_p=0.0)),
    ("T .05, top_p .9, min_p 0", dict(temperature=0.05, top_p=0.9, min_p=0.0)),
    ("T 100, min_p 0", dict(temperature=100.0, min_p=0.0)),
    ("T 100 (top_p 1, min_p .05)", dict(temperature=100.0)),
    ("T 100, top_p .9, min_p 0", dict(temperature=100.0, top_p=0.9, min_p=0.0)),
    ("top_p .95, min_p 0", dict(top_p=0.95, min_p=0.0)),
    ("T .7, top_p .9, min_p 0", dict(temperature=0.7, top_p=0.9, min_p=0.0)),
    ("T 1.5, top_p .9, min_p 0", dict(temperature=1.5, top_p=0.9, min_p=0.0)),
    ("T 3, top_p .9, min_p 0", dict(temperature=3.0, top_p=0.9, min_p=0.0)),
    ("T 7, top_p .9, min_p 0", dict(temperature=7.0, top_p=0.9, min_p=0.0)),
]
PROBS_CASES = {"default (T1, top_p 1, min_p .05)", "min_p 0", "top_p .9, min_p 0", "top_k 40",
               "T 100, top_p .9, min_p 0"}
KNOBS = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.05)


def logits_of(kind: str, seed: int = 0) -> np.ndarray:
    g = np.random.default_rng(seed)
    if kind == "flat":
        return g.normal(0, 3, N_VOCAB).astype(np.float32)
    if kind == "equal":
        return np.full(N_VOCAB, 1.5, dtype=np.float32)
    if kind == "small":
        return g.normal(0, 1.5, N_VOCAB).astype(np.float32)
    base = g.normal(0, 2, N_VOCAB)
    strong = g.choice(N_VOCAB, 40, replace=False)
    base[strong] += g.uniform(6, 14, 40)
    return base.astype(np.float32)


def core_us(lg, kw, reps: int, probabilities: bool = False) -> tuple[list[float], list[float]]:
    """Per-call wall and thread-CPU microseconds of the C++ sampler, `reps` calls in a C++ loop."""
    k = {**KNOBS, **kw}
    if not k["temperature"] > 0:   # greedy: the Python API's argmax, there is no C++ draw to time
        k["temperature"] = 0.0
    pairs = _core._time_sampler(lg, k["temperature"], k["top_k"], k["top_p"], k["min_p"], reps, probabilities)
    return [w / 1e3 for w, _ in pairs], [c / 1e3 for _, c in pairs]


def per_call_us(fn, reps: int, before=None) -> list[float]:
    """Wall microseconds of `reps` single calls, each timed alone (as the C++ loop times them: a
    loaded machine preempts long loops, which would charge other processes' time to the call);
    ``before`` runs untimed ahead of each call."""
    for _ in range(3):
        fn()
    out = []
    for _ in range(reps):
        if before is not None:
            before()
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


# A decode step streams the model's weights through the caches, so the generation loop samples from
# cold caches (the logits, the sampler's scratch, the interpreter's own objects): ~0.1 ms more per call
# here than the warm loops above (docs/sampling.md, "Cold caches"). Reading 64 MiB (twice this
# machine's L3) before each call stands in for the step; COLD_REPS calls, as each read takes ms.
COLD_REPS = 40


def _cache_evictor():
    junk = np.ones(16 << 20, dtype=np.float32)
    return lambda: float(junk.sum())


# The settings whose passes split over the pool (the whole-vocabulary total, probabilities()' pieces)
# and a control that does not split (top-k); True: time probabilities().
THREAD_AB_CASES = [
    ("min_p 0", dict(min_p=0.0), False),
    ("top_p .9, min_p 0", dict(top_p=0.9, min_p=0.0), False),
    ("T 100, min_p 0", dict(temperature=100.0, min_p=0.0), False),
    ("probabilities(), min_p 0", dict(min_p=0.0), True),
    ("probabilities(), top_p .9, min_p 0", dict(top_p=0.9, min_p=0.0), True),
    ("top_p .9 (min_p .05)", dict(top_p=0.9), False),
    ("top_k 40 (control)", dict(top_k=40), False),
]


def _pct(vals: list[float], q: float) -> float:
    v = sorted(vals)
    return v[min(len(v) - 1, int(q * len(v)))]


def thread_ab(args) -> None:
    """One against two sampler threads, interleaved (see the module docstring)."""
    import statistics
    _core.set_threads(args.pool_threads)
    reps = 40 if args.quick else args.reps
    rows: list[dict] = []
    results: list[Result] = []
    for kind in args.kinds.split(","):
        lg = logits_of(kind)
        for label, kw, probs in THREAD_AB_CASES:
            per = {1: {"p10": [], "med": [], "cpu": []}, 2: {"p10": [], "med": [], "cpu": []}}
            for rnd in range(args.rounds):
                for nt in ((1, 2) if rnd % 2 == 0 else (2, 1)):
                    set_sampler_threads(nt)
                    core_us(lg, kw, 5, probabilities=probs)   # warm the buffers and the pool
                    wall, cpu = core_us(lg, kw, reps, probabilities=probs)
                    per[nt]["p10"].append(_pct(wall, 0.1))
                    per[nt]["med"].append(statistics.median(wall))
                    per[nt]["cpu"].append(_pct(cpu, 0.1))
            set_sampler_threads(1)
            ratio = statistics.median(b / a for a, b in zip(per[1]["p10"], per[2]["p10"]))
            row = {"logits": kind, "case": label, "_names": {}}
            for nt in (1, 2):
                for col, key in ((f"wall p10 {nt}T", "p10"), (f"wall med {nt}T", "med"), (f"cpu p10 {nt}T", "cpu")):
                    put(results, row, col, f"thread_ab/{kind}/{label}/{key}/{nt}", per[nt][key])
            row["2T/1T p10"] = ratio
            rows.append(row)
    print(f"vocabulary {N_VOCAB}; sampler threads 1 vs 2 on a global pool of {args.pool_threads}, "
          f"{args.rounds} interleaved rounds of {reps} calls: medians over rounds (us), ratio = median "
          f"of per-round ratios of the wall p10\n")
    report(results, machine_info(threads=args.pool_threads, n_vocab=N_VOCAB), args,
           ["logits", "case", "wall p10 1T", "wall p10 2T", "2T/1T p10", "wall med 1T", "wall med 2T",
            "cpu p10 1T", "cpu p10 2T"], rows)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--sampler-threads", type=int, default=1, help="threads for the sampler's vocabulary passes")
    p.add_argument("--kinds", default="peaked,flat,small,equal", help="logit shapes, comma-separated")
    p.add_argument("--thread-ab", action="store_true", help="wall per call, 1 vs 2 sampler threads, interleaved")
    p.add_argument("--rounds", type=int, default=10, help="--thread-ab: interleaved rounds per setting")
    p.add_argument("--reps", type=int, default=200, help="--thread-ab: calls per round and thread count")
    p.add_argument("--pool-threads", type=int, default=2, help="--thread-ab: size of the global pool")
    p.add_argument("--cold", action="store_true",
                   help="add a 'python cold' column: each sample() call after a 64 MiB read that evicts the caches")
    args = p.parse_args(argv)
    if args.thread_ab:
        if args.kinds == "peaked,flat,small,equal":
            args.kinds = "peaked,flat"
        return thread_ab(args)
    if args.quick:
        args.repeats = min(args.repeats, 3)
    set_sampler_threads(args.sampler_threads)
    reps = 40 if args.quick else 200
    evict = _cache_evictor() if args.cold else None
    results: list[Result] = []
    rows: list[dict] = []

    for kind in args.kinds.split(","):
        lg = logits_of(kind)
        for label, kw in CASES:
            row = {"logits": kind, "case": label, "_names": {}}
            core_us(lg, kw, 5)   # warm the scratch buffers
            wall, cpu = core_us(lg, kw, reps)
            for col, vals in (("C++", wall), ("C++ cpu", cpu)):
                put(results, row, col, f"sample/{kind}/{label}/{col}", vals)
            rng = Rng(1)
            # "sample/{kind}/{label}": the name earlier baselines used for the Python call
            put(results, row, "python", f"sample/{kind}/{label}", per_call_us(lambda: sample(lg, rng=rng, **kw), reps))
            if evict is not None:
                put(results, row, "python cold", f"sample/{kind}/{label}/cold",
                    per_call_us(lambda: sample(lg, rng=rng, **kw), COLD_REPS, evict))
            if label in PROBS_CASES:
                wall, cpu = core_us(lg, kw, max(reps // 4, 10), probabilities=True)
                # "probs": wall, under the name earlier baselines used; "probs cpu": thread CPU
                for col, suffix, vals in (("probs", "", wall), ("probs cpu", "/cpu", cpu)):
                    put(results, row, col, f"probabilities/{kind}/{label}{suffix}", vals)
            rows.append(row)
        for label, fn in (("argmax", lambda: argmax(lg)), ("top_logprobs k=20", lambda: top_logprobs(lg, 20)),
                          ("token_and_top_logprobs k=20", lambda: token_and_top_logprobs(lg, 7, 20))):
            row = {"logits": kind, "case": label, "_names": {}}
            put(results, row, "python", f"{label}/{kind}", per_call_us(fn, max(reps // 4, 10)))
            rows.append(row)
        # The decode loop's logprob call in C++ (top 20 and the log-sum-exp, one pass) and, under it,
        # the per-term double exponential alone over the vocabulary (docs/sampling.md, "Log-probabilities").
        for label, pairs in (("logprobs k=20 + lse", lambda n: _core._time_logprobs(lg, 20, n)),
                             ("double exp (floor)", lambda n: _core._time_logprob_exp(lg, n))):
            pairs(5)
            got = pairs(reps)
            row = {"logits": kind, "case": label, "_names": {}}
            for col, vals in (("C++", [w / 1e3 for w, _ in got]), ("C++ cpu", [c / 1e3 for _, c in got])):
                put(results, row, col, f"{label}/{kind}/{col}", vals)
            rows.append(row)
    worst = max((r for r in results if r.name.endswith("/C++")), key=lambda r: r.median)
    print(f"vocabulary {N_VOCAB}, numpy {np.__version__}, sampler threads {args.sampler_threads}; "
          f"slowest C++ setting: {worst.name} {worst.median:.1f} us (median of {reps})\n")
    report(results, machine_info(threads=args.sampler_threads, n_vocab=N_VOCAB), args,
           ["logits", "case", "C++", "C++ cpu", "python"] + (["python cold"] if args.cold else [])
           + ["probs", "probs cpu"], rows)


if __name__ == "__main__":
    main()
