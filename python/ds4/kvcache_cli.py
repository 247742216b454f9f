"""Command-line wiring of the disk KV cache: the ``--kv-cache-*`` flags (upstream's
``--kv-disk-*`` names accepted) and the :class:`ds4.kvcache.KVCache` they ask for."""

from __future__ import annotations

from typing import Any

from .errors import InvalidArgumentError
from .kvcache import KVCache
from .kvcache_store import MiB

__all__ = ["add_arguments", "from_args"]


def add_arguments(parser: Any) -> None:
    """Add the disk-cache flags to an argparse parser (upstream names in parentheses):
    ``--kv-cache-dir`` (``--kv-disk-dir``), ``--kv-cache-mb`` (``--kv-disk-space-mb``) and the
    ``--kv-cache-*`` policy knobs of docs/runtime.md §7.7."""
    g = parser.add_argument_group("disk KV cache")
    g.add_argument("--kv-cache-dir", "--kv-disk-dir", dest="kv_cache_dir", default=None, metavar="DIR",
                   help="reuse prompt prefixes across runs through .kv files in DIR (off by default)")
    g.add_argument("--kv-cache-mb", "--kv-disk-space-mb", dest="kv_cache_mb", type=int, default=4096,
                   metavar="N", help="disk budget in MiB (default 4096)")
    g.add_argument("--kv-cache-min-tokens", type=int, default=512, metavar="N",
                   help="store and restore only prefixes of at least N tokens (default 512)")
    g.add_argument("--kv-cache-cold-max-tokens", type=int, default=30000, metavar="N",
                   help="store a prompt that had no cache hit only if it has at most N tokens; restoring a "
                        "longer file deletes it; 0 disables these cold stores (default 30000)")
    g.add_argument("--kv-cache-continued-interval-tokens", type=int, default=10000, metavar="N",
                   help="store the live state again each time it grows by N tokens (rounded up to the "
                        "alignment); 0 disables (default 10000)")
    g.add_argument("--kv-cache-boundary-trim-tokens", type=int, default=32, metavar="N",
                   help="a cold store without a chat anchor leaves out the last N prompt tokens (BPE "
                        "may merge across the end) (default 32)")
    g.add_argument("--kv-cache-boundary-align-tokens", type=int, default=2048, metavar="N",
                   help="round such a cold store down to a multiple of N tokens (the prefill chunk); 0 "
                        "disables (default 2048)")
    g.add_argument("--kv-cache-reject-different-quant", action="store_true",
                   help="do not restore files written by a model with other expert quantization bits "
                        "(by default 2-bit and 4-bit files are interchangeable)")


def from_args(args: Any) -> KVCache | None:
    """The :class:`KVCache` the flags of :func:`add_arguments` ask for, or None when disabled."""
    if not getattr(args, "kv_cache_dir", None):
        return None
    if args.kv_cache_mb < 0:
        raise InvalidArgumentError(f"--kv-cache-mb {args.kv_cache_mb}: expected a positive number of MiB")
    return KVCache(
        args.kv_cache_dir, max_bytes=args.kv_cache_mb * MiB, min_tokens=args.kv_cache_min_tokens,
        cold_max_tokens=args.kv_cache_cold_max_tokens,
        continued_interval=args.kv_cache_continued_interval_tokens,
        boundary_trim=args.kv_cache_boundary_trim_tokens, boundary_align=args.kv_cache_boundary_align_tokens,
        reject_different_quant=args.kv_cache_reject_different_quant,
    )
