"""``ds4 serve -m MODEL [--host H] [--port N] [-c CTX] ...``: the OpenAI/Anthropic HTTP server.

Flags follow upstream's ``ds4-server`` (docs/runtime.md §9.8); the disk KV cache flags are those of
:func:`ds4.kvcache.add_arguments` (``--kv-cache-dir`` / ``--kv-disk-dir`` enables it). Without
``-m`` the bundled tiny synthetic model is served (useful to try the API; its text is noise).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from ..errors import Ds4IOError, InvalidArgumentError
from ..speculative import DEFAULT_MARGIN, check_margin
from ._argtypes import positive_int as _positive

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    from ..kvcache_cli import add_arguments
    from ..steering import add_arguments as add_steering_arguments

    p = subparsers.add_parser("serve", help="run the OpenAI/Anthropic compatible HTTP server",
                              description="Serve a model over HTTP (OpenAI chat/completions, Anthropic "
                                          "messages). One generation at a time; requests are queued.")
    p.add_argument("-m", "--model", default=None, help="GGUF model (default: the bundled tiny synthetic model)")
    p.add_argument("--mtp", default=None, metavar="FILE", help="MTP GGUF (separate file)")
    p.add_argument("--mtp-draft", type=int, default=0, metavar="N",
                   help="speculative decoding: MTP tokens drafted per step, 1..16 (default 0: off; needs MTP "
                        "weights, from --mtp or embedded in the model)")
    p.add_argument("--mtp-margin", type=float, default=DEFAULT_MARGIN, metavar="F",
                   help="with --mtp-draft: draft only while the MTP's top-1 minus top-2 logit is at least F "
                        f"(default {DEFAULT_MARGIN:g}; 0: no margin test)")
    p.add_argument("-c", "--ctx", type=_positive("--ctx"), default=32768, metavar="N",
                   help="session context (default 32768)")
    p.add_argument("-n", "--tokens", type=_positive("--tokens"), default=393216, metavar="N",
                   help="default max output tokens per request (default 393216)")
    p.add_argument("-t", "--threads", type=_positive("--threads"), default=None, metavar="N",
                   help="CPU threads (default: physical cores)")
    p.add_argument("--chdir", default=None, metavar="DIR", help="change directory before loading")
    p.add_argument("--backend", dest="backend", default="auto", metavar="NAME",
                   help="compute backend: auto (default) or a name from ds4.available_backends()")
    p.add_argument("--cpu", dest="backend", action="store_const", const="cpu", help="CPU backend")
    p.add_argument("--metal", dest="backend", action="store_const", const="metal", help="Metal backend (not in this build)")
    p.add_argument("--cuda", dest="backend", action="store_const", const="cuda", help="CUDA backend (not in this build)")
    p.add_argument("--pipeline-stages", type=_positive("--pipeline-stages"), default=None, metavar="N",
                   help="split the layers into N stages, one Ray actor each (needs ds4[distributed]; see docs/distributed.md)")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="Ray cluster to place the stages on (default: a local Ray instance)")
    p.add_argument("--host", default="127.0.0.1", help="IPv4 address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument("--cors", action="store_true",
                   help="answer browsers from any origin (CORS: Authorization, x-api-key and the SDK headers allowed)")
    p.add_argument("--api-key", default=os.environ.get("DS4_API_KEY"), metavar="KEY",
                   help="require this key (Authorization: Bearer KEY or x-api-key: KEY) on every endpoint but "
                        "/health (default: $DS4_API_KEY; none: open)")
    p.add_argument("--disable-exact-dsml-tool-replay", action="store_true",
                   help="render prior tool calls canonically instead of replaying the sampled DSML")
    p.add_argument("--tool-memory-max-ids", type=_positive("--tool-memory-max-ids"), default=100000, metavar="N")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="append a human-readable trace of every request (prompt, output, cache decision) to FILE")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    add_arguments(p)
    add_steering_arguments(p)
    p.set_defaults(func=run)


def _open_engine(args: argparse.Namespace, path: str | os.PathLike[str]):
    """A local Engine, or with --pipeline-stages a PipelineEngine on Ray (same session API)."""
    if args.pipeline_stages is None:
        if args.ray_address is not None:
            raise InvalidArgumentError("--ray-address needs --pipeline-stages N")
        from ..engine import Engine
        from ..steering import from_args as steering_from_args
        return Engine(path, backend=args.backend, threads=args.threads, mtp_path=args.mtp,
                      steering=steering_from_args(args))
    if args.dir_steering_file is not None:
        raise InvalidArgumentError("--dir-steering-file needs a single engine; pipeline stages do not steer yet")
    if args.backend not in ("cpu", "auto"):
        raise InvalidArgumentError(f"--pipeline-stages runs CPU stages; --{args.backend} is not available for them")
    from ..distributed import PipelineEngine
    return PipelineEngine(path, stages=args.pipeline_stages, address=args.ray_address, threads=args.threads,
                          mtp_path=args.mtp)


def run(args: argparse.Namespace) -> int:
    from ..kvcache_cli import from_args
    from ..server import ServerConfig, serve
    from ..testing import default_model_path

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(message)s", datefmt="%m%d %H:%M:%S")
    if args.chdir:
        try:
            os.chdir(args.chdir)
        except OSError as e:
            raise Ds4IOError(f"--chdir {args.chdir}: {e.strerror}") from None
    if not 0 <= args.port <= 65535:
        raise InvalidArgumentError(f"--port {args.port}: expected 0..65535")
    path = args.model if args.model is not None else default_model_path()
    if not os.path.exists(path):
        raise Ds4IOError(f"{path}: model file not found")
    if not 0 <= args.mtp_draft <= 16:
        raise InvalidArgumentError(f"--mtp-draft must be in 0..16, got {args.mtp_draft}")
    check_margin(args.mtp_margin)
    engine = _open_engine(args, path)
    if args.mtp_draft and not engine.has_mtp:
        raise InvalidArgumentError(f"--mtp-draft: {path} embeds no MTP block; pass the MTP GGUF as --mtp FILE")
    kv = from_args(args)
    trace = None
    if args.trace:
        try:
            trace = open(args.trace, "a", encoding="utf-8", errors="replace")
        except OSError as e:
            raise Ds4IOError(f"--trace {args.trace}: {e.strerror}") from None
    cfg = ServerConfig(host=args.host, port=args.port, ctx=args.ctx, default_tokens=args.tokens, cors=args.cors,
                       tool_memory_max_ids=args.tool_memory_max_ids,
                       exact_dsml_replay=not args.disable_exact_dsml_tool_replay, trace=trace,
                       api_key=args.api_key or None, mtp_draft=args.mtp_draft, mtp_margin=args.mtp_margin)
    try:
        return serve(engine, cfg, kv)
    except OSError as e:
        raise Ds4IOError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    finally:
        if trace is not None:
            trace.close()
