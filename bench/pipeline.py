"""Pipeline stages on one machine: 1 vs 2 vs 4 stages, the cost of the split and of Ray.

For each stage count S (default 1, 2, 4) on the ``small`` synthetic model:

* ``prefill``     tokens/s of a fresh ``sync`` of an N-token prompt, pipelined (the pipeline's
                  default chunks, about 2 per stage, all in flight) and not (one chunk: each stage
                  waits for the previous one), with ``busy``: the average number of stages working
                  (their summed forward time over the wall time);
* ``decode``      tokens/s of ``eval`` after the prompt (and the in-process split's, ``decode_local``,
                  with its CPU milliseconds per token, ``decode_cpu_ms``: the split's own cost, which
                  the machine's load does not blur as it blurs wall-clock figures);
* ``overhead``    per decode token: wall time minus the stages' own compute (from their traces),
                  in total and per hop (S + 1 hops: driver -> stage 0 -> ... -> stage S-1 -> driver);
* S = 1 is the plain :class:`ds4.Engine`; S > 1 runs :class:`ds4.distributed.PipelineEngine` on a
  local Ray, and the in-process :class:`ds4.stages.Pipeline` (the split without Ray) for decode.
* ``ray_hop``     the round trip of one Ray actor call carrying an HC state (``hc_dim`` floats) in and
                  a token id out, and one returning the logits (``n_vocab`` floats).

All stages share this machine's cores, so pipelining cannot add compute here: the figures are the
overheads to subtract from the multi-machine estimate in docs/distributed.md.

    PYTHONPATH=python python bench/pipeline.py                         # small, 1/2/4 stages
    PYTHONPATH=python python bench/pipeline.py --model tiny --prompt 128 --repeats 2
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

from _common import add_common_args, machine_info, measure, report  # noqa: E402


def _prefill(eng, toks: list[int], ctx: int, actors=None) -> tuple[float, float]:
    """Tokens/s of one fresh sync (wall clock), and how many stages were busy on average during it
    (the stages' summed forward time / wall time, from their traces: 1 when they take turns, up to
    the stage count when they all work at once; the machine's load does not bias it the way it
    biases tokens/s)."""
    import ray
    s = eng.session(ctx=ctx)
    if actors:
        ray.get([a.trace.remote() for a in actors])
    t = time.perf_counter()
    s.sync(toks)
    wall = time.perf_counter() - t
    busy = sum(t1 - t0 for a in actors or [] for (_, _, _, t0, t1) in ray.get(a.trace.remote()))
    del s
    return len(toks) / wall, busy / wall


def _decode(eng, toks: list[int], ctx: int, steps: int, actors=None) -> tuple[list[float], list[float], list[float]]:
    """Per-step wall seconds, the stages' compute seconds per step (from their traces) and the
    driver's CPU seconds per step."""
    import ray
    s = eng.session(ctx=ctx)
    s.sync(toks)
    if actors:
        ray.get([a.trace.remote() for a in actors])   # drop the prefill's entries
    wall, cpu = [], []
    for _ in range(steps):
        t, c = time.perf_counter(), time.process_time()
        s.eval(s.argmax())
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    compute = [0.0] * steps
    if actors:
        for trace in ray.get([a.trace.remote() for a in actors]):
            for i, (_, _, _, t0, t1) in enumerate(trace[-steps:]):
                compute[i] += t1 - t0
    return wall, compute, cpu


