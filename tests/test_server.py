"""End-to-end tests of ``ds4.server`` on the bundled tiny model, over loopback HTTP.

The server runs in-process on 127.0.0.1 with an ephemeral port; every request has a timeout. The
tiny model's text is noise, so expected outputs come from ``ds4.generation`` run directly on a
fresh session (greedy, so both must pick the same tokens) and expected token counts from the
tokenizer and the chat renderer.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request

import pytest

import ds4
import ds4.testing
from ds4.chat import parse_generated, render, render_completion
from ds4.generation import generate
from ds4.server import Server, ServerConfig

CTX = 512
TIMEOUT = 30  # seconds per request: the tiny model answers in milliseconds; this only bounds a hang


@pytest.fixture(scope="module")
def engine():
    return ds4.Engine(ds4.testing.default_model_path(), threads=1)


@pytest.fixture(scope="module")
def server(engine):
    srv = Server(engine, ServerConfig(port=0, ctx=CTX, default_tokens=16)).start()
    yield srv
    srv.stop()


def _request(url, body=None, method=None, raw: bytes | None = None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as f:
            return f.status, f.headers, f.read()  # headers: case-insensitive lookups
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def post(srv, path, body=None, raw=None):
    status, headers, data = _request(srv.url + path, body, raw=raw)
    return status, headers, data


def post_json(srv, path, body):
    status, _, data = post(srv, path, body)
    return status, json.loads(data)


def sse_events(data: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) pairs of an SSE body; comments are skipped."""
    out = []
    for block in data.decode().split("\n\n"):
        if not block.strip():
            continue
        name, payload = None, None
        for line in block.split("\n"):
            if line.startswith(":"):
                continue
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                payload = line[len("data: "):]
        if payload is not None:
            out.append((name, payload))
    return out


def _chat(content="Hello", **kw):
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0, "thinking": False}
    body.update(kw)
    return body


def _direct(engine, messages, think="none", max_tokens=8, **kw):
    return generate(engine, messages=messages, think=think, temperature=0, max_tokens=max_tokens, ctx=CTX,
                    stream=False, **kw)


def _parsed(fin):
    """The message the server returns for a non-thinking chat turn: its final parser splits at a
    sampled ``</think>`` even when thinking is off (upstream behaviour, docs/runtime.md §8.2)."""
    return parse_generated(fin.content, thinking=False)


# ---- models, health, routing -------------------------------------------------------------------


def test_models(server):
    status, headers, data = _request(server.url + "/v1/models")
    assert status == 200
    assert "Access-Control-Allow-Origin" not in headers  # CORS only with --cors
    obj = json.loads(data)
    assert obj["object"] == "list" and len(obj["data"]) == 1
    m = obj["data"][0]
    assert m["id"] == "deepseek-v4-flash" and m["object"] == "model" and m["created"] == 1767225600
    assert m["context_length"] == CTX and m["top_provider"]["max_completion_tokens"] == 16
    status, _, data = _request(server.url + "/v1/models/deepseek-v4-flash")
    assert status == 200 and json.loads(data) == m
    status, _, data = _request(server.url + "/health")
    assert status == 200 and json.loads(data)["status"] == "ok"


def test_unknown_endpoint_and_options(server):
    status, _, data = _request(server.url + "/v1/nope")
    assert status == 404
    assert json.loads(data) == {"error": {"message": "unknown endpoint", "type": "invalid_request_error",
                                          "param": None, "code": None}}
    status, _, data = post(server, "/v1/embeddings", {"input": "x"})
    assert status == 404
    # a wrong method is 405 in the API's error shape (OPTIONS only answers with --cors)
    status, _, data = _request(server.url + "/v1/chat/completions", method="OPTIONS")
    assert status == 405 and "OPTIONS" in json.loads(data)["error"]["message"]
    status, _, data = _request(server.url + "/v1/models", method="DELETE")
    assert status == 405 and json.loads(data)["error"]["type"] == "invalid_request_error"
    status, headers, data = _request(server.url + "/v1/models", method="HEAD")
    assert status == 200 and data == b"" and int(headers["Content-Length"]) > 0


