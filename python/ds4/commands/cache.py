"""``ds4 cache ls|show|rm``: look inside a disk KV cache directory (``--kv-cache-dir``).

    ds4 cache ls DIR [--json]              one line per file: tokens, ctx, quant, hits, age, size,
                                           reason, start of the cached text; invalid files last
    ds4 cache show DIR|FILE [SHA...] [--model GGUF] [--json]
                                           headers, payload header and section check per file
    ds4 cache rm DIR (SHA... | --all | --invalid)

These commands only read (``rm`` only deletes what it is asked to): they never evict, create the
directory or clean temp files, unlike opening a :class:`ds4.KVCache`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

__all__ = ["register", "run_ls", "run_show", "run_rm"]

PREVIEW_BYTES = 40


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("cache", help="list, inspect or delete disk KV cache files",
                              description="Inspect a disk KV cache directory (upstream-compatible .kv files).")
    sub = p.add_subparsers(dest="cache_command", metavar="ACTION")
    p.set_defaults(func=lambda args: (p.print_help(sys.stderr), 2)[1])

    ls = sub.add_parser("ls", help="list cache files")
    ls.add_argument("dir", help="cache directory")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=run_ls)

    show = sub.add_parser("show", help="describe cache files in detail")
    show.add_argument("target", help="a .kv file or a cache directory")
    show.add_argument("sha", nargs="*", help="SHA prefixes to select in a directory (default: all)")
    show.add_argument("--model", default=None, metavar="GGUF",
                      help="check payload sections against this model's shape (else inferred)")
    show.add_argument("--text", type=int, default=200, metavar="N", help="text bytes to print (default 200)")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=run_show)

    rm = sub.add_parser("rm", help="delete cache files")
    rm.add_argument("dir", help="cache directory")
    rm.add_argument("sha", nargs="*", help="SHA prefixes of the files to delete")
    rm.add_argument("--all", action="store_true", help="delete every cache file")
    rm.add_argument("--invalid", action="store_true", help="delete files that are not valid entries")
    rm.set_defaults(func=run_rm)


def _scan(directory: str):
    from ..errors import Ds4IOError
    from ..kvcache_store import scan_directory

    d = Path(directory).expanduser()
    if not d.is_dir():
        raise Ds4IOError(f"{d}: no such cache directory")
    return scan_directory(d, clean_temp=False)


def _preview(text: bytes, n: int = PREVIEW_BYTES) -> str:
    s = text[:n].decode("utf-8", "replace")
    s = "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)  # one line: escape \n, \t...
    return s + ("..." if len(text) > n else "")


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _read_text(path: Path, nbytes: int) -> bytes:
    from ..kvcache_format import KVC_PREFIX_BYTES

    try:
        with open(path, "rb") as fp:
            fp.seek(KVC_PREFIX_BYTES)
            return fp.read(nbytes)
    except OSError:
        return b""


def _entry_dict(e: Any, now: float) -> dict[str, Any]:
    return {
        "sha": e.sha, "path": str(e.path), "tokens": e.tokens, "ctx": e.ctx, "quant_bits": e.quant_bits,
        "hits": e.hits, "reason": e.reason, "key": e.key_kind, "created_at": e.created_at,
        "last_used": e.last_used, "age_s": max(0, int(now - (e.last_used or e.created_at))),
        "file_size": e.file_size, "text_bytes": e.text_bytes, "payload_bytes": e.payload_bytes,
    }


def run_ls(args: argparse.Namespace) -> int:
    entries, invalid = _scan(args.dir)
    entries.sort(key=lambda e: (e.last_used or e.created_at), reverse=True)
    now = time.time()
    total = sum(e.file_size for e in entries) + sum(f.file_size for f in invalid)
    if args.json:
        out = {
            "dir": str(Path(args.dir).expanduser()),
            "entries": [dict(_entry_dict(e, now), text=_preview(_read_text(e.path, 200), 200)) for e in entries],
            "invalid": [{"path": str(f.path), "file_size": f.file_size, "error": f.error} for f in invalid],
            "total_bytes": total,
        }
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print(f"{'sha':12s} {'tokens':>7s} {'ctx':>7s} {'q':>2s} {'hits':>5s} {'age':>5s} {'MiB':>9s} "
          f"{'reason':9s} text")
    for e in entries:
        age = _age(now - (e.last_used or e.created_at))
        text = _preview(_read_text(e.path, PREVIEW_BYTES + 1))
        print(f"{e.sha[:12]} {e.tokens:7d} {e.ctx:7d} {e.quant_bits:2d} {e.hits:5d} {age:>5s} "
              f"{e.file_size / 2**20:9.2f} {e.reason:9s} {text}")
    for f in invalid:
        print(f"INVALID {f.path.name} ({f.file_size} B): {f.error}")
    print(f"{len(entries)} entries, {len(invalid)} invalid, {total / 2**20:.2f} MiB total")
    return 0


def _select(target: str, prefixes: Sequence[str]):
    from ..errors import Ds4IOError
    from ..kvcache import InvalidCacheFile, probe_file
    from ..kvcache_format import sha_from_name

    p = Path(target).expanduser()
    if p.is_file():
        try:
            found = probe_file(p, sha_from_name(p.name) or "")
        except OSError as e:
            raise Ds4IOError(f"{p}: cannot read cache file: {e.strerror or e}") from e
        return ([], [found]) if isinstance(found, InvalidCacheFile) else ([found], [])
    entries, invalid = _scan(target)
    if prefixes:
        want = [s.lower() for s in prefixes]
        entries = [e for e in entries if any(e.sha.startswith(w) for w in want)]
        invalid = [f for f in invalid if any(f.path.name.lower().startswith(w) for w in want)]
    return entries, invalid


def _ratio_candidates(n_layer: int, model: str | None):
    from ..layout import INT_LIMITS
    from ..shape import flash_ratios, pro_ratios

    if model:
        from ..inspection import inspect

        shape = inspect(model).shape
        if shape is None:
            from ..errors import UnsupportedModelError
            raise UnsupportedModelError(f"{model}: not a DeepSeek V4 model; cannot check payload sections")
        return [("model", tuple(shape.compress_ratios))]
    if not INT_LIMITS["n_layer"][0] <= n_layer <= INT_LIMITS["n_layer"][1]:
        return []  # no DS4 model has that many layers: nothing to build a schedule for
    return [("flash schedule", flash_ratios(n_layer)), ("pro schedule", pro_ratios(n_layer))]


def _when(t: int) -> str:
    """A header timestamp for people; any u64 is printable (out-of-range ones say so)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return f"{t} (not a valid time)"


