"""The server's HTTP stack: the ASGI app in-process (Starlette's TestClient, mounted in another app)
and over loopback with raw sockets for the abuse cases (malformed / oversized / chunked bodies,
keep-alive, slow and vanishing clients, concurrent clients), each followed by a normal request
that must succeed. Also ``--api-key``, CORS, ``/health`` and ``/metrics``.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

import ds4
import ds4.testing
from ds4.server import Server, ServerConfig, create_app

CTX = 512
TIMEOUT = 30  # seconds: bounds a hang; the tiny model answers in milliseconds


@pytest.fixture(scope="module")
def engine():
    return ds4.Engine(ds4.testing.default_model_path(), threads=1)


@pytest.fixture(scope="module")
def server(engine):
    srv = Server(engine, ServerConfig(port=0, ctx=CTX, default_tokens=8, max_body=64 * 1024)).start()
    yield srv
    srv.stop()


def _chat(content="Hello", **kw):
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0, "thinking": False}
    body.update(kw)
    return body


def _post(srv, path, body, headers=None, conn=None):
    own = conn is None
    conn = conn or http.client.HTTPConnection(*srv.address, timeout=TIMEOUT)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, r.headers, r.read()
    finally:
        if own:
            conn.close()


def _ok(srv):
    """The normal request every abuse case must be followed by."""
    status, _, data = _post(srv, "/v1/chat/completions", _chat(max_tokens=1))
    assert status == 200, data
    assert json.loads(data)["usage"]["completion_tokens"] == 1


def _wait(pred, what, timeout=TIMEOUT):
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.01)


# ---- the app in-process ------------------------------------------------------------------------


def test_app_with_testclient_and_mounted(engine):
    app = create_app(engine, ServerConfig(ctx=CTX, default_tokens=4))
    with TestClient(app) as c:
        assert c.get("/health").json() == {"status": "ok", "ctx": CTX, "queue_depth": 0}
        r = c.post("/v1/chat/completions", json=_chat(max_tokens=2))
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    # lifespan shutdown stopped the worker
    assert app.state.ds4.worker.stopping
    # mounted under a prefix inside a user's app: routes, error shapes and metrics paths still hold
    inner = create_app(engine, ServerConfig(ctx=CTX, default_tokens=4))
    outer = Starlette(routes=[Mount("/llm", app=inner)])
    with TestClient(outer) as c:
        r = c.post("/llm/v1/messages", json={"max_tokens": 2, "messages": []})
        assert r.status_code == 400 and r.json()["type"] == "error"  # Anthropic's shape under the prefix
        assert r.json()["error"] == {"type": "invalid_request_error",
                                     "message": "messages: must contain at least one message"}
        assert c.post("/llm/v1/messages", json={"max_tokens": 2, "messages": [
            {"role": "user", "content": "hi"}]}).json()["usage"]["output_tokens"] == 2
        assert 'ds4_requests_total{path="/v1/messages",status="400"} 1' in c.get("/llm/metrics").text
    inner.state.ds4.stop()


def test_metrics_prometheus_text(server):
    done = server.worker.jobs_done
    _ok(server)
    _post(server, "/v1/chat/completions", {"messages": []})
    _wait(lambda: server.worker.jobs_done > done, "the job to be booked")
    conn = http.client.HTTPConnection(*server.address, timeout=TIMEOUT)
    conn.request("GET", "/metrics")
    r = conn.getresponse()
    text = r.read().decode()
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert line.startswith(("# HELP ds4_", "# TYPE ds4_"))
            continue
        name, value = line.rsplit(" ", 1)
        samples[name] = float(value)
    assert samples['ds4_requests_total{path="/v1/chat/completions",status="200"}'] >= 1
    assert samples['ds4_requests_total{path="/v1/chat/completions",status="400"}'] >= 1
    assert samples["ds4_completion_tokens_total"] >= 1 and samples["ds4_prompt_tokens_total"] >= 1
    assert samples["ds4_decode_tokens_per_second"] > 0 and samples["ds4_prefill_tokens_per_second"] > 0
    assert samples["ds4_queue_depth"] == 0
    for key in ("ds4_live_session_hits_total", "ds4_disk_cache_hits_total", "ds4_cancelled_total"):
        assert key in samples


def test_metrics_count_live_session_hits(engine):
    with Server(engine, ServerConfig(port=0, ctx=CTX)) as srv:
        body = _chat("A question", max_tokens=2)
        m = srv.service.metrics
        assert _post(srv, "/v1/chat/completions", body)[0] == 200
        # the response goes out before the worker books the job: wait for the booking
        _wait(lambda: srv.worker.jobs_done == 1, "the first job to be booked")
        assert m.sources == {"none": 1}
    # the booking of cache sources into the hit counters
    from ds4.server.metrics import JobStats, Metrics

    m = Metrics()
    for source in ("none", "memory-token", "memory-text", "thinking-visible", "disk-text"):
        m.job(JobStats(prompt=10, cached=4, completion=5, prefill_s=0.5, decode_s=0.25, source=source))
    text = m.render(2, 1, 30)
    assert "ds4_live_session_hits_total 3\n" in text and "ds4_disk_cache_hits_total 1\n" in text
    assert "ds4_prefill_tokens_total 30\n" in text and "ds4_cached_tokens_total 20\n" in text
    assert "ds4_prefill_tokens_per_second 12\n" in text and "ds4_decode_tokens_per_second 20\n" in text
    assert "ds4_queue_depth 2\n" in text and "ds4_live_session_tokens 30\n" in text


# ---- HTTP/1.1 behaviour --------------------------------------------------------------------------


def test_keep_alive_and_chunked_request_body(server):
    conn = http.client.HTTPConnection(*server.address, timeout=TIMEOUT)
    for _ in range(3):  # three requests on one connection
        status, headers, data = _post(server, "/v1/chat/completions", _chat(max_tokens=1), conn=conn)
        assert status == 200 and headers.get("Connection", "").lower() != "close"
    body = json.dumps(_chat(max_tokens=1)).encode()
    chunks = [body[i:i + 7] for i in range(0, len(body), 7)]
    conn.request("POST", "/v1/chat/completions", iter(chunks), {"Content-Type": "application/json"},
                 encode_chunked=True)
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read())["usage"]["completion_tokens"] == 1
    conn.close()


def test_oversized_body_is_413(server):
    big = {"messages": [{"role": "user", "content": "x" * (70 * 1024)}]}
    status, _, data = _post(server, "/v1/chat/completions", big)
    assert status == 413 and "larger than" in json.loads(data)["error"]["message"]
    status, _, data = _post(server, "/v1/messages", big)
    assert status == 413 and json.loads(data)["error"]["type"] == "request_too_large"
    # without Content-Length (chunked) the limit holds as the body arrives
    conn = http.client.HTTPConnection(*server.address, timeout=TIMEOUT)
    conn.request("POST", "/v1/chat/completions", iter([b"x" * 16384] * 8), encode_chunked=True)
    assert conn.getresponse().status == 413
    conn.close()
    _ok(server)


@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{\"a\":",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
])
def test_malformed_http_then_normal_request(server, raw):
    with socket.create_connection(server.address, timeout=TIMEOUT) as s:
        s.sendall(raw)
        s.settimeout(2)
        try:
            data = s.recv(65536)
        except socket.timeout:
            data = b""  # an incomplete request is waited for; the client gives up
    assert data == b"" or data.startswith(b"HTTP/1.1 4")
    _ok(server)


def test_slow_and_vanishing_clients_do_not_block_others(server):
    body = json.dumps(_chat(max_tokens=1)).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    slow = socket.create_connection(server.address, timeout=TIMEOUT)
    slow.sendall(head + body[:10])  # the rest arrives later
    gone = socket.create_connection(server.address, timeout=TIMEOUT)
    gone.sendall(head + body[:5])
    gone.close()  # vanishes mid-body
    _ok(server)  # others are served while the slow client dawdles
    slow.sendall(body[10:])
    slow.settimeout(TIMEOUT)
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        chunk = slow.recv(65536)
        if not chunk:
            break
        data += chunk
    slow.close()
    assert data.startswith(b"HTTP/1.1 200")
    _ok(server)


def test_concurrent_clients(server):
    results = []

    def one(i):
        results.append(_post(server, "/v1/chat/completions", _chat(f"Q{i}", max_tokens=2, stream=i % 2 == 0))[0])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert results == [200] * 8
    _ok(server)


# ---- cancellation ---------------------------------------------------------------------------------


class _SlowSession:
    """The worker's session with a pause per evaluated token, so a generation lasts long enough
    for a client to leave in the middle of it."""

    def __init__(self, s, delay):
        self._s, self.delay = s, delay

    def eval(self, token):
        time.sleep(self.delay)
        self._s.eval(token)

    def __getattr__(self, name):
        return getattr(self._s, name)


def _raw_request(srv, body):
    data = json.dumps(body).encode()
    s = socket.create_connection(srv.address, timeout=TIMEOUT)
    s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(data)}\r\n\r\n").encode() + data)
    return s


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_stops_generation(engine, stream):
    with Server(engine, ServerConfig(port=0, ctx=CTX)) as srv:
        w = srv.worker
        w.session = _SlowSession(w.session, 0.02)  # 400 tokens would take 8 s
        done = w.jobs_done
        s = _raw_request(srv, _chat(max_tokens=400, stream=stream))
        if stream:
            assert s.recv(65536).startswith(b"HTTP/1.1 200")  # generation is under way
        else:
            time.sleep(0.3)
        t0 = time.monotonic()
        s.close()
        _wait(lambda: w.jobs_done > done, "the job to end")
        assert time.monotonic() - t0 < 3  # stopped at the next token, not after 400
        r = w.last_result
        assert r.error == "client disconnected" and r.completion < 100
        assert srv.service.metrics.cancelled == 1
        w.session = w.session._s
        _ok(srv)


def test_abandoned_queued_job_is_skipped(engine):
    with Server(engine, ServerConfig(port=0, ctx=CTX)) as srv:
        w = srv.worker
        w.session = _SlowSession(w.session, 0.02)
        first = _raw_request(srv, _chat("first", max_tokens=40))  # holds the worker for ~1 s
        _wait(lambda: w.running, "the first job to start")
        second = _raw_request(srv, _chat("second", max_tokens=40))
        _wait(lambda: w.queue_depth == 1, "the second job to queue")
        second.close()  # an SDK retry gave up on it
        time.sleep(0.2)
        started = w.jobs_started
        first.settimeout(TIMEOUT)
        assert first.recv(65536).startswith(b"HTTP/1.1 200")
        first.close()
        _wait(lambda: w.jobs_done == started + 1, "the queue to drain")
        assert w.last_result.error == "client disconnected before the job started"
        assert w.last_result.completion == 0 and srv.service.metrics.cancelled == 1
        w.session = w.session._s
        _ok(srv)


# ---- API key and CORS -----------------------------------------------------------------------------


def test_api_key(engine):
    with Server(engine, ServerConfig(port=0, ctx=CTX, api_key="s3cret")) as srv:
        status, _, data = _post(srv, "/v1/chat/completions", _chat(max_tokens=1))
        assert status == 401
        assert json.loads(data)["error"] == {"message": "missing API key", "type": "invalid_request_error",
                                             "param": None, "code": "invalid_api_key"}
        status, _, data = _post(srv, "/v1/messages", {"max_tokens": 1, "messages": []}, {"x-api-key": "wrong"})
        assert status == 401 and json.loads(data) == {"type": "error", "error": {
            "type": "authentication_error", "message": "invalid API key"}}
        assert _post(srv, "/v1/chat/completions", _chat(max_tokens=1), {"Authorization": "Bearer s3cret"})[0] == 200
        assert _post(srv, "/v1/chat/completions", _chat(max_tokens=1), {"x-api-key": "s3cret"})[0] == 200
        conn = http.client.HTTPConnection(*srv.address, timeout=TIMEOUT)
        conn.request("GET", "/health")  # open: load balancers probe it without a key
        assert conn.getresponse().status == 200
        conn.close()


def test_cors_preflight_allows_auth_headers(engine):
    with Server(engine, ServerConfig(port=0, ctx=CTX, cors=True, api_key="k")) as srv:
        conn = http.client.HTTPConnection(*srv.address, timeout=TIMEOUT)
        conn.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": "http://example.com", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-api-key, anthropic-version, "
                                              "x-stainless-os"})
        r = conn.getresponse()
        r.read()
        assert r.status == 200
        allowed = {h.strip().lower() for h in r.headers["Access-Control-Allow-Headers"].split(",")}
        assert {"authorization", "content-type", "x-api-key", "anthropic-version", "x-stainless-os"} <= allowed
        assert "*" not in allowed  # browsers do not let * cover Authorization
        assert r.headers["Access-Control-Allow-Origin"] == "*"
        # actual requests carry the origin header, errors included (a browser must be able to read a 401)
        for headers, want in (({}, 401), ({"Authorization": "Bearer k"}, 200)):
            status, h, _ = _post(srv, "/v1/chat/completions", _chat(max_tokens=1), {"Origin": "http://e.x", **headers},
                                 conn=conn)
            assert status == want and h["Access-Control-Allow-Origin"] == "*"
        conn.close()
    with Server(engine, ServerConfig(port=0, ctx=CTX)) as srv:  # without --cors: no CORS headers
        status, h, _ = _post(srv, "/v1/chat/completions", _chat(max_tokens=1), {"Origin": "http://e.x"})
        assert status == 200 and "Access-Control-Allow-Origin" not in h


# ---- prompts beyond the context ---------------------------------------------------------------------


def test_huge_prompt_refused_before_full_tokenization(engine, monkeypatch):
    from ds4.server import protocol

    seen = []
    tok = engine.tokenizer
    real = type(tok).encode_rendered

    def spy(self, text):
        seen.append(len(text))
        return real(self, text)

    monkeypatch.setattr(type(tok), "encode_rendered", spy)
    with Server(engine, ServerConfig(port=0, ctx=CTX, max_body=8 << 20)) as srv:
        text = "word " * 1_000_000  # 5 MB
        status, _, data = _post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": text}]})
        err = json.loads(data)["error"]
        assert status == 400 and err["code"] == "context_length_exceeded"
        assert err["message"].startswith("Prompt has at least ") and err["n_prompt_tokens"] >= CTX
        # only a prefix of about ctx * 16 characters was tokenized, not the 5 MB
        assert max(seen) <= CTX * protocol._CHARS_PER_TOKEN_BOUND
        seen.clear()
        # a prompt just over the context is still counted exactly
        status, _, data = _post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 600}]})
        assert status == 400 and not json.loads(data)["error"]["message"].startswith("Prompt has at least")