# ---- chat completions --------------------------------------------------------------------------


def test_chat_greedy_matches_direct_generation(server, engine):
    status, obj = post_json(server, "/v1/chat/completions", _chat())
    assert status == 200
    assert obj["object"] == "chat.completion" and obj["id"].startswith("chatcmpl-")
    assert obj["model"] == "deepseek-v4-flash"
    choice = obj["choices"][0]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "length"
    msgs = [{"role": "user", "content": "Hello"}]
    direct = _parsed(_direct(engine, msgs))
    assert choice["message"]["content"] == direct.content
    assert choice["message"].get("reasoning_content") == direct.reasoning
    u = obj["usage"]
    n_prompt = len(render(msgs, think="none", tokenizer=engine.tokenizer).tokens)
    assert u["prompt_tokens"] == n_prompt and u["completion_tokens"] == 8 and u["total_tokens"] == n_prompt + 8
    d = u["prompt_tokens_details"]
    assert d["cached_tokens"] + d["cache_write_tokens"] == n_prompt
    # determinism: the same request again gives the same text
    status, again = post_json(server, "/v1/chat/completions", _chat())
    assert again["choices"][0]["message"]["content"] == choice["message"]["content"]
    assert again["id"] != obj["id"]


def test_chat_model_echo_and_alias(server):
    status, obj = post_json(server, "/v1/chat/completions", {**_chat(), "model": "my-model"})
    assert status == 200 and obj["model"] == "my-model"
    # deepseek-chat disables thinking unless asked: no reasoning_content at temperature 0
    body = _chat()
    del body["thinking"]
    body["model"] = "deepseek-chat"
    status, obj = post_json(server, "/v1/chat/completions", body)
    assert status == 200 and "reasoning_content" not in obj["choices"][0]["message"]


def test_chat_stream_events(server):
    status, obj = post_json(server, "/v1/chat/completions", _chat())
    status, headers, data = post(server, "/v1/chat/completions",
                                 _chat(stream=True, stream_options={"include_usage": True}))
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(data)
    assert all(name is None for name, _ in events)
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(p) for _, p in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    usage = chunks[-1]
    assert usage["choices"] == []
    assert usage["usage"]["prompt_tokens"] == obj["usage"]["prompt_tokens"]
    assert usage["usage"]["completion_tokens"] == 8 and usage["usage"]["total_tokens"] == obj["usage"]["total_tokens"]
    final = chunks[-2]["choices"][0]
    assert final["delta"] == {} and final["finish_reason"] == "length"
    body = chunks[1:-2]
    assert all(c["choices"][0]["finish_reason"] is None for c in body)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in body)
    assert text == obj["choices"][0]["message"]["content"]
    assert not any("reasoning_content" in c["choices"][0]["delta"] for c in body)


def test_chat_stream_without_usage_has_no_usage_chunk(server):
    _, _, data = post(server, "/v1/chat/completions", _chat(stream=True))
    chunks = [json.loads(p) for _, p in sse_events(data)[:-1]]
    assert all("usage" not in c for c in chunks)


def test_thinking_stream_equals_nonstream_with_seed(server, engine):
    body = {"messages": [{"role": "user", "content": "Why?"}], "max_tokens": 12, "seed": 7}
    status, obj = post_json(server, "/v1/chat/completions", body)
    assert status == 200
    msg = obj["choices"][0]["message"]
    _, _, data = post(server, "/v1/chat/completions", {**body, "stream": True})
    chunks = [json.loads(p) for _, p in sse_events(data)[:-1]]
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks)
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    # thinking mode: before </think> the text streams as reasoning; a turn that never closes its
    # think block is returned as content by the final parser (upstream quirk, docs/runtime.md §8.2)
    if "reasoning_content" in msg:
        assert reasoning == msg["reasoning_content"] and content == msg["content"]
    else:
        assert reasoning + content == msg["content"]
    # and the rendered prompt is a thinking prompt
    n_prompt = len(render(body["messages"], think="high", tokenizer=engine.tokenizer).tokens)
    assert obj["usage"]["prompt_tokens"] == n_prompt