def _describe(e: Any, args: argparse.Namespace, now: float) -> dict[str, Any]:
    from ..errors import CacheFormatError
    from ..kvcache_format import KVC_PREFIX_BYTES, decode_tool_map, sha1_hex
    from ..payload import read_payload_header, read_payload_info

    d = _entry_dict(e, now)
    d["ext_flags"] = e.ext_flags
    problems: list[str] = []
    with open(e.path, "rb") as fp:
        fp.seek(KVC_PREFIX_BYTES)
        text = fp.read(e.text_bytes)
        payload = fp.read(e.payload_bytes)
        trailer = fp.read()
    if len(text) != e.text_bytes:
        problems.append("truncated text")
    elif e.sha and sha1_hex(text) != e.sha:
        problems.append("text does not hash to the file name")
    d["text"] = text[: args.text].decode("utf-8", "replace")
    if len(payload) != e.payload_bytes:
        problems.append(f"truncated payload: {len(payload)} of {e.payload_bytes} bytes")
    try:
        ph = read_payload_header(payload)
        d["payload_header"] = {k: v for k, v in vars(ph).items() if k not in ("magic", "version")}
        if ph.tokens != e.tokens:
            problems.append(f"payload holds {ph.tokens} tokens, header says {e.tokens}")
        layouts = []
        last_err = f"no DS4 schedule has {ph.n_layer} layers"
        for name, ratios in _ratio_candidates(ph.n_layer, args.model):
            try:
                info = read_payload_info(payload, ratios)
                layouts.append(name)
                d["n_comp"] = list(info.n_comp)
                d["n_index_comp"] = list(info.n_index_comp)
            except CacheFormatError as err:
                last_err = str(err)
        if layouts:
            d["payload_layout"] = layouts[0]
        else:
            problems.append(f"payload sections do not match any known schedule: {last_err}")
    except CacheFormatError as err:
        problems.append(str(err))
    if e.ext_flags & 1:
        d["tool_map_ids"] = sorted(decode_tool_map(trailer))
    d["trailer_bytes"] = len(trailer)
    d["problems"] = problems
    return d


def run_show(args: argparse.Namespace) -> int:
    entries, invalid = _select(args.target, args.sha)
    now = time.time()
    described = [_describe(e, args, now) for e in entries]
    if args.json:
        json.dump({"entries": described,
                   "invalid": [{"path": str(f.path), "error": f.error} for f in invalid]}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0 if all(not d["problems"] for d in described) and not invalid else 1
    for d in described:
        print(f"{d['path']}")
        print(f"  tokens {d['tokens']}  ctx {d['ctx']}  quant {d['quant_bits']}-bit  hits {d['hits']}  "
              f"reason {d['reason']}  key {d['key']}  ext 0x{d['ext_flags']:02x}")
        print(f"  created {_when(d['created_at'])}  last used {_when(d['last_used'])}  "
              f"size {d['file_size']} B (text {d['text_bytes']}, payload {d['payload_bytes']}, "
              f"trailer {d['trailer_bytes']})")
        if "payload_header" in d:
            ph = d["payload_header"]
            print("  payload: " + ", ".join(f"{k}={v}" for k, v in ph.items()))
        if "payload_layout" in d:
            print(f"  payload sections match the {d['payload_layout']}; compressed rows {d['n_comp']}")
        if "tool_map_ids" in d:
            print(f"  tool map: {len(d['tool_map_ids'])} ids")
        print(f"  text: {d['text']!r}")
        print("  OK" if not d["problems"] else "  PROBLEMS: " + "; ".join(d["problems"]))
    for f in invalid:
        print(f"{f.path}\n  INVALID: {f.error}")
    return 0 if all(not d["problems"] for d in described) and not invalid else 1


def run_rm(args: argparse.Namespace) -> int:
    from ..errors import InvalidArgumentError

    if not (args.sha or args.all or args.invalid):
        raise InvalidArgumentError("say which files to delete: SHA prefixes, --all or --invalid")
    entries, invalid = _scan(args.dir)
    victims = []
    if args.all:
        victims = [e.path for e in entries] + [f.path for f in invalid]
    else:
        want = [s.lower() for s in args.sha]
        victims = [e.path for e in entries if any(e.sha.startswith(w) for w in want)]
        if args.invalid:
            victims += [f.path for f in invalid]
    removed = 0
    for path in victims:
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    print(f"removed {removed} file{'s' if removed != 1 else ''}")
    return 0
