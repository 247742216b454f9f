"""``ds4 generate -m MODEL -p TEXT ...``: one-shot generation, streamed to stdout.

Like upstream's ``ds4 -p``: the prompt is one chat turn with the system text (default "You are a
helpful assistant"), unless it starts with the BOS string (already-rendered chat) or ``--raw`` is
given (plain text, no template). Reasoning is printed dimmed on a terminal; speeds go to stderr as
``ds4: prefill: X t/s, generation: Y t/s``.

``--kv-cache-dir DIR`` (and the other ``--kv-cache-*`` flags of :mod:`ds4.kvcache`) keeps session
checkpoints on disk: a later run whose prompt starts with a cached text restores it and prefills
only the rest (stderr says how many tokens came from the cache); a clean exit stores the final
state (``shutdown``). Cache problems are warnings on stderr, never lost output.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from types import SimpleNamespace
from typing import Any, Sequence

from ..errors import ContextOverflowError, Ds4IOError, InvalidArgumentError
from ..speculative import DEFAULT_MARGIN
from ..kvcache_cli import add_arguments as add_kv_cache_arguments
from ..steering import add_arguments as add_steering_arguments

__all__ = ["register", "run", "add_sampling_args", "add_steering_arguments", "open_engine", "open_kv_cache",
           "speculative_from_args", "margin_from_args", "ReferenceEngine",
           "ProgressBar", "think_from_args", "StreamPrinter", "report_cache"]

_DIM, _RESET = "\x1b[2m", "\x1b[0m"


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """Model, context, sampling and thinking flags shared by ``generate`` and ``chat``."""
    p.add_argument("-m", "--model", default=None, help="GGUF model (default: the bundled tiny synthetic model)")
    p.add_argument("-c", "--ctx", type=int, default=32768, metavar="N", help="context size (default 32768)")
    p.add_argument("-sys", "--system", default="You are a helpful assistant",
                   help='system text (default "You are a helpful assistant"; "" disables)')
    p.add_argument("-n", "--max-tokens", "--tokens", dest="max_tokens", type=int, default=None, metavar="N",
                   help="generation budget (default: until EOS or the context is full)")
    p.add_argument("--temp", type=float, default=1.0, metavar="T", help="temperature (default 1; <= 0 greedy)")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="top-k (default 0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="top-p (default 1)")
    p.add_argument("--min-p", type=float, default=0.05, metavar="P", help="min-p (default 0.05)")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="RNG seed (default: time based)")
    p.add_argument("--think", nargs="?", const="high", default="high", choices=("none", "high", "max"),
                   help="thinking mode (default high; max needs ctx >= 393216)")
    p.add_argument("--nothink", dest="think", action="store_const", const="none", help="disable thinking")
    p.add_argument("--think-max", dest="think", action="store_const", const="max", help="think mode max")
    p.add_argument("-t", "--threads", type=int, default=None, metavar="N",
                   help="CPU threads (default: physical cores)")
    p.add_argument("--reference", action="store_true",
                   help="run the pure-numpy reference model instead of the compiled engine (small models only)")
    p.add_argument("--progress", action="store_true", help="always show the prefill progress bar")
    p.add_argument("--mtp", nargs="?", const="", default=None, metavar="FILE",
                   help="speculative decoding with the MTP block: from FILE, or (no FILE) the one the model embeds")
    p.add_argument("--mtp-draft", type=int, default=3, metavar="N",
                   help="with --mtp: tokens drafted per step, verified in one batched pass (default 3, at most 16)")
    p.add_argument("--mtp-margin", type=float, default=DEFAULT_MARGIN, metavar="F",
                   help="with --mtp: draft only while the MTP's top-1 minus top-2 logit is at least F "
                        f"(default {DEFAULT_MARGIN:g}; 0: no margin test)")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("generate", help="generate text from a prompt",
                              description="One-shot generation from a prompt, streamed to stdout.")
    add_sampling_args(p)
    add_kv_cache_arguments(p)
    add_steering_arguments(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-p", "--prompt", default=None, help="prompt text")
    src.add_argument("--prompt-file", default=None, metavar="FILE", help="read the prompt from FILE")
    p.add_argument("--raw", action="store_true", help="plain-tokenize the prompt (no chat template, no BOS)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--dump-tokens", action="store_true",
                   help="print the prompt's tokens (id and vocabulary string) and exit; no inference")
    p.add_argument("--dump-logprobs", default=None, metavar="FILE",
                   help="greedy continuation writing each step's top logprobs as JSON (upstream's format)")
    p.add_argument("--logprobs-top-k", type=int, default=20, metavar="N",
                   help="entries per step for --dump-logprobs (default 20, at most 128)")
    p.set_defaults(func=run)


def think_from_args(args: argparse.Namespace) -> str:
    return args.think


# ---- engines -------------------------------------------------------------------------------------


class _ReferenceSession:
    """The session API over ``ds4.reference`` state (extend = decode token by token, else rebuild)."""

    def __init__(self, model, ctx: int) -> None:
        if ctx <= 0:
            raise InvalidArgumentError(f"ctx must be > 0, got {ctx}")
        self._model, self.ctx = model, int(ctx)
        self._st = None
        self.logits = None

    @property
    def tokens(self) -> list[int]:
        return list(self._st.tokens) if self._st is not None else []

    @property
    def pos(self) -> int:
        return len(self._st.tokens) if self._st is not None else 0

    def sync(self, tokens: Sequence[int], progress=None) -> None:
        tokens = [int(t) for t in tokens]
        if not tokens or len(tokens) >= self.ctx:
            raise ContextOverflowError(f"prompt of {len(tokens)} tokens exceeds the context of {self.ctx}")
        live = self.tokens
        if self._st is not None and len(live) <= len(tokens) and tokens[: len(live)] == live:
            suffix = tokens[len(live):]
            for i, t in enumerate(suffix):
                self.logits = self._model.decode(self._st, t)
                if progress is not None:
                    progress(i + 1, len(suffix))
            return
        self._st = self._model.new_state(self.ctx)
        self.logits = self._model.prefill(self._st, tokens)
        if progress is not None:
            progress(len(tokens), len(tokens))

    def common_prefix(self, tokens: Sequence[int]) -> int:
        from ..session import common_prefix_len

        return common_prefix_len(self.tokens, tokens)

    def eval(self, token: int) -> None:
        if self.pos >= self.ctx:
            raise ContextOverflowError(f"context of {self.ctx} tokens is full")
        self.logits = self._model.decode(self._st, int(token))


class ReferenceEngine:
    """Engine-shaped wrapper of the numpy reference model (for tests and tiny models)."""

    def __init__(self, path: str | os.PathLike[str], steering=None) -> None:
        from ..reference import ReferenceModel
        from ..tokenizer import Tokenizer

        self.model = ReferenceModel(path, steering=steering)
        self.tokenizer = Tokenizer.from_gguf(path)
        self.info = SimpleNamespace(shape=self.model.shape)

    def session(self, ctx: int = 32768) -> _ReferenceSession:
        return _ReferenceSession(self.model, ctx)


def open_kv_cache(args: argparse.Namespace):
    """The disk KV cache the ``--kv-cache-*`` flags ask for, or None. Opened before the model so a
    bad directory fails fast (Ds4IOError naming it); its warnings go to stderr as ``ds4: ...``."""
    import logging

    from ..kvcache_cli import from_args

    if not getattr(args, "kv_cache_dir", None):
        return None
    if getattr(args, "reference", False):
        raise InvalidArgumentError("--kv-cache-dir needs the compiled engine; it cannot be used with --reference")
    log = logging.getLogger("ds4.kvcache")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("ds4: %(message)s"))
        handler.setLevel(logging.WARNING)
        log.addHandler(handler)
    return from_args(args)


def open_engine(args: argparse.Namespace):
    """The engine the flags ask for (``--reference``: the numpy model), with ``--dir-steering-*``."""
    from ..steering import from_args as steering_from_args
    from ..testing import default_model_path

    path = args.model if args.model is not None else default_model_path()
    if not os.path.exists(path):
        raise Ds4IOError(f"{path}: model file not found")
    steering = steering_from_args(args)
    if args.reference:
        if getattr(args, "mtp", None) is not None:
            raise InvalidArgumentError("--mtp needs the compiled engine (not --reference)")
        return ReferenceEngine(path, steering)
    try:
        from ..engine import Engine
    except ModuleNotFoundError as e:
        if e.name not in ("ds4.engine", "ds4._core"):
            raise
        raise InvalidArgumentError(
            "the compiled engine is not available in this build; pass --reference to run the numpy "
            "reference model (small models only)") from None
    mtp = getattr(args, "mtp", None)
    engine = Engine(path, threads=args.threads, mtp_path=mtp or None, steering=steering)
    if mtp is not None and not engine.has_mtp:
        raise InvalidArgumentError(f"--mtp: {path} embeds no MTP block; pass the MTP GGUF as --mtp FILE")
    return engine


def margin_from_args(args: argparse.Namespace) -> float:
    """--mtp-margin (the default where a caller's namespace has none)."""
    return getattr(args, "mtp_margin", DEFAULT_MARGIN)


def speculative_from_args(args: argparse.Namespace) -> int:
    """Draft tokens per step for generate(speculative=...): 0 without --mtp."""
    if getattr(args, "mtp", None) is None:
        return 0
    if not 1 <= args.mtp_draft <= 16:
        raise InvalidArgumentError(f"--mtp-draft must be in 1..16, got {args.mtp_draft}")
    return int(args.mtp_draft)


# ---- terminal output -----------------------------------------------------------------------------


class ProgressBar:
    """A one-line stderr progress bar for long prefills (throttled; cleared when done).

    ``label`` and ``unit`` name the work (other commands reuse it: ``bench``, ``perplexity``...).
    """

    def __init__(self, stream=None, enabled: bool | None = None, min_total: int = 64, label: str = "prefill",
                 unit: str = "tokens") -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.min_total = min_total
        self.label, self.unit = label, unit
        self._last = 0.0
        self._shown = False

    def __call__(self, current: int, total: int) -> None:
        if not self.enabled or total < self.min_total:
            return
        now = time.monotonic()
        if current < total and now - self._last < 0.1:
            return
        self._last = now
        width = 30
        done = int(width * current / max(total, 1))
        self.stream.write(f"\r{self.label} [{'#' * done}{'.' * (width - done)}] {current}/{total} {self.unit}")
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            self.stream.write("\r" + " " * max(70, 50 + len(self.label) + len(self.unit)) + "\r")
            self.stream.flush()
            self._shown = False


class StreamPrinter:
    """Prints token events; reasoning dimmed on a terminal.

    ``end()`` closes the output like upstream's CLI: colour reset, then a newline unless the text
    already ended with one (or nothing was printed), so the stderr speed line starts its own line.
    """

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self._dim = False
        self._line_start = True

    def write(self, text: str, channel: str) -> None:
        if not text:
            return
        want_dim = self.tty and channel == "reasoning"
        if want_dim != self._dim:
            self.stream.write(_DIM if want_dim else _RESET)
            self._dim = want_dim
        self.stream.write(text)
        self.stream.flush()
        self._line_start = text.endswith("\n")

    def end(self) -> None:
        if self._dim:
            self.stream.write(_RESET)
            self._dim = False
        if not self._line_start:
            self.stream.write("\n")
            self._line_start = True
        self.stream.flush()


def report_cache(fin, stream=None) -> None:
    """One stderr line when prompt tokens were restored from the disk cache."""
    if fin.cache_source == "disk" and fin.usage.cached_tokens:
        print(f"ds4: kv cache: {fin.usage.cached_tokens} of {fin.usage.prompt_tokens} prompt tokens "
              "restored from disk", file=stream or sys.stderr)


def store_shutdown(cache, session, engine, stream=None) -> None:
    """The ``shutdown`` checkpoint of a clean exit (skipped below the cache's min tokens)."""
    if cache is None or session is None:
        return
    entry = cache.shutdown(session, engine)
    if entry is not None:
        print(f"ds4: kv cache: saved {entry.tokens} tokens ({entry.path.name})", file=stream or sys.stderr)


def report_speed(fin) -> None:
    cached = f", {fin.usage.cached_tokens} reused" if fin.usage.cached_tokens else ""
    drafted = getattr(fin.usage, "drafted_tokens", 0)
    spec = f", {fin.usage.accepted_tokens}/{drafted} drafts accepted" if drafted else ""
    print(f"ds4: prefill: {fin.prefill_tps:.2f} t/s, generation: {fin.decode_tps:.2f} t/s "
          f"({fin.usage.prompt_tokens} prompt{cached}, {fin.usage.completion_tokens} generated{spec}, "
          f"finish: {fin.finish_reason})", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from ..generation import FinishEvent, generate

    if args.prompt_file is not None:
        try:
            with open(args.prompt_file, encoding="utf-8") as f:
                prompt = f.read()
        except OSError as e:
            raise Ds4IOError(f"{args.prompt_file}: cannot read prompt file: {e}") from e
    else:
        prompt = args.prompt
    if args.dump_tokens:
        return dump_tokens(args, prompt)
    cache = open_kv_cache(args) if args.dump_logprobs is None else None
    engine = open_engine(args)
    if args.dump_logprobs is not None:
        return dump_logprobs(engine, args, prompt)
    session = engine.session(ctx=args.ctx) if cache is not None else None
    bar = ProgressBar(enabled=True if args.progress else None)
    out = StreamPrinter()
    fin = None
    try:
        for ev in generate(engine, prompt=prompt, max_tokens=args.max_tokens, temperature=args.temp,
                           top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, stop=args.stop,
                           seed=args.seed, think=think_from_args(args), system=args.system or None,
                           raw=args.raw, ctx=args.ctx, session=session, progress=bar, kv_cache=cache,
                           speculative=speculative_from_args(args), mtp_margin=margin_from_args(args)):
            if isinstance(ev, FinishEvent):
                fin = ev
            else:
                bar.close()
                out.write(ev.text, ev.channel)
    except KeyboardInterrupt:
        bar.close()
        out.end()
        print("ds4: interrupted", file=sys.stderr)
        return 130
    finally:
        bar.close()
        out.end()  # also before an error message: stderr starts on a fresh line
    if fin is not None:
        report_cache(fin)
        report_speed(fin)
    store_shutdown(cache, session, engine)
    return 0


def dump_tokens(args: argparse.Namespace, prompt: str) -> int:
    """Upstream's ``--dump-tokens`` layout: the id list, then one line per token (id right-aligned
    in 6 columns, two spaces, the raw vocabulary string). Only the GGUF header is read."""
    from ..generation import build_prompt
    from ..testing import default_model_path
    from ..tokenizer import Tokenizer

    path = args.model if args.model is not None else default_model_path()
    tok = Tokenizer.from_gguf(path)
    ids = build_prompt(tok, prompt, system=args.system or None, think=args.think, ctx=args.ctx, raw=args.raw)
    print("[" + ", ".join(str(i) for i in ids) + "]")
    for i in ids:
        print(f"{i:6d}  {tok.tokens[i]}")
    return 0


def _json_token_text(data: bytes) -> str:
    """Upstream's JSON string for a token piece: bytes >= 0x80 become \\u00XX when the piece is not
    valid UTF-8 (the "bytes" array is authoritative)."""
    try:
        data.decode("utf-8")
        valid = True
    except UnicodeDecodeError:
        valid = False
    out = ['"']
    for c in data:
        if c in (0x22, 0x5C):
            out.append("\\" + chr(c))
        elif c == 0x0A:
            out.append("\\n")
        elif c == 0x0D:
            out.append("\\r")
        elif c == 0x09:
            out.append("\\t")
        elif c < 0x20 or (c >= 0x80 and not valid):
            out.append(f"\\u{c:04x}")
        else:
            out.append(chr(c))
    out.append('"')
    text = "".join(out)
    return text.encode("latin-1").decode("utf-8") if valid else text


def _json_token(tok, token: int) -> str:
    data = tok.token_to_bytes(token)
    return f'{{"id":{token},"text":{_json_token_text(data)},"bytes":[{",".join(str(b) for b in data)}]}}'


def dump_logprobs(engine, args: argparse.Namespace, prompt: str) -> int:
    """Upstream's ``--dump-logprobs``: greedy steps with the top-k logprobs of each, as JSON, written
    atomically; stops after the EOS step or when the budget / context runs out."""
    from ..generation import build_prompt
    from ..sampling import argmax, top_logprobs

    tok = engine.tokenizer
    ids = build_prompt(tok, prompt, system=args.system or None, think=args.think, ctx=args.ctx, raw=args.raw)
    if len(ids) >= args.ctx:
        raise ContextOverflowError(f"prompt has {len(ids)} tokens, but the context holds {args.ctx}")
    k = args.logprobs_top_k if args.logprobs_top_k > 0 else 20
    k = min(k, 128)
    s = engine.session(ctx=args.ctx)
    s.sync(ids)
    room = s.ctx - s.pos
    budget = 0 if room <= 1 else room - 1
    if args.max_tokens is not None:
        budget = min(budget, args.max_tokens)
    lines = [f'{{\n  "source":"ds4",\n  "prompt_tokens":{len(ids)},\n  "ctx":{args.ctx},\n  "top_k":{k},\n  "steps":[\n']
    steps = []
    for step in range(budget):
        logits = s.logits
        scores = top_logprobs(logits, k)
        token = argmax(logits)
        tops = ",".join(f'{{"token":{_json_token(tok, e.id)},"logit":{e.logit:.9g},"logprob":{e.logprob:.9g}}}'
                        for e in scores)
        steps.append(f'    {{"step":{step},"selected":{_json_token(tok, token)},"top_logprobs":[{tops}]}}')
        if token == tok.special.eos:
            break
        s.eval(token)
    lines.append(",\n".join(steps))
    lines.append("\n  ]\n}\n")
    path = args.dump_logprobs
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("".join(lines))
        os.replace(tmp, path)
    except OSError as e:
        raise Ds4IOError(f"{path}: cannot write --dump-logprobs file: {e}") from e
    print(f"ds4: wrote {len(steps)} steps to {path}", file=sys.stderr)
    return 0
