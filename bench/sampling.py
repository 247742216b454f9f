"""Sampling latency over the full 129,280-entry DeepSeek V4 vocabulary (microseconds per token).

    PYTHONPATH=python python bench/sampling.py
    PYTHONPATH=python python bench/sampling.py --quick --json /tmp/sampling.json
    PYTHONPATH=python python bench/sampling.py --baseline /tmp/sampling.json

Two logit shapes: ``peaked`` (a few dozen strong candidates over a N(0, 2) floor, like a language
model's next-token logits) and ``flat`` (N(0, 3): many tokens survive min-p, the worst case for
the walks). Each figure is one ``sample()`` call including parameter handling and the RNG draw.
Target (issue 14): every setting at most 0.1 ms on one core. The costliest are the settings whose
result depends on every token's weight (min_p 0, or top_p < 1): every token's weight rounded into
the exact sequential float32 sum a binade at a time (docs/sampling.md), and for top_p < 1 with
min_p 0 on flat logits a sort of the few thousand tokens the top-p mass needs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
from _common import Result, add_common_args, machine_info, measure, report, time_call  # noqa: E402

from ds4.sampling import Rng, argmax, sample, top_logprobs  # noqa: E402

N_VOCAB = 129280

CASES = [
    ("greedy (temp 0)", dict(temperature=0.0)),
    ("default (T1, top_p 1, min_p .05)", dict()),
    ("T .7 (top_p 1, min_p .05)", dict(temperature=0.7)),
    ("min_p 0", dict(min_p=0.0)),
    ("top_p .9", dict(top_p=0.9)),
    ("top_p .9, min_p 0", dict(top_p=0.9, min_p=0.0)),
    ("top_k 40", dict(top_k=40)),
    ("top_k 1024, top_p .95", dict(top_k=1024, top_p=0.95)),
]


def logits_of(kind: str, seed: int = 0) -> np.ndarray:
    g = np.random.default_rng(seed)
    if kind == "flat":
        return g.normal(0, 3, N_VOCAB).astype(np.float32)
    base = g.normal(0, 2, N_VOCAB)
    strong = g.choice(N_VOCAB, 40, replace=False)
    base[strong] += g.uniform(6, 14, 40)
    return base.astype(np.float32)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = min(args.repeats, 3)
    results: list[Result] = []
    rows: list[dict] = []
    for kind in ("peaked", "flat"):
        lg = logits_of(kind)
        for label, kw in CASES:
            rng = Rng(1)
            secs = time_call(lambda: sample(lg, rng=rng, **kw), args.repeats, warmup=3, min_time=0.05)
            name = f"sample/{kind}/{label}"
            r = measure(name, "us", [s * 1e6 for s in secs])
            results.append(r)
            rows.append({"logits": kind, "case": label, "us/token": r.median, "spread": f"{r.min:.3g}-{r.max:.3g}",
                         "_names": {"us/token": name}})
        for label, fn in (("argmax", lambda: argmax(lg)), ("top_logprobs k=20", lambda: top_logprobs(lg, 20))):
            secs = time_call(fn, args.repeats, warmup=3, min_time=0.05)
            name = f"{label}/{kind}"
            r = measure(name, "us", [s * 1e6 for s in secs])
            results.append(r)
            rows.append({"logits": kind, "case": label, "us/token": r.median, "spread": f"{r.min:.3g}-{r.max:.3g}",
                         "_names": {"us/token": name}})
    print(f"vocabulary {N_VOCAB}, numpy {np.__version__}, 1 thread\n")
    report(results, machine_info(threads=1, n_vocab=N_VOCAB), args, ["logits", "case", "us/token", "spread"], rows)


if __name__ == "__main__":
    main()