def _ray_hops(hc_dim: int, n_vocab: int, repeats: int) -> tuple[list[float], list[float]]:
    import ray

    @ray.remote(num_cpus=0)
    class Echo:
        def take(self, x):
            return int(x.shape[0])

        def give(self, n):
            return np.zeros(n, np.float32)

    a = Echo.remote()
    hc = np.ones(hc_dim, np.float32)
    ray.get(a.take.remote(hc))
    hop_hc, hop_logits = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(50):
            ray.get(a.take.remote(hc))
        hop_hc.append((time.perf_counter() - t) / 50)
        t = time.perf_counter()
        for _ in range(50):
            ray.get(a.give.remote(n_vocab))
        hop_logits.append((time.perf_counter() - t) / 50)
    ray.kill(a)
    return hop_hc, hop_logits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap)
    ap.set_defaults(repeats=3, threads=1)
    ap.add_argument("--model", default="small", help="ds4.testing preset name or a GGUF path")
    ap.add_argument("--stages", default="1,2,4")
    ap.add_argument("--prompt", type=int, default=512, help="prefill prompt length")
    ap.add_argument("--decode-steps", type=int, default=16)
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.prompt, args.decode_steps = 1, 128, 8

    import ray

    import ds4
    import ds4.testing
    from ds4.distributed import PipelineEngine
    from ds4.stages import Pipeline

    path = Path(args.model) if Path(args.model).is_file() else ds4.testing.cached_model(args.model)
    info = ds4.inspect(path)
    shape = info.shape
    toks = np.random.default_rng(0).integers(0, shape.n_vocab, args.prompt).tolist()
    ctx = args.prompt + args.decode_steps + 8
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    results, rows = [], []
    load = os.getloadavg()[0]

    # Every configuration is loaded first and measured in turn within each repeat, so a change of
    # machine load (this machine is shared) hits them all alike.
    counts = [int(x) for x in args.stages.split(",")]
    engines = {n: (ds4.Engine(path, threads=args.threads) if n == 1 else
                   # all pipelines live at once: each stage reserves a token share of the CPUs
                   PipelineEngine(path, stages=n, threads=args.threads, cpus_per_stage=0.01)) for n in counts}
    local = {n: Pipeline(path, stages=n, threads=args.threads) for n in counts if n > 1}
    samples: dict[str, list[float]] = {}

    def add(name: str, values) -> None:
        samples.setdefault(name, []).extend(values)

    for _ in range(args.repeats):
        for n, eng in engines.items():
            if n == 1:
                add("prefill_1", [_prefill(eng, toks, ctx)[0]])
                wall, _, cpu = _decode(eng, toks, ctx, args.decode_steps)
                add("decode_1", [1 / w for w in wall])
                add("decode_cpu_ms_1", [1e3 * c for c in cpu])
                continue
            speed, busy = _prefill(eng, toks, ctx, eng._actors)
            add(f"prefill_{n}", [speed])
            add(f"prefill_{n}_stages_busy", [busy])
            eng.prefill_chunk = args.prompt          # one chunk: the stages run one after the other
            speed, busy = _prefill(eng, toks, ctx, eng._actors)
            add(f"prefill_{n}_unpipelined", [speed])
            add(f"prefill_{n}_unpipelined_stages_busy", [busy])
            eng.prefill_chunk = 0
            wall, compute, _ = _decode(eng, toks, ctx, args.decode_steps, eng._actors)
            add(f"decode_{n}", [1 / w for w in wall])
            add(f"overhead_{n}_per_token", [1e3 * (w - c) for w, c in zip(wall, compute)])
            add(f"overhead_{n}_per_hop", [1e3 * (w - c) / (n + 1) for w, c in zip(wall, compute)])
            lw, _, lcpu = _decode(local[n], toks, ctx, args.decode_steps)
            add(f"decode_{n}_in_process", [1 / w for w in lw])
            add(f"decode_cpu_ms_{n}_in_process", [1e3 * c for c in lcpu])

    units = {"prefill": "tok/s", "decode": "tok/s", "overhead": "ms", "decode_cpu": "ms"}
    for name, vals in samples.items():
        unit = "stages" if name.endswith("_busy") else next(
            u for k, u in sorted(units.items(), key=lambda kv: -len(kv[0])) if name.startswith(k))
        results.append(measure(name, unit, vals))
    med = {r.name: r.median for r in results}
    for n, eng in engines.items():
        row = {"stages": n, "prefill": med[f"prefill_{n}"], "decode": med[f"decode_{n}"]}
        if n == 1:
            row["decode_cpu_ms"] = med["decode_cpu_ms_1"]
        else:
            rss = [i["max_rss"] / 1e6 for i in ray.get([a.describe.remote() for a in eng._actors])]
            results.append(measure(f"stage_max_rss_{n}", "MB", rss, chunk=eng.chunk_for(args.prompt)))
            row.update(prefill_seq=med[f"prefill_{n}_unpipelined"], busy=med[f"prefill_{n}_stages_busy"],
                       busy_seq=med[f"prefill_{n}_unpipelined_stages_busy"], decode_local=med[f"decode_{n}_in_process"],
                       decode_cpu_ms=med[f"decode_cpu_ms_{n}_in_process"], overhead_ms=med[f"overhead_{n}_per_token"],
                       per_hop_ms=med[f"overhead_{n}_per_hop"], stage_rss_mb=max(rss))
            eng.close()
        rows.append(row)

    hop_hc, hop_logits = _ray_hops(shape.n_hc * shape.n_embd, shape.n_vocab, args.repeats)
    results += [measure("ray_hop_hc_state", "ms", [1e3 * x for x in hop_hc], bytes=4 * shape.n_hc * shape.n_embd),
                measure("ray_hop_logits", "ms", [1e3 * x for x in hop_logits], bytes=4 * shape.n_vocab)]
    ray.shutdown()
    machine = machine_info(load_avg_1min_at_start=load, load_avg_1min_at_end=os.getloadavg()[0], model=str(path),
                           threads_per_stage=args.threads, prompt=args.prompt)
    report(results, machine, args,
           ["stages", "prefill", "prefill_seq", "busy", "busy_seq", "decode", "decode_local", "decode_cpu_ms", "overhead_ms", "per_hop_ms",
            "stage_rss_mb"],
           rows)
    print(f"ray hop with an HC state in: {results[-2].median:.3f} ms; with logits out: {results[-1].median:.3f} ms")
    print(f"load average (1 min) at start {load:.1f}, at end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
