"""``Server``: the ASGI app of :func:`ds4.server.create_app` served by uvicorn in a background thread.

``start()`` binds the socket itself (so a busy port fails there, with an ``OSError``, and port 0
resolves to the real port before the first request), then runs uvicorn's loop in a thread.
``stop()`` stops accepting, lets in-flight requests finish (the worker drains its queue), stops the
worker and saves the disk cache's shutdown checkpoint.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

from .app import ServerConfig, create_app

__all__ = ["Server"]

log = logging.getLogger("ds4.server")

KEEP_ALIVE_SECONDS = 30  # idle keep-alive connections are closed after this long


class Server:
    """The ds4 HTTP server over one engine (usable as a context manager)."""

    def __init__(self, engine, config: ServerConfig | None = None, kv_cache=None) -> None:
        self.config = config or ServerConfig()
        self.app = create_app(engine, self.config, kv_cache)
        self.service = self.app.state.ds4
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self._uv: Any = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._stopped = False

    @property
    def worker(self):
        return self.service.worker

    @property
    def address(self) -> tuple[str, int]:
        assert self._sock is not None, "start() first"
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    def start(self) -> "Server":
        import uvicorn

        host = "127.0.0.1" if self.config.host == "localhost" else self.config.host
        try:
            socket.inet_aton(host)
        except OSError:
            raise ValueError(f"--host {self.config.host!r}: expected an IPv4 address") from None
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, self.config.port))
        except OSError:
            sock.close()
            raise
        sock.listen(128)
        sock.set_inheritable(True)
        self._sock = sock
        cfg = uvicorn.Config(self.app, log_level="warning", lifespan="off", timeout_keep_alive=KEEP_ALIVE_SECONDS,
                             timeout_graceful_shutdown=30, access_log=False, server_header=False,
                             limit_concurrency=None, h11_max_incomplete_event_size=64 * 1024)
        self._uv = uvicorn.Server(cfg)
        self._uv.install_signal_handlers = lambda: None  # signals belong to the caller (ds4 serve)
        self._thread = threading.Thread(target=self._uv.run, kwargs={"sockets": [sock]}, name="ds4-http",
                                         daemon=True)
        self._thread.start()
        t0 = time.monotonic()
        while not self._uv.started:
            if not self._thread.is_alive():
                raise OSError(f"the HTTP server on {host}:{self.config.port} did not start")
            if time.monotonic() - t0 > 30:
                raise OSError("the HTTP server did not start within 30 s")
            time.sleep(0.01)
        log.info("ds4-server: listening on %s (ctx=%d)", self.url, self.config.ctx)
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._uv is not None:
            self._uv.should_exit = True  # stop accepting; in-flight requests finish first
        self.service.stop(timeout)  # queued jobs finish, the running one ends
        if self._thread is not None:
            self._thread.join(timeout)
        if self._sock is not None:
            self._sock.close()

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
