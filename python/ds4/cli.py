"""The ``ds4`` command line: ``ds4 <command> ...``.

Each subcommand lives in ``ds4.commands.<name>`` and exposes ``register(subparsers)``, which adds
its parser and sets ``func(args) -> int``. Commands whose module is absent are skipped, so the CLI
works in any partial build. Errors print one line to stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

from . import __version__
from .errors import Ds4Error

__all__ = ["main", "build_parser", "COMMANDS"]

COMMANDS = ("inspect", "generate", "chat", "cache", "bench", "perplexity", "steering", "serve", "pagecache")
EXIT_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ds4", description="DeepSeek V4 Flash/Pro GGUF inference")
    parser.add_argument("--version", action="version", version=f"ds4 {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"ds4.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"ds4.commands.{name}":
                continue
            _skip(name, e)
            continue
        except Exception as e:  # a broken optional command must not take the others down
            _skip(name, e)
            continue
        module.register(sub)
    return parser


def _skip(name: str, e: BaseException) -> None:
    if os.environ.get("DS4_DEBUG"):
        print(f"ds4: command {name!r} unavailable: {type(e).__name__}: {e}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    try:
        return int(func(args) or 0)
    except Ds4Error as e:
        print(f"ds4 {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        # the reader went away (e.g. `ds4 inspect --json | head`): not an error worth a message
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except OSError as e:
        print(f"ds4 {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"ds4 {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
