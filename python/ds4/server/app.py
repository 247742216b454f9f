"""``create_app(engine, config)``: the server as an ASGI application (Starlette).

The app can be served by any ASGI server (``ds4 serve`` uses uvicorn, see :mod:`ds4.server.runner`),
mounted inside a larger Starlette / FastAPI app, or driven by Starlette's ``TestClient``. The HTTP
stack gives keep-alive, chunked request bodies, HEAD and 405; this module adds the API surface:

* request coroutines read the body (413 past ``max_body``), parse and tokenize it in a thread
  (:func:`starlette.concurrency.run_in_threadpool`), and queue a job for the single model worker
  (:class:`ds4.server.worker.Worker`); the event loop itself never runs the model or the tokenizer;
* the worker writes the response into a :class:`QueueSink`, which hands it to the coroutine over
  ``loop.call_soon_threadsafe``; a client that disconnects marks the sink failed, and the worker
  stops that job at the next token (or prefill chunk), or skips it if it is still queued;
* errors take the shape of the API the client speaks: Anthropic's for ``/v1/messages*`` and for
  any request carrying an ``anthropic-version`` header, OpenAI's otherwise;
* ``--api-key`` (``Authorization: Bearer`` or ``x-api-key``; ``/health`` stays open), CORS with an
  explicit header list (browsers do not let ``*`` cover ``Authorization``), ``/health`` and
  ``/metrics`` (Prometheus text).

Example (an app inside a test, no network)::

    >>> from starlette.testclient import TestClient                      # doctest: +SKIP
    >>> app = ds4.server.create_app(eng, ds4.server.ServerConfig(ctx=1024))  # doctest: +SKIP
    >>> with TestClient(app) as c:                                          # doctest: +SKIP
    ...     c.get("/health").json()
    {'status': 'ok', 'ctx': 1024, 'queue_depth': 0}
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request as HTTPRequest
from starlette.responses import Response
from starlette.routing import Route

from ..speculative import DEFAULT_MARGIN, check_margin
from . import shapes
from .metrics import Metrics
from .protocol import (
    DEFAULT_MAX_TOKENS,
    MODEL_ID,
    PromptTooLong,
    RequestError,
    parse_anthropic,
    parse_chat,
    parse_completion,
)
from .responses import parse_responses
from .sinks import QueueSink
from .tool_state import ToolMemory
from .worker import Job, Worker

__all__ = ["ServerConfig", "create_app", "QueueSink", "Service"]

log = logging.getLogger("ds4.server")

MAX_BODY = 64 * 1024 * 1024

# Headers a browser may send cross-origin: what the official SDKs set (their x-stainless-*
# telemetry, Anthropic's version / beta / direct-browser-access), auth and content type.
CORS_HEADERS = [
    "Authorization", "Content-Type", "Accept", "x-api-key", "anthropic-version", "anthropic-beta",
    "anthropic-dangerous-direct-browser-access", "OpenAI-Organization", "OpenAI-Project", "OpenAI-Beta",
    "Idempotency-Key", "x-stainless-arch", "x-stainless-async", "x-stainless-helper-method", "x-stainless-lang",
    "x-stainless-os", "x-stainless-package-version", "x-stainless-poll-helper", "x-stainless-retry-count",
    "x-stainless-runtime", "x-stainless-runtime-version", "x-stainless-timeout", "x-stainless-read-timeout",
]


@dataclass
class ServerConfig:
    """Server options (upstream ds4-server flags, docs/runtime.md §9.8, plus the ASGI app's own)."""

    host: str = "127.0.0.1"
    port: int = 8000
    ctx: int = 32768
    default_tokens: int = DEFAULT_MAX_TOKENS
    cors: bool = False
    tool_memory_max_ids: int = 100000
    exact_dsml_replay: bool = True
    trace: Any = None  # a text stream: human-readable trace of every request (prompt, output, cache)
    api_key: str | None = None  # required as Bearer token or x-api-key on every endpoint but /health
    max_body: int = MAX_BODY  # bytes; a larger request body is answered 413
    mtp_draft: int = 0  # speculative decoding: MTP drafts per step (0: off; docs/speculative.md)
    mtp_margin: float = DEFAULT_MARGIN  # draft only while the MTP's top-1 minus top-2 logit is at least this (0: off)


class Service:
    """What the routes share: the engine's tokenizer, the worker, the configuration, the metrics."""

    def __init__(self, engine, config: ServerConfig, kv_cache=None) -> None:
        if config.ctx < 2:
            raise ValueError(f"ctx must be at least 2, got {config.ctx}")
        self.engine = engine
        self.config = config
        self.tokenizer = engine.tokenizer
        self.metrics = Metrics()
        max_ids = config.tool_memory_max_ids if config.exact_dsml_replay else 0
        fallback = kv_cache.tool_maps if kv_cache is not None and max_ids > 0 else None
        self.worker = Worker(engine, config.ctx, config.default_tokens, kv_cache, ToolMemory(max_ids, fallback),
                             trace=config.trace, metrics=self.metrics)
        self.worker.mtp_draft = config.mtp_draft
        self.worker.mtp_margin = check_margin(config.mtp_margin)
        self._started = self._stopped = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self.worker.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop the worker (queued jobs finish, the running one ends) and save the shutdown
        checkpoint (disk cache)."""
        if self._stopped or not self._started:
            return
        self._stopped = True
        self.worker.stop(timeout)
        self.worker.shutdown_store()

    def parse_kwargs(self) -> dict:
        return {"tool_memory": self.worker.tools, "live": self.worker.live}


# ---- helpers ----------------------------------------------------------------------------------------


def _route_path(scope) -> str:
    """The path inside this app (without the prefix it is mounted under)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def _api_of(scope_path: str, headers) -> str:
    if scope_path.startswith("/v1/messages") or "anthropic-version" in headers:
        return "anthropic"
    return "openai"


def _json(status: int, body: bytes) -> Response:
    return Response(body, status_code=status, media_type="application/json")


def _error(api: str, status: int, message: str, param: str | None = None, code: str | None = None) -> Response:
    return _json(status, shapes.error_body(message, api, status, param, code))


async def _read_body(request: HTTPRequest, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"request body is larger than {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():  # chunked bodies arrive here already de-chunked
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"request body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class _JobResponse:
    """Streams what the worker writes into the job's sink; a client disconnect cancels the job."""

    def __init__(self, job: Job, sink: QueueSink) -> None:
        self.job, self.sink = job, sink

    async def __call__(self, scope, receive, send) -> None:
        sink = self.sink

        async def watch() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    sink.cancel()
                    return

        watcher = asyncio.ensure_future(watch())
        delivered = False  # the whole response went out: a later disconnect cancels nothing
        try:
            item = await sink.get()
            if item[0] == "full":
                _, status, body, ctype = item
                headers = [(b"content-length", str(len(body)).encode())]
                if ctype:
                    headers.append((b"content-type", ctype.encode()))
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                delivered = True
            elif item[0] == "sse":
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                        (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})
                while True:
                    item = await sink.get()
                    if item[0] != "data":
                        break
                    await send({"type": "http.response.body", "body": item[1], "more_body": True})
                await send({"type": "http.response.body", "body": b""})
                delivered = True
            else:  # the job ended without a response: its client is gone (cancelled while queued)
                body = shapes.error_body("request cancelled", sink.api, 499)
                await send({"type": "http.response.start", "status": 499,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
        except (OSError, asyncio.CancelledError, ClientDisconnect):
            sink.cancel()
            raise
        finally:
            watcher.cancel()
            if not delivered:
                sink.cancel()


# ---- routes -------------------------------------------------------------------------------------------

_PARSERS = {
    "/v1/chat/completions": parse_chat,
    "/v1/completions": parse_completion,
    "/v1/messages": parse_anthropic,
    "/v1/responses": parse_responses,
}


async def _parse(request: HTTPRequest, parser) -> Any:
    """(Request, None) or (None, error Response)."""
    svc: Service = request.app.state.ds4
    api = _api_of(_route_path(request.scope), request.headers)
    body = await _read_body(request, svc.config.max_body)
    cfg = svc.config
    try:
        req = await run_in_threadpool(parser, body, svc.tokenizer, cfg.ctx, cfg.default_tokens, **svc.parse_kwargs())
    except PromptTooLong as e:
        return None, _json(400, shapes.context_error_body(api if api == "anthropic" else "openai", e.param,
                                                          e.n_tokens, cfg.ctx, at_least=e.at_least))
    except RequestError as e:
        return None, _error(api, e.status, e.message, e.param, e.code)
    except Exception as e:  # a parser bug must answer, not drop the connection
        log.exception("ds4-server: request parsing failed")
        return None, _error(api, 400, f"invalid request: {e}")
    if len(req.prompt) >= cfg.ctx:
        return None, _json(400, shapes.context_error_body(req.api, req.context_param, len(req.prompt), cfg.ctx))
    return req, None


async def generate(request: HTTPRequest):
    svc: Service = request.app.state.ds4
    req, err = await _parse(request, _PARSERS[_route_path(request.scope)])
    if err is not None:
        return err
    sink = QueueSink(asyncio.get_running_loop(), req.api)
    job = Job(req, sink)
    if not svc.worker.submit(job):
        return _error(req.api, 503, "server shutting down")
    return _JobResponse(job, sink)


async def count_tokens(request: HTTPRequest):
    """Anthropic ``POST /v1/messages/count_tokens``: the rendered prompt's token count."""
    req, err = await _parse(request, parse_anthropic)
    if err is not None:
        return err
    return _json(200, (shapes.dumps({"input_tokens": len(req.prompt)}) + "\n").encode())


def _models(request: HTTPRequest, one: bool):
    svc: Service = request.app.state.ds4
    cfg = svc.config
    if _api_of(_route_path(request.scope), request.headers) == "anthropic":
        model = {"type": "model", "id": MODEL_ID, "display_name": "DeepSeek V4 Flash",
                 "created_at": "2026-01-01T00:00:00Z"}
        obj = model if one else {"data": [model], "has_more": False, "first_id": model["id"], "last_id": model["id"]}
    else:
        model = shapes.model_object(cfg.ctx, cfg.default_tokens)
        obj = model if one else {"object": "list", "data": [model]}
    return _json(200, (shapes.dumps(obj) + "\n").encode())


async def models(request: HTTPRequest):
    return _models(request, False)


async def model(request: HTTPRequest):
    if request.path_params["model_id"] not in (MODEL_ID, "deepseek-chat", "deepseek-reasoner"):
        return _error(_api_of(_route_path(request.scope), request.headers), 404,
                      f"The model '{request.path_params['model_id']}' does not exist", "model", "model_not_found")
    return _models(request, True)


async def health(request: HTTPRequest):
    svc: Service = request.app.state.ds4
    body = {"status": "stopping" if svc.worker.stopping else "ok", "ctx": svc.config.ctx,
            "queue_depth": svc.worker.queue_depth}
    return _json(200, (shapes.dumps(body) + "\n").encode())


async def metrics(request: HTTPRequest):
    svc: Service = request.app.state.ds4
    w = svc.worker
    text = svc.metrics.render(w.queue_depth, w.running, w.session.pos)
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


# ---- middleware and error handlers ----------------------------------------------------------------------


class _CountRequests:
    """Counts every HTTP request by path and status for ``/metrics`` (unknown paths as ``other``)."""

    def __init__(self, app, metrics: Metrics, paths: set[str]) -> None:
        self.app, self.metrics, self.paths = app, metrics, paths

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = [500]

        async def wrapped(msg):
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, wrapped)
        finally:
            path = _route_path(scope)
            path = path if path in self.paths else "other"
            self.metrics.request(path, status[0])


class _RequireKey:
    """``--api-key``: every request but ``/health`` and CORS preflights must carry the key as
    ``Authorization: Bearer KEY`` or ``x-api-key: KEY`` (401 in the API's shape otherwise)."""

    def __init__(self, app, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or _route_path(scope) == "/health" or scope["method"] == "OPTIONS":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        given = headers.get(b"x-api-key")
        auth = headers.get(b"authorization", b"")
        if given is None and auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        if given is not None and secrets.compare_digest(given, self.key):
            return await self.app(scope, receive, send)
        api = _api_of(_route_path(scope), {k.decode("latin-1").lower(): v for k, v in headers.items()})
        msg = "missing API key" if given is None else "invalid API key"
        await _error(api, 401, msg)(scope, receive, send)


async def _http_error(request: HTTPRequest, exc: HTTPException):
    api = _api_of(_route_path(request.scope), request.headers)
    msg = {404: "unknown endpoint", 405: f"method {request.method} not allowed for {request.url.path}"}.get(
        exc.status_code, exc.detail)
    resp = _error(api, exc.status_code, msg)
    if exc.headers:
        resp.headers.update(exc.headers)
    return resp


def create_app(engine, config: ServerConfig | None = None, kv_cache=None) -> Starlette:
    """An ASGI app serving ``engine``. The model worker starts now; ``app.state.ds4.stop()`` (run
    by the app's lifespan shutdown) stops it and saves the disk cache's shutdown checkpoint."""
    config = config or ServerConfig()
    svc = Service(engine, config, kv_cache)
    routes = [Route(p, generate, methods=["POST"]) for p in _PARSERS]
    routes += [
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    middleware = []
    if config.cors:
        middleware.append(Middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["GET", "POST", "OPTIONS"],
                                     allow_headers=CORS_HEADERS, expose_headers=["x-request-id"], max_age=600))
    if config.api_key:
        middleware.append(Middleware(_RequireKey, key=config.api_key))
    paths = {r.path for r in routes if "{" not in r.path}
    middleware.insert(0, Middleware(_CountRequests, metrics=svc.metrics, paths=paths))

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        yield
        await run_in_threadpool(svc.stop)

    app = Starlette(routes=routes, middleware=middleware, exception_handlers={HTTPException: _http_error},
                    lifespan=lifespan)
    app.state.ds4 = svc
    svc.start()
    return app
