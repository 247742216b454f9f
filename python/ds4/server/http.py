"""HTTP front end: a threading server whose client threads parse requests and queue them.

As upstream (RUNTIME.md §9.1-9.4): one request per connection, ``Connection: close`` on every
response; the client thread reads and parses the body, renders and tokenizes the prompt, checks the
context, queues the job and waits while the worker writes the response. Built on the standard
library's ``http.server`` (no dependency needed: requests are small and one generation runs at a
time, so an async server would buy nothing).
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import shapes
from .protocol import DEFAULT_MAX_TOKENS, RequestError, parse_anthropic, parse_chat, parse_completion
from .responses import parse_responses
from .worker import Job, Sink, ToolMemory, Worker

__all__ = ["ServerConfig", "Server"]

log = logging.getLogger("ds4.server")

MAX_BODY = 64 * 1024 * 1024
IO_TIMEOUT = 10.0  # seconds for reading a request
SEND_STALL_TIMEOUT = 2.0  # once queued, a client that stalls a write this long is dropped

_PARSERS = {
    "/v1/chat/completions": parse_chat,
    "/v1/completions": parse_completion,
    "/v1/messages": parse_anthropic,
    "/v1/responses": parse_responses,
}


@dataclass
class ServerConfig:
    """Server options (upstream ds4-server flags, RUNTIME.md §9.8)."""

    host: str = "127.0.0.1"
    port: int = 8000
    ctx: int = 32768
    default_tokens: int = DEFAULT_MAX_TOKENS
    cors: bool = False
    tool_memory_max_ids: int = 100000
    exact_dsml_replay: bool = True
    trace: Any = None  # a text stream: human-readable trace of every request (prompt, output, cache)
    mtp_draft: int = 0  # speculative decoding: MTP drafts per step (0: off; docs/speculative.md)


class _Handler(BaseHTTPRequestHandler):
    server: "_HTTPServer"
    protocol_version = "HTTP/1.1"
    timeout = IO_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:  # route through logging, not stderr
        log.debug("ds4-server: %s %s", self.address_string(), format % args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # Malformed request lines/headers: upstream answers 400 "bad HTTP request" in its JSON shape.
        self.close_connection = True
        try:
            self._sink().error(400 if code < 500 else code, "bad HTTP request")
        except OSError:
            pass

    def _sink(self) -> Sink:
        return Sink(self.wfile.write, self.server.ds4.config.cors)

    def _unknown(self) -> None:
        self.close_connection = True
        self._sink().error(404, "unknown endpoint")

    do_PUT = do_DELETE = do_PATCH = do_HEAD = _unknown

    def do_OPTIONS(self) -> None:
        self.close_connection = True
        self._sink().response(204, b"", None)

    def do_GET(self) -> None:
        self.close_connection = True
        srv = self.server.ds4
        path = self.path.split("?", 1)[0]
        sink = self._sink()
        cfg = srv.config
        model = shapes.model_object(cfg.ctx, cfg.default_tokens)
        if path == "/v1/models":
            sink.response(200, (shapes.dumps({"object": "list", "data": [model]}) + "\n").encode())
        elif path == "/v1/models/deepseek-v4-flash":
            sink.response(200, (shapes.dumps(model) + "\n").encode())
        elif path == "/health":
            body = {"status": "stopping" if srv.worker.stopping else "ok", "ctx": cfg.ctx}
            sink.response(200, (shapes.dumps(body) + "\n").encode())
        else:
            sink.error(404, "unknown endpoint")

    def do_POST(self) -> None:
        self.close_connection = True
        srv = self.server.ds4
        sink = self._sink()
        path = self.path.split("?", 1)[0]
        parser = _PARSERS.get(path)
        if parser is None:
            sink.error(404, "unknown endpoint")
            return
        length = self.headers.get("Content-Length")
        try:
            n = int(length) if length is not None else 0
        except ValueError:
            n = -1
        if n < 0 or n > MAX_BODY or "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            sink.error(400, "bad HTTP request")
            return
        try:
            body = self.rfile.read(n) if n else b""
        except OSError:
            return
        if len(body) != n:
            sink.error(400, "bad HTTP request")
            return
        ctx = srv.config.ctx
        try:
            req = parser(body, srv.tokenizer, ctx, srv.config.default_tokens, **srv.parse_kwargs())
        except RequestError as e:
            sink.error(e.status, e.message)
            return
        except Exception as e:  # a parser bug must not kill the connection thread silently
            log.exception("ds4-server: request parsing failed")
            sink.error(400, f"invalid request: {e}")
            return
        if len(req.prompt) >= ctx:
            sink.response(400, shapes.context_error_body(req.api, req.context_param, len(req.prompt), ctx))
            return
        try:
            self.connection.settimeout(SEND_STALL_TIMEOUT)
        except OSError:
            pass
        job = Job(req, sink)
        if not srv.worker.submit(job):
            sink.error(503, "server shutting down")
            return
        job.done.wait()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr, handler, ds4: "Server") -> None:
        self.ds4 = ds4
        super().__init__(addr, handler)


class Server:
    """The ds4 HTTP server over one engine. ``start()`` binds and serves in background threads;
    ``stop()`` stops accepting, drains the queue and saves a shutdown checkpoint (disk cache)."""

    def __init__(self, engine, config: ServerConfig | None = None, kv_cache=None) -> None:
        self.engine = engine
        self.config = config or ServerConfig()
        if self.config.ctx < 2:
            raise ValueError(f"ctx must be at least 2, got {self.config.ctx}")
        self.tokenizer = engine.tokenizer
        max_ids = self.config.tool_memory_max_ids if self.config.exact_dsml_replay else 0
        fallback = None
        if kv_cache is not None and max_ids > 0:
            fallback = kv_cache.tool_maps  # ids missing from memory may be in a cache file's KTM
        self.worker = Worker(engine, self.config.ctx, self.config.default_tokens, kv_cache,
                             ToolMemory(max_ids, fallback), trace=self.config.trace)
        self.worker.mtp_draft = self.config.mtp_draft
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False

    def parse_kwargs(self) -> dict:
        return {"tool_memory": self.worker.tools, "live": self.worker.live}

    @property
    def address(self) -> tuple[str, int]:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    def start(self) -> "Server":
        host = "127.0.0.1" if self.config.host == "localhost" else self.config.host
        try:
            socket.inet_aton(host)
        except OSError:
            raise ValueError(f"--host {self.config.host!r}: expected an IPv4 address") from None
        self._httpd = _HTTPServer((host, self.config.port), _Handler, self)
        self.worker.start()
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="ds4-http", daemon=True,
                                        kwargs={"poll_interval": 0.2})
        self._thread.start()
        log.info("ds4-server: listening on %s (ctx=%d)", self.url, self.config.ctx)
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._httpd is not None:
            self._httpd.shutdown()
        self.worker.stop(timeout)
        self.worker.shutdown_store()
        if self._httpd is not None:
            self._httpd.server_close()

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
