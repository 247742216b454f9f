"""``ds4 inspect [FILE] [--ctx N] [--json] [--strict]``: validate a model and describe it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "inspect", help="validate a GGUF model and print its shape, tensors and memory plan",
        description="Validate a GGUF model against the DS4 layout (header only) and describe it.")
    p.add_argument("file", nargs="?", default=None,
                   help="model file (default: the bundled tiny synthetic model)")
    p.add_argument("--ctx", type=int, default=None, metavar="N",
                   help="context size for the memory plan (default 32768)")
    p.add_argument("--json", action="store_true", help="print the full description as JSON")
    p.add_argument("--strict", action="store_true", help="accept only official DeepSeek V4 Flash/Pro")
    p.add_argument("--tensors", action="store_true", help="also list every tensor")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..inspection import inspect
    from ..testing import default_model_path

    path = args.file if args.file is not None else default_model_path()
    info = inspect(path, ctx=args.ctx, strict=args.strict)
    if args.json:
        json.dump(info.to_dict(), sys.stdout, indent=1, ensure_ascii=False)
        sys.stdout.write("\n")
        return 0
    print(info.summary())
    if args.tensors:
        for t in info.tensors.values():
            print(f"  {t.name:48s} {t.type_name:8s} {str(list(t.dims)):24s} @{t.offset} ({t.nbytes} B)")
    return 0
