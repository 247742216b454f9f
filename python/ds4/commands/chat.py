"""``ds4 chat``: a multi-turn REPL that keeps one live session, so each turn evaluates only its new
tokens (upstream's ``ds4`` interactive mode, docs/runtime.md §10.1).

The transcript is a token list: BOS [+ think-max prefix] [+ system text], then per turn User +
text + the assistant prefix, the generated tokens (reasoning included) and an EOS that the next
turn's sync evaluates. Commands: /help, /think, /think-max, /nothink, /ctx N, /read FILE,
/quit, /exit.

With ``--kv-cache-dir DIR`` the first turn may restore its prefix from the disk cache (files whose
token history is a prefix of the transcript), checkpoints are stored as the cache's policy says
(cold, continued, ``evict`` before /ctx or a think-max toggle drops the session) and a clean exit
(/quit, /exit, end of input) stores the live session (``shutdown``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from ..errors import Ds4Error

__all__ = ["register", "run", "ChatRepl"]

_HELP = """commands:
  /think        thinking mode high
  /think-max    thinking mode max (needs ctx >= 393216)
  /nothink      no thinking
  /ctx N        new session with context N
  /read FILE    send the contents of FILE as the next message
  /quit, /exit  leave"""


def register(subparsers: Any) -> None:
    from .generate import add_kv_cache_arguments, add_sampling_args, add_steering_arguments

    p = subparsers.add_parser("chat", help="interactive multi-turn chat",
                              description="Interactive chat; the live session is kept between turns.")
    add_sampling_args(p)
    add_kv_cache_arguments(p)
    add_steering_arguments(p)
    p.set_defaults(func=run)


class ChatRepl:
    """Transcript + live session + command handling; ``turn(text)`` runs one exchange.

    ``kv_cache``: a :class:`ds4.kvcache.KVCache` used by every turn; :meth:`close` stores the
    ``shutdown`` checkpoint (``loop`` calls it on a clean exit).
    """

    def __init__(self, engine, args: argparse.Namespace, out: TextIO | None = None,
                 err: TextIO | None = None, kv_cache=None) -> None:
        from .generate import ProgressBar, StreamPrinter

        self.engine, self.args = engine, args
        self.kv = kv_cache
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.tok = engine.tokenizer
        self.think = args.think
        self.ctx = args.ctx
        self.session = engine.session(ctx=self.ctx)
        self.printer = StreamPrinter(self.out)
        self.bar = ProgressBar(self.err, enabled=True if args.progress else None)
        self.transcript: list[int] = []
        self._rebuild_transcript_head()

    # -- transcript ---------------------------------------------------------------------------------

    def _effective_think(self) -> str:
        from ..chat import think_mode_for_context

        return think_mode_for_context(self.think, self.ctx)

    def _head(self) -> list[int]:
        from ..chat import THINK_MAX_PREFIX, append_message

        head = [self.tok.require("bos")]
        if self._effective_think() == "max":
            head += self.tok.encode(THINK_MAX_PREFIX)
        if self.args.system:
            append_message(self.tok, head, "system", self.args.system)
        return head

    def _rebuild_transcript_head(self) -> None:
        """Swap the transcript head (think-max prefix toggled): everything after it is kept."""
        old_head_len = getattr(self, "_head_len", len(self.transcript))
        head = self._head()
        self.transcript = head + self.transcript[old_head_len:]
        self._head_len = len(head)

    # -- commands -----------------------------------------------------------------------------------

    def command(self, line: str) -> bool:
        """Handle a /command; returns False when the REPL should end."""
        parts = line.split(maxsplit=1)
        cmd, arg = parts[0], (parts[1].strip() if len(parts) > 1 else "")
        if cmd in ("/quit", "/exit"):
            return False
        if cmd == "/help":
            print(_HELP, file=self.out)
        elif cmd in ("/think", "/think-max", "/nothink"):
            before = self._effective_think()
            self.think = {"/think": "high", "/think-max": "max", "/nothink": "none"}[cmd]
            if (before == "max") != (self._effective_think() == "max"):
                self._rebuild_transcript_head()
                self._new_session(self.ctx)  # the transcript changed at index 1
            note = " (ctx below 393216)" if self.think == "max" and self._effective_think() != "max" else ""
            print(f"Thinking mode: {self._effective_think()}{note}", file=self.err)
        elif cmd == "/ctx":
            try:
                n = int(arg)
                if n <= 0:
                    raise ValueError
            except ValueError:
                print("usage: /ctx N (N > 0)", file=self.err)
                return True
            self.ctx = n
            self._new_session(n)
            self._rebuild_transcript_head()
            print(f"Context: {n} tokens", file=self.err)
        elif cmd == "/read":
            try:
                with open(arg, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                print(f"cannot read {arg!r}: {e}", file=self.err)
                return True
            self.turn(text)
        else:
            print(f"unknown command {cmd}; /help lists them", file=self.err)
        return True

    def _new_session(self, ctx: int) -> None:
        """Replace the live session; with a disk cache its state is stored first (``evict``)."""
        if self.kv is not None and self.session.pos >= self.kv.min_tokens:
            self.kv.store(self.session, "evict", self.engine)
        self.session = self.engine.session(ctx=ctx)

    def close(self) -> None:
        """Clean exit: store the live session in the disk cache (``shutdown``)."""
        from .generate import store_shutdown

        store_shutdown(self.kv, self.session, self.engine, self.err)

    # -- one exchange -------------------------------------------------------------------------------

    def turn(self, text: str):
        from ..chat import append_assistant_prefix, append_message
        from ..generation import FinishEvent, generate
        from .generate import margin_from_args, report_cache, report_speed, speculative_from_args

        before = len(self.transcript)
        append_message(self.tok, self.transcript, "user", text)
        append_assistant_prefix(self.tok, self.transcript, self._effective_think())
        a = self.args
        fin = None
        try:
            for ev in generate(self.engine, tokens=self.transcript, session=self.session,
                               max_tokens=a.max_tokens, temperature=a.temp, top_k=a.top_k, top_p=a.top_p,
                               min_p=a.min_p, seed=a.seed, progress=self.bar, kv_cache=self.kv,
                               speculative=speculative_from_args(a), mtp_margin=margin_from_args(a)):
                if isinstance(ev, FinishEvent):
                    fin = ev
                else:
                    self.bar.close()
                    self.printer.write(ev.text, ev.channel)
        except KeyboardInterrupt:
            self.bar.close()
            self.printer.end()
            del self.transcript[before:]  # roll the turn back; the session may be mid-update
            self.session = self.engine.session(ctx=self.ctx)
            print("interrupted", file=self.err)
            return None
        except Ds4Error:
            self.bar.close()
            self.printer.end()  # the error message starts on its own line
            del self.transcript[before:]
            raise
        self.printer.end()
        self.transcript += list(fin.tokens)
        self.transcript.append(self.tok.require("eos"))  # not evaluated now; the next sync does it
        report_cache(fin, self.err)
        report_speed(fin)
        return fin

    def loop(self, inp: TextIO | None = None) -> int:
        inp = inp or sys.stdin
        interactive = inp.isatty()
        if interactive:
            try:
                import readline  # noqa: F401  (line editing and history for input())
            except ImportError:
                pass
        while True:
            try:
                line = input("ds4> ") if interactive else inp.readline()
            except EOFError:
                break
            if not interactive and line == "":
                break
            line = line.rstrip("\n")
            if not line.strip():
                continue
            try:
                if line.startswith("/"):
                    if not self.command(line.strip()):
                        break
                else:
                    self.turn(line)
            except Ds4Error as e:
                print(f"error: {e}", file=self.err)
        self.close()
        return 0


def run(args: argparse.Namespace) -> int:
    from .generate import open_engine, open_kv_cache

    cache = open_kv_cache(args)
    return ChatRepl(open_engine(args), args, kv_cache=cache).loop()