def test_stop_string(server):
    status, base = post_json(server, "/v1/chat/completions", _chat(max_tokens=12))
    text = base["choices"][0]["message"]["content"]
    # an ASCII stop string taken from the middle of the greedy output
    cands = [text[i:i + 2] for i in range(2, len(text) - 2) if text[i:i + 2].isascii() and text[i:i + 2].isprintable()]
    assert cands, f"no ASCII pair in {text!r}"
    stop = cands[0]
    expected = text[: text.index(stop)]
    status, obj = post_json(server, "/v1/chat/completions", _chat(max_tokens=12, stop=[stop, "never-seen"]))
    assert status == 200
    assert obj["choices"][0]["finish_reason"] == "stop"
    assert obj["choices"][0]["message"]["content"] == expected
    _, _, data = post(server, "/v1/chat/completions", _chat(max_tokens=12, stop=stop, stream=True))
    chunks = [json.loads(p) for _, p in sse_events(data)[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_max_tokens_zero_and_length(server):
    status, obj = post_json(server, "/v1/chat/completions", _chat(max_tokens=0))
    assert status == 400  # as OpenAI: max_tokens must be >= 1
    assert obj["error"]["param"] == "max_tokens" and "got 0" in obj["error"]["message"]
    status, obj = post_json(server, "/v1/chat/completions", _chat(max_tokens=3))
    assert obj["choices"][0]["finish_reason"] == "length" and obj["usage"]["completion_tokens"] == 3
    # default budget is --tokens (16 here)
    body = _chat()
    del body["max_tokens"]
    status, obj = post_json(server, "/v1/chat/completions", body)
    assert obj["usage"]["completion_tokens"] <= 16


# ---- completions -------------------------------------------------------------------------------


def test_completions(server, engine):
    body = {"prompt": "Once upon", "max_tokens": 6, "temperature": 0, "think": False}
    status, obj = post_json(server, "/v1/completions", body)
    assert status == 200 and obj["object"] == "text_completion" and obj["id"].startswith("cmpl-")
    choice = obj["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    rendered = render_completion("Once upon", think="none", tokenizer=engine.tokenizer)
    assert obj["usage"]["prompt_tokens"] == len(rendered.tokens)
    direct = generate(engine, tokens=rendered.tokens, temperature=0, max_tokens=6, ctx=CTX, stream=False)
    assert choice["text"] == direct.text
    _, _, data = post(server, "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    events = sse_events(data)
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(p) for _, p in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    assert chunks[-2]["choices"][0] == {"text": "", "index": 0, "finish_reason": "length"}
    assert "".join(c["choices"][0]["text"] for c in chunks[:-2]) == choice["text"]
    # an array holding one prompt, and the same prompt as token ids, give the same text
    status, obj2 = post_json(server, "/v1/completions", {**body, "prompt": ["Once upon"]})
    assert obj2["choices"][0]["text"] == choice["text"]
    ids = engine.tokenizer.encode("Once upon")
    status, obj3 = post_json(server, "/v1/completions", {**body, "prompt": ids})
    assert status == 200 and obj3["usage"]["prompt_tokens"] == len(rendered.tokens)
    assert obj3["choices"][0]["text"] == choice["text"]
    status, err = post_json(server, "/v1/completions", {**body, "prompt": ["a", "b"]})
    assert status == 400 and err["error"]["param"] == "prompt"


# ---- Anthropic messages ------------------------------------------------------------------------


def test_anthropic_messages(server, engine):
    body = {"model": "claude-x", "max_tokens": 6, "temperature": 0, "thinking": {"type": "disabled"},
            "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "x-anthropic-billing"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
    status, obj = post_json(server, "/v1/messages", body)
    assert status == 200
    assert obj["type"] == "message" and obj["role"] == "assistant" and obj["model"] == "claude-x"
    assert obj["stop_reason"] == "max_tokens" and obj["stop_sequence"] is None
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    direct = _direct(engine, msgs, max_tokens=6)
    assert parse_generated(direct.content, False).reasoning is None  # so the stream equals the message
    assert obj["content"] == [{"type": "text", "text": direct.content}]
    n_prompt = len(render(msgs, think="none", tokenizer=engine.tokenizer).tokens)
    u = obj["usage"]
    assert u["output_tokens"] == 6 and u["cache_creation_input_tokens"] == 0
    assert u["cache_read_input_tokens"] + u["input_tokens"] == n_prompt

    _, _, data = post(server, "/v1/messages", {**body, "stream": True})
    events = sse_events(data)
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    start = json.loads(events[0][1])["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    deltas = [json.loads(p) for n, p in events if n == "content_block_delta"]
    assert "".join(d["delta"]["text"] for d in deltas) == direct.content
    assert all(d["index"] == 0 for d in deltas)
    md = json.loads(events[-2][1])
    assert md["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None} and md["usage"] == {"output_tokens": 6}


def test_anthropic_thinking_stream_blocks(server):
    body = {"max_tokens": 5, "seed": 3, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    _, _, data = post(server, "/v1/messages", body)
    events = sse_events(data)
    starts = [json.loads(p) for n, p in events if n == "content_block_start"]
    stops = [json.loads(p) for n, p in events if n == "content_block_stop"]
    assert [s["index"] for s in starts] == [s["index"] for s in stops] == list(range(len(starts)))
    assert starts and starts[0]["content_block"]["type"] == "thinking"
    sig = [json.loads(p) for n, p in events if n == "content_block_delta" and '"signature_delta"' in p]
    assert sig and sig[0]["delta"]["signature"] == json.loads(events[0][1])["message"]["id"]


def test_anthropic_tool_result_without_call_is_refused(server):
    body = {"max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "42"}]}]}
    status, obj = post_json(server, "/v1/messages", body)
    assert status == 400 and "toolu_x" in obj["error"]["message"]


# ---- errors ------------------------------------------------------------------------------------


def test_context_overflow(server, engine):
    long_text = "x " * 600
    msgs = [{"role": "user", "content": long_text}]
    n = len(render(msgs, think="none", tokenizer=engine.tokenizer).tokens)
    assert n >= CTX
    status, obj = post_json(server, "/v1/chat/completions", {"messages": msgs, "thinking": False})
    assert status == 400
    assert obj == {"error": {"message": f"Prompt has {n} tokens, but the configured context size is {CTX} tokens",
                             "type": "invalid_request_error", "param": "messages",
                             "code": "context_length_exceeded", "n_prompt_tokens": n, "n_ctx": CTX}}
    status, obj = post_json(server, "/v1/completions", {"prompt": long_text})
    assert status == 400 and obj["error"]["param"] == "prompt" and obj["error"]["n_ctx"] == CTX
    status, obj = post_json(server, "/v1/messages", {"messages": msgs, "max_tokens": 4})
    assert status == 400 and obj["type"] == "error"
    assert obj["error"]["type"] == "invalid_request_error" and obj["error"]["n_ctx"] == CTX
    # the server still works afterwards
    assert post_json(server, "/v1/chat/completions", _chat(max_tokens=1))[0] == 200


@pytest.mark.parametrize("raw, message, param", [
    (b"{not json", "invalid JSON request", None),
    (b"[1, 2]", "invalid JSON request", None),
    (b"", "invalid JSON request", None),
    (b'{"messages": "hi"}', "messages: expected an array, got a string", "messages"),
    (b'{"messages": [], "temperature": 1}', "messages: must contain at least one message", "messages"),
    (b'{"messages": [{"role": "robot", "content": "x"}]}',
     "messages[0].role: expected one of system, developer, user, assistant, tool, function, got 'robot'",
     "messages[0].role"),
    (b'{"messages": [], "temperature": "hot"}', "temperature: expected a number, got a string", "temperature"),
    (b'{"messages": [], "temperature": 2.5}', "temperature: must be in [0, 2], got 2.5", "temperature"),
    (b'{"messages": [], "top_p": 0}', "top_p: must be in (0, 1], got 0", "top_p"),
    (b'{"messages": [], "max_tokens": -1}', "max_tokens: must be an integer >= 1, got -1", "max_tokens"),
    (b'{"messages": [], "reasoning_effort": "extreme"}',
     "reasoning_effort: expected one of max, xhigh, high, medium, low, minimal, none, got 'extreme'",
     "reasoning_effort"),
    (b'{"messages": [], "stream": 1}', "stream: expected a boolean, got a number", "stream"),
    (b'{"messages": [], "n": 2}', "n: only n=1 is supported, got 2", "n"),
    (b'{"messages": [], "presence_penalty": 2.5}', "presence_penalty: must be in [-2, 2], got 2.5",
     "presence_penalty"),
    (b'{"messages": [], "logit_bias": {"x": 3}}', "logit_bias: keys are token ids, got 'x'", "logit_bias"),
    (b'{"messages": [], "logit_bias": {"5": 300}}', "logit_bias: the bias of token 5 must be in [-100, 100], got 300",
     "logit_bias"),
    (b'{"messages": [], "logit_bias": {"99999999": 3}}',
     "logit_bias: token id 99999999 is outside the vocabulary (0..511)", "logit_bias"),
    (b'{"messages": [], "response_format": {"type": "json_object"}}',
     "response_format: only {\"type\": \"text\"} is supported, got 'json_object'", "response_format"),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}',
     "messages[0].content[0]: image_url content is not supported (text only)", "messages[0].content[0]"),
    (b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": ""}}]}',
     "tools[0].function.name: expected a tool name of 1-128 letters, digits, '_', '-', '.', ':', got ''",
     "tools[0].function.name"),
    (b'{"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}',
     "tool_choice: forces a tool call but no tools are given", "tool_choice"),
    (b'{"model": "x"}', "missing messages", None),
    (b'\xff\xfe', "invalid JSON request", None),
    (b'{"messages": [], "temperature": NaN}', "invalid JSON request", None),
    (b'{"messages": [' * 300 + b']' * 300 + b'}', "invalid JSON request", None),
])
def test_malformed_requests(server, raw, message, param):
    raw = raw.replace(b'{"messages": [],', b'{"messages": [{"role": "user", "content": "x"}],') \
        if b"at least one" not in message.encode() else raw
    status, _, data = post(server, "/v1/chat/completions", raw=raw)
    assert status == 400
    assert json.loads(data) == {"error": {"message": message, "type": "invalid_request_error", "param": param,
                                          "code": None}}


def test_missing_prompt(server):
    status, obj = post_json(server, "/v1/completions", {"max_tokens": 2})
    assert status == 400 and obj["error"]["message"] == "missing prompt"


def test_bad_http_request(server):
    host, port = server.address
    with socket.create_connection((host, port), timeout=TIMEOUT) as s:
        s.sendall(b"GARBAGE\r\n\r\n")
        data = s.recv(65536)
    assert data.startswith(b"HTTP/1.1 400 ")
    assert post_json(server, "/v1/chat/completions", _chat(max_tokens=1))[0] == 200


# ---- concurrency and live session --------------------------------------------------------------


def test_concurrent_requests_are_serialised(server, engine):
    msgs = [[{"role": "user", "content": c}] for c in ("Alpha", "Beta beta", "Gamma")]
    fins = [_direct(engine, m, max_tokens=10) for m in msgs]
    # non-streamed answers are parsed (a sampled </think> splits them); the stream is raw text
    expected = [f.content if i == 1 else _parsed(f).content for i, f in enumerate(fins)]
    results: list = [None] * len(msgs)

    def worker(i):
        body = {"messages": msgs[i], "max_tokens": 10, "temperature": 0, "thinking": False, "stream": i == 1}
        status, _, data = post(server, "/v1/chat/completions", body)
        if body["stream"]:
            chunks = [json.loads(p) for _, p in sse_events(data)[:-1]]
            results[i] = (status, "".join(c["choices"][0]["delta"].get("content", "") for c in chunks))
        else:
            results[i] = (status, json.loads(data)["choices"][0]["message"]["content"])

    started_before = server.worker.jobs_started
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(msgs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT * 2)
    assert all(not t.is_alive() for t in threads)
    # each answer equals its own solo greedy run: one shared session, so interleaving would show
    assert results == [(200, e) for e in expected]
    assert server.worker.jobs_started == started_before + len(msgs)


def _clean_greedy_prompt(engine, n_tokens):
    """A user message whose greedy continuation decodes as valid UTF-8 (the tiny model's noise
    often does not, and a client can only replay what it could decode)."""
    for i in range(40):
        msgs = [{"role": "user", "content": f"Tell me {i}"}]
        fin = _direct(engine, msgs, max_tokens=n_tokens)
        try:
            engine.tokenizer.decode_bytes(fin.tokens).decode("utf-8")
        except UnicodeDecodeError:
            continue
        if engine.tokenizer.eos not in fin.tokens and len(fin.tokens) == n_tokens:
            return msgs, fin
    pytest.fail("no prompt with a clean greedy continuation among 40 candidates")


def test_live_session_reuse(server, engine):
    msgs, fin = _clean_greedy_prompt(engine, 4)
    status, first = post_json(server, "/v1/chat/completions",
                              {"messages": msgs, "max_tokens": 4, "temperature": 0, "thinking": False})
    assert status == 200
    p1 = first["usage"]["prompt_tokens"]
    content = first["choices"][0]["message"]["content"]
    assert content == fin.content
    follow = msgs + [{"role": "assistant", "content": content}, {"role": "user", "content": "And more?"}]
    status, second = post_json(server, "/v1/chat/completions",
                               {"messages": follow, "max_tokens": 4, "temperature": 0, "thinking": False})
    assert status == 200
    u = second["usage"]
    # the live session held prompt 1 + its 4 generated tokens: only the rest was evaluated
    assert u["prompt_tokens_details"]["cached_tokens"] == p1 + 4
    assert u["prompt_tokens_details"]["cache_write_tokens"] == u["prompt_tokens"] - (p1 + 4)
    assert server.worker.last_result.source in ("memory-token", "memory-text")
    n_full = len(render(follow, think="none", tokenizer=engine.tokenizer).tokens)
    if server.worker.last_result.source == "memory-token":
        # same tokens as a cold prompt: the continuation must equal a fresh greedy run
        assert u["prompt_tokens"] == n_full
        assert second["choices"][0]["message"]["content"] == _direct(engine, follow, max_tokens=4).content
    # a request that does not extend the live conversation starts cold
    status, third = post_json(server, "/v1/chat/completions", _chat(content="Unrelated", max_tokens=1))
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_shutdown_refuses_new_jobs(engine):
    srv = Server(engine, ServerConfig(port=0, ctx=CTX, default_tokens=4)).start()
    url = srv.url
    assert post_json(srv, "/v1/chat/completions", _chat(max_tokens=2))[0] == 200
    srv.worker.stop(5)  # the worker stops first; the listener still answers
    status, obj = post_json(srv, "/v1/chat/completions", _chat(max_tokens=2))
    assert status == 503 and obj["error"]["message"] == "server shutting down"
    srv.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/v1/models", timeout=5)


def _prefill_only(srv, body) -> int:
    """Leave the server's live session holding exactly the body's prompt (what a request that
    generates nothing would leave; the API needs max_tokens >= 1, so the worker is driven directly
    while it is idle)."""
    from ds4.server import parse_chat

    req = parse_chat(json.dumps(body), srv.tokenizer, CTX, tool_memory=srv.worker.tools)
    srv.worker.session.sync(req.prompt)
    return len(req.prompt)


def test_disk_kv_cache_shutdown_and_reload(engine, tmp_path):
    from ds4.kvcache import KVCache

    def cache():
        return KVCache(tmp_path, min_tokens=8, cold_max_tokens=0, continued_interval=0, fsync=False)

    msgs = [{"role": "user", "content": "A fairly long question about the weather in spring " * 2}]
    body = {"messages": msgs, "max_tokens": 1, "temperature": 0, "thinking": False}
    with Server(engine, ServerConfig(port=0, ctx=CTX), cache()) as srv:
        n_prompt = _prefill_only(srv, body)  # live state = the prompt
        assert not list(tmp_path.glob("*.kv"))
    files = list(tmp_path.glob("*.kv"))
    assert len(files) == 1  # the shutdown checkpoint
    with Server(engine, ServerConfig(port=0, ctx=CTX), cache()) as srv:
        status, second = post_json(srv, "/v1/chat/completions", {**body, "max_tokens": 3})
        assert status == 200
        assert srv.worker.last_result.source == "disk-text"
        assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": n_prompt, "cache_write_tokens": 0}
        # restored state decodes exactly as a cold prefill would
        assert second["choices"][0]["message"]["content"] == _direct(engine, msgs, max_tokens=3).content


def test_disk_cache_keeps_exact_tool_replay_across_restarts(engine, tmp_path):
    from ds4.kvcache import KVCache

    def cache():
        return KVCache(tmp_path, min_tokens=8, cold_max_tokens=0, continued_interval=0, fsync=False)

    # a sampled block in a non-canonical layout, as a model may write it
    block = "\n\n<｜DSML｜tool_calls><｜DSML｜invoke name=\"get\"></｜DSML｜invoke></｜DSML｜tool_calls>"
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_kept", "type": "function", "function": {"name": "get", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_kept", "content": "sunny"}]
    body = {"messages": msgs, "max_tokens": 1, "thinking": False}
    with Server(engine, ServerConfig(port=0, ctx=CTX), cache()) as srv:
        srv.worker.tools.remember(["call_kept"], block)
        _prefill_only(srv, body)
    (kv_file,) = tmp_path.glob("*.kv")
    assert block.encode() in kv_file.read_bytes()  # in the key text and the KTM trailer
    with Server(engine, ServerConfig(port=0, ctx=CTX), cache()) as srv:
        assert len(srv.worker.tools) == 0
        status, obj = post_json(srv, "/v1/chat/completions", {**body, "max_tokens": 1})
        assert status == 200
        # the id was found in the file's tool map, so the prompt rendered the exact block and the
        # whole prompt came from the disk checkpoint
        assert srv.worker.tools.lookup(["call_kept"]) == block
        assert srv.worker.last_result.source == "disk-text"
        assert obj["usage"]["prompt_tokens_details"]["cache_write_tokens"] == 0


def test_stream_sends_headers_and_keepalives_during_prefill(monkeypatch):
    import ds4.server.worker as worker_mod

    monkeypatch.setattr(worker_mod, "KEEPALIVE_SECONDS", 0.0)  # a comment after every prefill chunk
    eng = ds4.Engine(ds4.testing.default_model_path(), threads=1, prefill_chunk=16)
    with Server(eng, ServerConfig(port=0, ctx=CTX)) as srv:
        body = _chat(content="word " * 60, max_tokens=2, stream=True)
        status, _, data = post(srv, "/v1/chat/completions", body)
    assert status == 200
    text = data.decode()
    assert text.startswith(": prefill\n\n")  # keep-alive comments come before the first event
    assert text.count(": prefill\n\n") >= 2
    events = sse_events(data)
    assert json.loads(events[0][1])["choices"][0]["delta"] == {"role": "assistant"}
    assert events[-1][1] == "[DONE]"


def test_responses_endpoint(server, engine):
    body = {"input": "Hello", "max_output_tokens": 6, "temperature": 0, "reasoning": {"effort": "none"}}
    status, _, data = post(server, "/v1/responses", body)
    assert status == 200
    obj = json.loads(data)
    assert obj["object"] == "response" and obj["status"] == "incomplete"
    assert obj["incomplete_details"] == {"reason": "max_output_tokens"}
    direct = _parsed(_direct(engine, [{"role": "user", "content": "Hello"}], max_tokens=6))
    texts = [o["content"][0]["text"] for o in obj["output"] if o["type"] == "message"]
    assert texts == ([direct.content] if direct.content else [])
    assert obj["usage"]["output_tokens"] == 6 and obj["usage"]["total_tokens"] == obj["usage"]["input_tokens"] + 6
    status, _, data = post(server, "/v1/responses", {"input": "x " * 600})
    err = json.loads(data)["error"]
    assert status == 400 and err["param"] == "input" and err["code"] == "context_length_exceeded"
