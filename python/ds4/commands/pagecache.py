"""``ds4 pagecache FILE... [--recache] [--json]``: is the model in the page cache in 2 MiB pages?"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "pagecache", help="report (or redo) how a model file sits in the page cache: 2 MiB or 4 KiB pages",
        description="Read each file through a map as the engine does and report how much of it the "
                    "kernel maps with 2 MiB pages (decode streams the weights; 4 KiB pages cost TLB "
                    "misses). --recache drops the file's unmapped cached pages first and reads it back "
                    "through a map that asks for 2 MiB pages (Linux). See docs/pagecache.md.")
    p.add_argument("files", nargs="+", help="model files")
    p.add_argument("--recache", action="store_true",
                   help="drop the files' cached pages that no process maps, then read them back in 2 MiB pages")
    p.add_argument("--json", action="store_true", help="print one JSON object per file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..pagecache import probe, recache

    for path in args.files:
        state = recache(path) if args.recache else probe(path)
        if args.json:
            sys.stdout.write(json.dumps(state.to_dict()) + "\n")
        else:
            print(state)
    return 0
