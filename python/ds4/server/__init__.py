"""``ds4.server``: an OpenAI / Anthropic compatible HTTP server (port of upstream's ds4-server).

:func:`create_app` builds the ASGI application (Starlette); :class:`Server` serves it with uvicorn
in a background thread; :func:`serve` runs that until a signal (``ds4 serve``). One worker thread
owns the engine and a single live session; requests are queued and run one at a time, and a
conversation that extends the previous request only evaluates its new tokens (docs/server.md).
Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/messages``
(Anthropic) and ``/v1/messages/count_tokens``, ``POST /v1/responses`` (OpenAI Responses),
``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``, ``GET /metrics``; streaming
responses are server-sent events.

Example::

    >>> import ds4, ds4.testing, ds4.server                     # doctest: +SKIP
    >>> eng = ds4.Engine(ds4.testing.default_model_path())      # doctest: +SKIP
    >>> with ds4.server.Server(eng, ds4.server.ServerConfig(port=0, ctx=1024)) as srv:  # doctest: +SKIP
    ...     print(srv.url)                                       # e.g. http://127.0.0.1:40123
"""

from __future__ import annotations

from .app import ServerConfig, create_app
from .runner import Server
from .protocol import MODEL_ID, Request, RequestError, parse_anthropic, parse_chat, parse_completion
from .responses import parse_responses
from .worker import Job, JobResult, LiveBindings, Sink, ToolMemory, Worker

__all__ = [
    "Server",
    "ServerConfig",
    "create_app",
    "MODEL_ID",
    "Request",
    "RequestError",
    "parse_chat",
    "parse_completion",
    "parse_anthropic",
    "parse_responses",
    "Worker",
    "LiveBindings",
    "Job",
    "JobResult",
    "Sink",
    "ToolMemory",
    "serve",
]


def serve(engine, config: ServerConfig | None = None, kv_cache=None) -> int:
    """Run a server until SIGINT/SIGTERM: stop accepting, finish queued jobs, save a shutdown
    checkpoint (with a disk cache), return 0. A second signal exits at once with status 130."""
    import logging
    import os
    import signal
    import threading

    srv = Server(engine, config, kv_cache).start()
    stop = threading.Event()

    def on_signal(signum, frame):  # noqa: ARG001
        if stop.is_set():
            os._exit(130)
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
        logging.getLogger("ds4.server").info("ds4-server: stopping (finishing queued requests)")
        srv.stop()
        logging.getLogger("ds4.server").info("ds4-server: stopped")
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 0
