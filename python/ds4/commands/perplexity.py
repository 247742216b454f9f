"""``ds4 perplexity -m MODEL -f TEXT``: perplexity in windows of ``--ctx`` tokens, the first half
of each window as context (:mod:`ds4.perplexity` states the method), with ``--save-logits FILE``
to keep the distributions and ``--kl-divergence BASE`` to compare against saved ones.

Progress goes to stderr (a bar on a terminal, and one line per window with the running estimate);
the final report goes to stdout, and as JSON to ``--json FILE``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from typing import Any

__all__ = ["register", "run", "format_report"]


def register(subparsers: Any) -> None:
    from ..steering import add_arguments as add_steering_arguments

    p = subparsers.add_parser("perplexity", help="perplexity of a text; KL divergence against a saved run",
                              description="Perplexity over a text file in windows of --ctx tokens, the first half "
                                          "of each window as context (docs/quality.md).")
    p.add_argument("-m", "--model", default=None, help="GGUF model (default: the bundled tiny synthetic model)")
    p.add_argument("-f", "--file", default=None, metavar="TEXT",
                   help="UTF-8 text file (optional with --kl-divergence: the base file holds the tokens)")
    p.add_argument("-c", "--ctx", type=int, default=None, metavar="N",
                   help="window size in tokens (default 512, or the base file's with --kl-divergence)")
    p.add_argument("--chunks", type=int, default=None, metavar="N", help="evaluate at most N windows")
    p.add_argument("--save-logits", default=None, metavar="FILE",
                   help="stream every scored position's log-probabilities to FILE (float16, written atomically)")
    p.add_argument("--kl-divergence", default=None, metavar="BASE",
                   help="compare with the distributions saved in BASE by --save-logits (same text and window)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the report as JSON")
    p.add_argument("-t", "--threads", type=int, default=None, metavar="N", help="CPU threads")
    p.add_argument("--progress", action="store_true", help="always show the progress bar")
    add_steering_arguments(p)
    p.set_defaults(func=run)


def _load_windows(args: argparse.Namespace, engine, base):
    from ..errors import Ds4IOError, InvalidArgumentError, LogitsFileError
    from ..perplexity import make_windows

    window = args.ctx
    if base is not None:
        if window is not None and window != base.window:
            raise LogitsFileError(f"{base.path}: saved with windows of {base.window} tokens, --ctx is {window}")
        window = base.window
    window = 512 if window is None else window
    limit = args.chunks
    if args.file is None:
        if base is None:
            raise InvalidArgumentError("give the text with -f FILE (or --kl-divergence BASE, whose file holds it)")
        n = base.n_windows if limit is None else min(limit, base.n_windows)
        return [base.tokens(i).copy() for i in range(n)], window
    try:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise Ds4IOError(f"{args.file}: cannot read text file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise InvalidArgumentError(f"{args.file}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    tok = engine.tokenizer
    windows = make_windows(tok.encode(text), window, tok.require("bos"), limit)
    if base is not None and len(windows) > base.n_windows:
        windows = windows[:base.n_windows]
    return windows, window


def run(args: argparse.Namespace) -> int:
    from ..engine import Engine
    from ..logits_file import LogitsReader, LogitsWriter
    from ..perplexity import KlStats, NllStats, run_windows, scored_count
    from ..steering import from_args as steering_from_args
    from ..testing import default_model_path
    from .generate import ProgressBar

    model = args.model if args.model is not None else default_model_path()
    base = LogitsReader(args.kl_divergence) if args.kl_divergence else None
    engine = Engine(model, threads=args.threads, steering=steering_from_args(args))
    windows, window = _load_windows(args, engine, base)
    scored = scored_count(window)
    total = len(windows) * scored
    print(f"ds4: perplexity over {len(windows)} windows of {window} tokens (BOS + {window - 1} text tokens; "
          f"the last {scored} of each scored, {total} in all)", file=sys.stderr)
    nll, kl = NllStats(), (KlStats() if base is not None else None)
    bar = ProgressBar(enabled=True if args.progress else None, min_total=1, label="perplexity")
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        bar(done, total)

    meta = {"model": str(model), "text": str(args.file) if args.file else None,
            "method": "non-overlapping windows, BOS + window-1 tokens, second half scored"}
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:   # a failed or interrupted run removes the partial logits file
        writer = stack.enter_context(LogitsWriter(args.save_logits, n_vocab=engine.shape.n_vocab, window=window,
                                                  scored=scored, meta=meta)) if args.save_logits else None
        try:
            for res in run_windows(engine, windows, base=base, kl=kl, on_token=tick):
                nll.add(res.nll)
                if writer is not None:
                    writer.append(res.tokens, res.logprobs)
                bar.close()
                extra = f", KL {sum(kl.kl) / kl.n:.6f}" if kl is not None else ""
                print(f"[{res.index + 1}/{len(windows)}] ppl {nll.ppl:.4f} ± {nll.ppl_err:.4f}{extra} "
                      f"({nll.n / (time.monotonic() - t0):.1f} tokens/s scored)", file=sys.stderr)
        finally:
            bar.close()
    if writer is not None:
        print(f"ds4: wrote {writer.n_windows} windows of log-probabilities to {args.save_logits}", file=sys.stderr)
    report = {"model": str(model), "window": window, "windows": len(windows), "scored_tokens": nll.n,
              "mean_nll": nll.mean, "ppl": nll.ppl, "ppl_err": nll.ppl_err,
              "seconds": round(time.monotonic() - t0, 3)}
    if kl is not None:
        report["kl_divergence"] = {"base": str(args.kl_divergence), **kl.summary()}
    sys.stdout.write(format_report(report))
    if args.json:
        from pathlib import Path

        from .._atomic import write_atomic
        write_atomic(Path(args.json), [(json.dumps(report, indent=2) + "\n").encode()])
    return 0


def _pct(v: float) -> str:
    return f"{100 * v:8.3f} %"


def format_report(r: dict) -> str:
    """The human-readable final report."""
    lines = [f"Final estimate: PPL = {r['ppl']:.4f} +/- {r['ppl_err']:.4f}   "
             f"({r['scored_tokens']} tokens scored in {r['windows']} windows of {r['window']}; "
             f"mean NLL {r['mean_nll']:.6f})"]
    k = r.get("kl_divergence")
    if k:
        ratio = r["ppl"] / k["base_ppl"]
        lines += [
            f"Base PPL          : {k['base_ppl']:.4f} +/- {k['base_ppl_err']:.4f}   (this/base = {ratio:.6f}, "
            f"ln ratio {math.log(ratio):+.6f})",
            f"Mean KL(base||this): {k['kl_mean']:.6f} +/- {k['kl_mean_err']:.6f}",
            f"Max KL            : {k['kl_max']:.6f}",
            *(f"KL {p:>5}%         : {v:.6f}" for p, v in k["kl_percentiles"].items()),
            f"Same top-1 token  : {_pct(k['top1_agreement'])}",
            f"Mean Δp           : {_pct(k['dp_mean'])}   RMS Δp: {_pct(k['dp_rms'])}",
            f"Δp min / max      : {_pct(k['dp_min'])} / {_pct(k['dp_max'])}",
            *(f"Δp {p:>5}%         : {_pct(v)}" for p, v in k["dp_percentiles"].items()),
        ]
    return "\n".join(lines) + "\n"
