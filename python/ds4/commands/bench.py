"""``ds4 bench``: prefill and decode throughput at growing context frontiers (upstream's ds4-bench;
:mod:`ds4.frontier_bench` states the method).

    ds4 bench -m MODEL --prompt-file TEXT [--ctx-start N --ctx-max N --step-incr N | --step-mul F]
              [-n GEN] [--csv FILE] [--json FILE] [--plot FILE.png]
    ds4 bench --compare A.json B.json [--plot FILE.png]

CSV rows (upstream's columns) go to stdout or ``--csv``; ``--json`` keeps the rows with the run's
settings (model, quantisation, threads, kernels, machine) for ``--compare``. Both files are
rewritten atomically after every frontier, so an interrupted run keeps the rows it finished.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from ._argtypes import positive_int as _positive_int

__all__ = ["register", "run", "format_compare"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help="prefill/decode throughput at growing context frontiers",
                              description="Walk one long prompt to context frontiers; at each, time the "
                                          "incremental prefill and N greedy decode steps (docs/bench.md).")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt-file", default=None, metavar="FILE", help="raw benchmark text (plain tokenization)")
    src.add_argument("--chat-prompt-file", default=None, metavar="FILE",
                     help="render FILE as one no-thinking chat turn, then slice that sequence")
    src.add_argument("--compare", nargs=2, default=None, metavar=("A.json", "B.json"),
                     help="compare two runs saved with --json (no model is loaded)")
    p.add_argument("-sys", "--system", default="You are a helpful assistant.",
                   help="system text for --chat-prompt-file")
    p.add_argument("-m", "--model", default=None, help="GGUF model (default: the bundled tiny synthetic model)")
    p.add_argument("-t", "--threads", type=_positive_int("--threads"), default=None, metavar="N", help="CPU threads")
    p.add_argument("--backend", default="auto", metavar="NAME", help="compute backend (default auto: see ds4.backends)")
    p.add_argument("--ctx-start", type=_positive_int("--ctx-start"), default=2048, metavar="N",
                   help="first frontier (default 2048)")
    p.add_argument("--ctx-max", type=_positive_int("--ctx-max"), default=32768, metavar="N",
                   help="last frontier (default 32768)")
    p.add_argument("--ctx-alloc", type=_positive_int("--ctx-alloc"), default=None, metavar="N",
                   help="session context (default ctx-max + gen-tokens + 1)")
    p.add_argument("--step-incr", type=_positive_int("--step-incr"), default=2048, metavar="N",
                   help="linear step when --step-mul is 1 (default 2048)")
    p.add_argument("--step-mul", type=float, default=1.0, metavar="F", help="multiplicative step (default 1)")
    p.add_argument("-n", "--gen-tokens", "--tokens", dest="gen_tokens", type=_positive_int("--gen-tokens"),
                   default=128, metavar="N", help="greedy decode tokens per frontier (default 128)")
    p.add_argument("--csv", default=None, metavar="FILE", help="write the CSV there instead of stdout")
    p.add_argument("--json", default=None, metavar="FILE", help="save rows + settings as JSON (for --compare)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="PNG plot of prefill and decode t/s against context (needs matplotlib: ds4[plot])")
    p.add_argument("--title", default=None, help="plot title")
    p.add_argument("--progress", action="store_true", help="always show the progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import InvalidArgumentError

    if args.compare:
        return run_compare(args)
    if not args.prompt_file and not args.chat_prompt_file:
        raise InvalidArgumentError("give exactly one of --prompt-file or --chat-prompt-file (or --compare A B)")
    return run_bench(args)


def _read_text(path: str) -> str:
    from ..errors import Ds4IOError, InvalidArgumentError

    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise Ds4IOError(f"{path}: cannot read prompt file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise InvalidArgumentError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def run_bench(args: argparse.Namespace) -> int:
    from .._atomic import write_atomic
    from ..chat import encode_chat_prompt
    from ..engine import Engine
    from ..frontier_bench import BenchRun, csv_header, csv_line, frontiers, machine_settings, run_frontiers
    from ..inspection import inspect
    from ..testing import default_model_path
    from .generate import ProgressBar

    points = frontiers(args.ctx_start, args.ctx_max, args.step_incr, args.step_mul)
    alloc = args.ctx_alloc if args.ctx_alloc is not None else args.ctx_max + args.gen_tokens + 1
    model = args.model if args.model is not None else default_model_path()
    mem = inspect(model, ctx=alloc).memory
    if mem is not None:
        print(f"ds4 bench: session buffers {mem.kv_bytes / 2**20:.2f} MiB of KV state (ctx={alloc}, "
              f"raw rows {mem.raw_cap}, compressed rows {mem.comp_cap})", file=sys.stderr)
    engine = Engine(model, backend=args.backend, threads=args.threads)
    tok = engine.tokenizer
    if args.chat_prompt_file:
        tokens = encode_chat_prompt(tok, _read_text(args.chat_prompt_file), system=args.system or None, think="none")
    else:
        tokens = tok.encode(_read_text(args.prompt_file))
    settings = {**machine_settings(engine), "prompt_file": args.prompt_file or args.chat_prompt_file,
                "chat": bool(args.chat_prompt_file), "prompt_tokens": len(tokens), "ctx_start": args.ctx_start,
                "ctx_max": args.ctx_max, "ctx_alloc": alloc, "step_incr": args.step_incr,
                "step_mul": args.step_mul, "gen_tokens": args.gen_tokens, "complete": False}
    result = BenchRun(settings, [], label=Path(args.json).stem if args.json else "")
    bar = ProgressBar(enabled=True if args.progress else None, min_total=1, label="bench")
    out_csv = [csv_header()]
    if args.csv is None:
        sys.stdout.write(out_csv[0])
        sys.stdout.flush()
    rc = 0
    try:
        for row in run_frontiers(engine, tokens, points, args.gen_tokens, ctx_alloc=alloc, progress=bar):
            bar.close()
            result.rows.append(row)
            out_csv.append(csv_line(row))
            if args.csv is None:
                sys.stdout.write(out_csv[-1])
                sys.stdout.flush()
            else:
                write_atomic(Path(args.csv), ["".join(out_csv).encode()], fsync=False)
            if args.json:
                result.save(args.json)
        settings["complete"] = True
    except KeyboardInterrupt:
        print(f"\nds4 bench: interrupted after {len(result.rows)} of {len(points)} frontiers", file=sys.stderr)
        rc = 130
    finally:
        bar.close()
    if args.json:
        result.save(args.json)
    if args.plot and result.rows:
        from ..bench_plot import plot_runs
        print(f"ds4 bench: wrote {plot_runs([result], args.plot, args.title)}", file=sys.stderr)
    return rc


def format_compare(a, b, rows: list[dict]) -> str:
    """A table of both runs' speeds at their common frontiers, with B/A ratios."""
    def setting(run, key):
        return run.settings.get(key, "?")

    head = [f"A: {a.label}  ({setting(a, 'model')}, {setting(a, 'routed_bits')}-bit experts, "
            f"{setting(a, 'threads')} threads, {setting(a, 'simd')})",
            f"B: {b.label}  ({setting(b, 'model')}, {setting(b, 'routed_bits')}-bit experts, "
            f"{setting(b, 'threads')} threads, {setting(b, 'simd')})", ""]
    cols = f"{'ctx_tokens':>10}  {'prefill A':>10}  {'prefill B':>10}  {'B/A':>6}  {'gen A':>8}  {'gen B':>8}  {'B/A':>6}"
    lines = head + [cols, "-" * len(cols)]
    for r in rows:
        lines.append(f"{r['ctx_tokens']:>10}  {r['prefill_tps_a']:>10.2f}  {r['prefill_tps_b']:>10.2f}  "
                     f"{r['prefill_ratio']:>6.3f}  {r['gen_tps_a']:>8.2f}  {r['gen_tps_b']:>8.2f}  {r['gen_ratio']:>6.3f}")
    ok = [r for r in rows if r["prefill_ratio"] > 0 and r["gen_ratio"] > 0]   # NaN compares False
    if ok:
        gp = math.exp(sum(math.log(r["prefill_ratio"]) for r in ok) / len(ok))
        gg = math.exp(sum(math.log(r["gen_ratio"]) for r in ok) / len(ok))
        lines.append(f"{'geomean':>10}  {'':>10}  {'':>10}  {gp:>6.3f}  {'':>8}  {'':>8}  {gg:>6.3f}")
    return "\n".join(lines) + "\n"


def run_compare(args: argparse.Namespace) -> int:
    from ..errors import InvalidArgumentError
    from ..frontier_bench import compare_runs, load_run

    a, b = (load_run(p) for p in args.compare)
    rows = compare_runs(a, b)
    if not rows:
        raise InvalidArgumentError(f"{args.compare[0]} and {args.compare[1]} share no context frontier")
    sys.stdout.write(format_compare(a, b, rows))
    if args.plot:
        from ..bench_plot import plot_runs
        print(f"ds4 bench: wrote {plot_runs([a, b], args.plot, args.title)}", file=sys.stderr)
    return 0
