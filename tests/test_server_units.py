"""Unit tests of the server's pieces that need no model: byte scanners, request parsing, response
shapes, SSE projections, and the worker driven by a scripted fake engine (tool calls, stop strings,
thinking-visible continuation), so the expected outputs are known exactly."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ds4.chat import ToolCall, render
from ds4.decoding import StopMatcher, ToolBlockWatch
from ds4.server import Job, RequestError, Sink, ToolMemory, Worker, parse_anthropic, parse_chat, parse_completion
from ds4.server.streams import AnthropicStream, OpenAIChatStream
from ds4.server.textscan import (
    ThinkingTracker,
    text_safe_limit,
    utf8_safe_len,
)
from ds4.server import shapes
from server_fakes import ScriptEngine, script_tokenizer

TC = "<｜DSML｜tool_calls>"
TC_END = "</｜DSML｜tool_calls>"


@pytest.fixture(scope="module")
def tok():
    return script_tokenizer()


# ---- textscan ----------------------------------------------------------------------------------


@given(st.text(max_size=40), st.data())
def test_utf8_safe_len_never_splits_a_character(s, data):
    raw = s.encode()
    limit = data.draw(st.integers(0, len(raw)))
    cut = utf8_safe_len(raw, 0, limit)
    assert cut <= limit
    raw[:cut].decode("utf-8")  # a whole number of characters
    assert limit - cut < 4  # only an incomplete trailing character is held back
    if limit == len(raw):
        assert cut == limit  # a complete text is released whole
    assert utf8_safe_len(raw, 0, limit, final=True) == limit


def test_stop_matcher_on_bytes():
    # the server matches stops on the raw bytes (the same matcher generate uses on text)
    m = StopMatcher([b"ab", b"c"])
    assert m.push(b"xxa") == (b"xx", None)  # "a" may begin "ab": held back
    assert m.push(b"cab") == (b"a", b"c")  # earliest hit wins
    assert m.released == 3  # the stop starts at byte 3
    m = StopMatcher([])
    assert m.push(b"abc") == (b"abc", None) and m.released == 3


def test_tool_block_watch_and_text_limit():
    raw = ("Hello \n\n" + TC).encode()
    w = ToolBlockWatch(0)
    assert not w.closed(raw.decode()) and w.opened
    assert w.closed((raw + ("x" + TC_END).encode()).decode())
    orphan = ToolBlockWatch(0)
    assert not orphan.closed("a </tool_calls>") and not orphan.opened  # an end without a start
    # whitespace before a tool marker is never content
    assert text_safe_limit(raw, 0, len(raw), True, False) == len(b"Hello")
    # with tools a trailing '<' (maybe a marker) and trailing whitespace are held back
    assert text_safe_limit(b"ab <to", 0, 6, True, False) == 2
    assert text_safe_limit(b"ab  ", 0, 4, True, False) == 2
    assert text_safe_limit(b"ab  ", 0, 4, True, True) == 4
    assert text_safe_limit(b"ab <to", 0, 6, False, False) == 6


def test_thinking_tracker():
    t = ThinkingTracker("<｜User｜>x<｜Assistant｜><think>")
    assert t.inside
    for piece in (b"reason </thi", b"nk>answer"):
        t.feed(piece)
    assert not t.inside
    t.feed(b"<thi")
    t.feed(b"nk>")
    assert t.inside
    assert not ThinkingTracker("<｜Assistant｜></think>").inside


# ---- request parsing ---------------------------------------------------------------------------


def test_parse_chat_defaults_and_knobs(tok):
    body = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": [{"text": "a"}, "b"]}],
            "temperature": 0.5, "top_k": 40, "top_p": 0.9, "min_p": 0.1, "seed": 9, "stop": ["", "END"],
            "max_completion_tokens": 7, "stream": True, "stream_options": {"include_usage": True}}
    r = parse_chat(json.dumps(body), tok, 4096)
    assert (r.temperature, r.top_k, r.top_p, r.min_p, r.seed) == (0.5, 40, 0.9, 0.1, 9)
    assert r.stops == [b"END"] and r.max_tokens == 7 and r.stream and r.include_usage
    assert r.think == "high" and r.api == "openai" and r.kind == "chat" and not r.has_tools
    assert r.prompt_text == render([{"role": "system", "content": "S"}, {"role": "user", "content": "ab"}],
                                   think="high").text
    assert r.prompt == tok.encode_rendered(r.prompt_text)
    d = parse_chat(json.dumps({"messages": [{"role": "user", "content": "q"}]}), tok, 4096, default_tokens=5)
    assert (d.temperature, d.top_p, d.min_p, d.top_k, d.seed, d.max_tokens, d.model) == \
        (1.0, 1.0, 0.05, 0, 0, 5, "deepseek-v4-flash")


@pytest.mark.parametrize("extra, think", [
    ({}, "high"),
    ({"thinking": False}, "none"),
    ({"thinking": {"type": "disabled"}}, "none"),
    ({"thinking": None}, "high"),
    ({"think": False}, "none"),
    ({"reasoning_effort": "none"}, "none"),
    ({"reasoning_effort": "low"}, "high"),
    ({"reasoning_effort": "max"}, "high"),  # max needs ctx >= 393216
    ({"model": "deepseek-chat"}, "none"),
    ({"model": "deepseek-chat", "thinking": True}, "high"),
    ({"model": "deepseek-reasoner", "reasoning_effort": "none"}, "none"),
])
def test_thinking_controls(tok, extra, think):
    assert parse_chat(json.dumps({"messages": [{"role": "user", "content": "q"}], **extra}), tok, 4096).think == think


def test_think_max_with_large_context(tok):
    assert parse_chat(json.dumps({"messages": [{"role": "user", "content": "q"}], "reasoning_effort": "max"}), tok, 393216).think == "max"


def test_tools_are_rendered_byte_exact(tok):
    raw_fn = '{ "name" : "get",\n  "parameters": {"type":"object"} }'
    body = '{"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "function", "function": ' + raw_fn + \
           '}, {"type": "function", "function": {"name": "bare"}}]}'
    r = parse_chat(body, tok, 4096)
    assert r.has_tools
    assert (raw_fn + '\n{"name": "bare"}') in r.prompt_text
    # a tool that is not a function object is refused by name, as OpenAI does
    with pytest.raises(RequestError) as e:
        parse_chat(body.replace('{"type": "function", "function": {"name": "bare"}}', '{"name": "bare"}'), tok, 4096)
    assert e.value.param == "tools[1]"
    off = parse_chat(body[:-1] + ', "tool_choice": "none"}', tok, 4096)
    assert not off.has_tools and "## Tools" not in off.prompt_text


def test_exact_dsml_replay_from_tool_memory(tok):
    mem = ToolMemory()
    block = '\n\n' + TC + '<｜DSML｜invoke name="f"></｜DSML｜invoke>' + TC_END  # not the canonical layout
    mem.remember(["call_a"], block)
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": "r"}]
    r = parse_chat(json.dumps({"messages": msgs}), tok, 4096, tool_memory=mem)
    assert block + "<｜end▁of▁sentence｜>" in r.prompt_text
    unknown = json.loads(json.dumps(msgs))
    unknown[1]["tool_calls"][0]["id"] = "call_b"
    r2 = parse_chat(json.dumps({"messages": unknown}), tok, 4096, tool_memory=mem)
    assert block not in r2.prompt_text and TC in r2.prompt_text  # canonical rendering instead


def test_parse_completion_and_errors(tok):
    r = parse_completion('{"prompt": "hi", "think": false}', tok, 4096)
    assert r.kind == "completion" and r.prompt_text.endswith("hi<｜Assistant｜></think>")
    assert "You are a helpful assistant<｜User｜>" in r.prompt_text
    for body, msg in [('{"prompt": "x", "max_tokens": "a"}', "max_tokens: expected an integer, got a string"),
                      ("{}", "missing prompt"),
                      ('{"prompt": "x", "stop": [1]}', "stop: expected a string or an array of strings")]:
        with pytest.raises(RequestError) as e:
            parse_completion(body, tok, 4096)
        assert e.value.status == 400 and e.value.message == msg


def test_parse_anthropic(tok):
    body = {"system": "Sys", "max_tokens": 9, "stop_sequences": ["Z"], "thinking": {"type": "enabled"},
            "messages": [
                {"content": [{"type": "text", "text": "q"}], "role": "user"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"},
                                                  {"type": "text", "text": "a"},
                                                  {"type": "tool_use", "id": "toolu_1", "name": "f",
                                                   "input": {"x": 1}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                              "content": "out </tool_result>"}]}]}
    r = parse_anthropic(json.dumps(body), tok, 4096)
    assert r.api == "anthropic" and r.max_tokens == 9 and r.stops == [b"Z"] and r.think == "high"
    assert r.prompt_text.startswith("<｜begin▁of▁sentence｜>Sys<｜User｜>q<｜Assistant｜><think>hm</think>a")
    assert "<tool_result>out &lt;/tool_result></tool_result>" in r.prompt_text
    assert r.prompt_text.endswith("<｜Assistant｜><think>")


# ---- shapes and streams ------------------------------------------------------------------------


def test_usage_shapes():
    u = shapes.Usage(prompt=10, cached=4, completion=3)
    assert shapes.openai_usage(u) == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
                                      "prompt_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 6}}
    # Anthropic: input + cache_read + cache_creation is the whole prompt; nothing is written under a
    # client cache_control breakpoint, so the uncached part is input_tokens
    assert shapes.anthropic_usage(u) == {"input_tokens": 6, "output_tokens": 3, "cache_read_input_tokens": 4,
                                         "cache_creation_input_tokens": 0}
    assert shapes.openai_usage(shapes.Usage(5, 9, 0))["prompt_tokens_details"] == {"cached_tokens": 5,
                                                                                   "cache_write_tokens": 0}


def test_anthropic_final_content_order():
    u = shapes.Usage(3, 0, 2)
    calls = (ToolCall("f", '{"a": 1}'),)
    obj = json.loads(shapes.anthropic_final("id1", "m", "", "why", calls, ["toolu_z"], "tool_calls", u))
    assert obj["content"] == [{"type": "thinking", "thinking": "why", "signature": "id1"},
                              {"type": "tool_use", "id": "toolu_z", "name": "f", "input": {"a": 1}}]
    assert obj["stop_reason"] == "tool_use"
    only_thinking = json.loads(shapes.anthropic_final("id1", "m", "", "why", (), [], "stop", u))
    assert only_thinking["content"][-1] == {"type": "text", "text": ""}
    assert json.loads(shapes.anthropic_final("i", "m", "", None, (), [], "length", u))["content"] == \
        [{"type": "text", "text": ""}]


def _collect():
    sent: list[bytes] = []
    return sent, (lambda b: sent.append(b) or True)


def _chunks(sent):
    out = []
    for part in b"".join(sent).decode().split("\n\n"):
        if part.startswith("data: ") and part != "data: [DONE]":
            out.append(json.loads(part[6:]))
    return out


RAW = ("<think>step one</think>Answer text.\n\n" + TC + '\n<｜DSML｜invoke name="get">\n'
       '<｜DSML｜parameter name="city" string="true">Paris &amp; more</｜DSML｜parameter>\n'
       '</｜DSML｜invoke>\n' + TC_END).encode()


@given(st.lists(st.integers(1, len(RAW)), max_size=12))
def test_openai_stream_projection_any_chunking(cuts):
    sent, send = _collect()
    s = OpenAIChatStream(send, "chatcmpl-1", "m", thinking=True, has_tools=True, new_id=lambda: "call_1")
    assert s.start()
    for c in sorted(cuts):
        assert s.update(RAW[:c])
    calls = (ToolCall("get", '{"city": "Paris & more"}'),)
    assert s.finish(RAW, calls, s.tool_ids or ["call_1"], "tool_calls", shapes.Usage(5, 0, 9), include_usage=False)
    chunks = _chunks(sent)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant"}
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "step one"
    assert "".join(d.get("content", "") for d in deltas) == "Answer text."
    tool = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert tool[0] == {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get", "arguments": ""}}
    assert all(t["index"] == 0 for t in tool)
    assert "".join(t["function"]["arguments"] for t in tool) == '{"city":"Paris & more"}'  # streamed live
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "tool_calls"}
    assert b"".join(sent).endswith(b"data: [DONE]\n\n")


def test_anthropic_stream_projection():
    sent, send = _collect()
    s = AnthropicStream(send, "chatcmpl-2", "m", thinking=True, has_tools=True, new_id=lambda: "toolu_1")
    s.start(shapes.Usage(4, 0, 0))
    for c in range(1, len(RAW) + 1, 7):
        s.update(RAW[:c])
    s.finish(RAW, (ToolCall("get", '{"city": "Paris & more"}'),), ["toolu_1"], "tool_calls", 9)
    events = []
    for part in b"".join(sent).decode().split("\n\n"):
        if part:
            name, data = part.split("\n", 1)
            events.append((name[len("event: "):], json.loads(data[len("data: "):])))
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    blocks = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
    assert blocks == ["thinking", "text", "tool_use"]
    thinking = "".join(d["delta"].get("thinking", "") for n, d in events if n == "content_block_delta")
    text = "".join(d["delta"].get("text", "") for n, d in events if n == "content_block_delta")
    assert thinking == "step one" and text == "Answer text."
    js = [d["delta"]["partial_json"] for n, d in events if d.get("delta", {}).get("type") == "input_json_delta"]
    assert "".join(js) == '{"city":"Paris & more"}'
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


# ---- worker with a scripted engine -------------------------------------------------------------


def _run_job(worker, req):
    sent, send = _collect()
    job = Job(req, Sink(send))
    worker.run_job(job)
    data = b"".join(sent)
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode(), body


def _chat_req(tok, worker, body):
    return parse_chat(json.dumps(body), tok, worker.ctx, tool_memory=worker.tools)


TOOLS = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}]


def test_tool_call_turn_and_exact_replay(tok):
    eng = ScriptEngine(tok, "I will look." + RAW.decode()[len("<think>step one</think>Answer text."):]
                       + "ignored after the block")
    w = Worker(eng, ctx=4096, default_tokens=200)
    msgs = [{"role": "user", "content": "Weather?"}]
    req = _chat_req(tok, w, {"messages": msgs, "tools": TOOLS, "thinking": False, "temperature": 0})
    head, body = _run_job(w, req)
    assert head.startswith("HTTP/1.1 200 OK")
    obj = json.loads(body)
    choice = obj["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "I will look."
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_") and len(call["id"]) == 5 + 32
    assert call["function"] == {"name": "get", "arguments": '{"city":"Paris & more"}'}
    # generation stopped at the closing tag: nothing after it was sampled
    generated = tok.decode_bytes(w.session.tokens[len(req.prompt):]).decode()
    assert generated.endswith(TC_END) and "ignored" not in generated

    # the next turn replays the call by id: the sampled DSML is rendered verbatim, so the live
    # session (prompt + generated tokens) is a prefix and only the new turn is evaluated
    follow = msgs + [{"role": "assistant", "content": "I will look.", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    eng.set("It is sunny.")
    req2 = _chat_req(tok, w, {"messages": follow, "tools": TOOLS, "thinking": False, "temperature": 0})
    live = len(w.session.tokens)
    before = w.session.evaluated
    head, body = _run_job(w, req2)
    obj2 = json.loads(body)
    assert obj2["choices"][0]["message"]["content"] == "It is sunny."
    assert obj2["choices"][0]["finish_reason"] == "stop"
    assert obj2["usage"]["prompt_tokens_details"]["cached_tokens"] == live
    assert w.session.evaluated - before == len(req2.prompt) - live + len(tok.encode_rendered("It is sunny."))


def test_unterminated_tool_call_is_an_error(tok):
    eng = ScriptEngine(tok, "x\n\n" + TC + '\n<｜DSML｜invoke name="get">')
    w = Worker(eng, ctx=4096, default_tokens=200)
    req = _chat_req(tok, w, {"messages": [{"role": "user", "content": "q"}], "tools": TOOLS, "thinking": False})
    _, body = _run_job(w, req)
    assert json.loads(body)["choices"][0]["finish_reason"] == "error"


def test_malformed_tool_block_is_returned_as_text(tok):
    text = "x\n\n" + TC + "garbage" + TC_END
    eng = ScriptEngine(tok, text)
    w = Worker(eng, ctx=4096, default_tokens=200)
    req = _chat_req(tok, w, {"messages": [{"role": "user", "content": "q"}], "tools": TOOLS, "thinking": False})
    _, body = _run_job(w, req)
    choice = json.loads(body)["choices"][0]
    assert choice["message"]["content"] == text and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"


def test_stop_string_resets_session_and_holds_back(tok):
    eng = ScriptEngine(tok, "alpha beta STOP gamma")
    w = Worker(eng, ctx=4096, default_tokens=200)
    req = _chat_req(tok, w, {"messages": [{"role": "user", "content": "q"}], "thinking": False, "stop": "STOP",
                             "stream": True})
    _, body = _run_job(w, req)
    chunks = _chunks([body])
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "alpha beta "
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert w.session.tokens == []  # the KV held tokens past the visible end


def test_thinking_visible_continuation(tok):
    eng = ScriptEngine(tok, "hidden plan</think>Visible answer")
    w = Worker(eng, ctx=4096, default_tokens=200)
    msgs = [{"role": "user", "content": "q"}]
    req = _chat_req(tok, w, {"messages": msgs})
    _, body = _run_job(w, req)
    msg = json.loads(body)["choices"][0]["message"]
    assert msg == {"role": "assistant", "content": "Visible answer", "reasoning_content": "hidden plan"}
    live = list(w.session.tokens)
    # the client replays the answer without its reasoning: the rendered prompt drops it, but the
    # live state (which has it) is kept and only the text after the visible transcript is new
    follow = msgs + [{"role": "assistant", "content": "Visible answer"}, {"role": "user", "content": "next"}]
    eng.set("more</think>ok")
    req2 = _chat_req(tok, w, {"messages": follow})
    assert not req2.prompt[: len(live)] == live
    _, body = _run_job(w, req2)
    obj = json.loads(body)
    assert obj["usage"]["prompt_tokens_details"]["cached_tokens"] == len(live)
    assert w.session.tokens[: len(live)] == live
    visible = req.prompt_text[: -len("<think>")] + "</think>Visible answer<｜end▁of▁sentence｜>"
    assert req2.prompt_text.startswith(visible)
    rest = req2.prompt_text[len(visible):]
    assert obj["usage"]["prompt_tokens"] == len(live) + len(tok.encode_rendered(rest))


# ---- live tool-call streaming ------------------------------------------------------------------


def _openai_stream_run(raw: bytes, cuts, calls, ids_from_stream=True):
    sent, send = _collect()
    counter = iter(range(100))
    s = OpenAIChatStream(send, "c", "m", thinking=False, has_tools=True, new_id=lambda: f"call_{next(counter)}")
    s.start()
    for c in sorted(set(cuts)):
        s.update(raw[:c])
    ids = s.tool_ids[:len(calls)] + [f"call_late{i}" for i in range(len(calls) - len(s.tool_ids))]
    s.finish(raw, calls, ids, "tool_calls", shapes.Usage(1, 0, 1), include_usage=False)
    return [c["choices"][0]["delta"] for c in _chunks(sent)]


TWO_CALLS = ("Let me check.\n\n" + TC + '\n<｜DSML｜invoke name="get">\n'
             '<｜DSML｜parameter name="city" string="true">Par&lt;is "é"</｜DSML｜parameter>\n'
             '<｜DSML｜parameter name="days" string="false">[1, 2]</｜DSML｜parameter>\n'
             '</｜DSML｜invoke>\n<｜DSML｜invoke name="now">\n</｜DSML｜invoke>\n' + TC_END).encode()


@given(st.lists(st.integers(1, len(TWO_CALLS)), max_size=20))
def test_openai_live_tool_stream_reassembles_arguments(cuts):
    from ds4.chat import parse_generated

    parsed = parse_generated(TWO_CALLS.decode(), thinking=False)
    assert len(parsed.tool_calls) == 2
    deltas = _openai_stream_run(TWO_CALLS, cuts, parsed.tool_calls)
    assert "".join(d.get("content", "") for d in deltas) == "Let me check."
    calls = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            entry = calls.setdefault(tc["index"], {"id": None, "name": None, "args": ""})
            if "id" in tc:
                entry["id"], entry["name"] = tc["id"], tc["function"]["name"]
            entry["args"] += tc["function"]["arguments"]
    assert [calls[i]["name"] for i in sorted(calls)] == ["get", "now"]
    assert [calls[i]["id"] for i in sorted(calls)] == ["call_0", "call_1"]
    # the streamed fragments form exactly the arguments the final parser produced
    assert json.loads(calls[0]["args"]) == {"city": 'Par<is "é"', "days": [1, 2]}
    assert json.loads(calls[1]["args"]) == {}
    for i, call in enumerate(parsed.tool_calls):
        assert json.loads(calls[i]["args"]) == json.loads(call.arguments)


def test_openai_tool_stream_without_string_attr_falls_back_to_final_delta():
    from ds4.chat import parse_generated

    raw = ("\n\n" + TC + '<｜DSML｜invoke name="f"><｜DSML｜parameter name="k">v</｜DSML｜parameter>'
           '</｜DSML｜invoke>' + TC_END).encode()
    parsed = parse_generated(raw.decode(), thinking=False)
    deltas = _openai_stream_run(raw, range(1, len(raw)), parsed.tool_calls)
    tool = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    # the live projection gave up at the string-less parameter after announcing the call; the
    # final parser still produced the call, which was already announced, so it is not resent
    assert tool[0][0]["function"]["name"] == "f"
    assert all(len(t) == 1 for t in tool)


def test_anthropic_live_tool_stream():
    sent, send = _collect()
    s = AnthropicStream(send, "msg", "m", thinking=False, has_tools=True, new_id=lambda: "toolu_live")
    s.start(shapes.Usage(1, 0, 0))
    for c in range(1, len(TWO_CALLS) + 1, 5):
        s.update(TWO_CALLS[:c])
    from ds4.chat import parse_generated

    calls = parse_generated(TWO_CALLS.decode(), thinking=False).tool_calls
    s.finish(TWO_CALLS, calls, ["toolu_live", "toolu_live"], "tool_calls", 3)
    events = []
    for part in b"".join(sent).decode().split("\n\n"):
        if part:
            name, data = part.split("\n", 1)
            events.append((name[len("event: "):], json.loads(data[len("data: "):])))
    starts = [d for n, d in events if n == "content_block_start"]
    assert [b["content_block"]["type"] for b in starts] == ["text", "tool_use", "tool_use"]
    assert [b["index"] for b in starts] == [0, 1, 2]
    args = {}
    for n, d in events:
        if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta":
            args[d["index"]] = args.get(d["index"], "") + d["delta"]["partial_json"]
    assert json.loads(args[1]) == {"city": 'Par<is "é"', "days": [1, 2]} and json.loads(args[2]) == {}
    stops = [d["index"] for n, d in events if n == "content_block_stop"]
    assert stops == [0, 1, 2]


def test_streamed_tool_call_ids_are_remembered_for_replay(tok):
    eng = ScriptEngine(tok, TWO_CALLS.decode())
    w = Worker(eng, ctx=4096, default_tokens=400)
    msgs = [{"role": "user", "content": "Weather?"}]
    req = _chat_req(tok, w, {"messages": msgs, "tools": TOOLS, "thinking": False, "stream": True})
    _, body = _run_job(w, req)
    chunks = _chunks([body])
    starts = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", []) if "id" in tc]
    assert [s["function"]["name"] for s in starts] == ["get", "now"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    ids = [s["id"] for s in starts]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == 2
    # the ids the client saw map to the exact sampled block
    assert w.tools.lookup(ids) == TWO_CALLS.decode()[len("Let me check."):]


def test_canonical_checkpoint_without_exact_replay(tok):
    # a block in a layout the canonical renderer would not write (no newlines, one call)
    sampled = "\n\n" + TC + '<｜DSML｜invoke name="get"><｜DSML｜parameter name="city" string="true">Rome' \
              '</｜DSML｜parameter></｜DSML｜invoke>' + TC_END
    eng = ScriptEngine(tok, "Checking." + sampled)
    w = Worker(eng, ctx=4096, default_tokens=400, tool_memory=ToolMemory(0))  # replay disabled
    msgs = [{"role": "user", "content": "Weather?"}]
    req = _chat_req(tok, w, {"messages": msgs, "tools": TOOLS, "thinking": False})
    _, body = _run_job(w, req)
    call = json.loads(body)["choices"][0]["message"]["tool_calls"][0]
    follow = msgs + [{"role": "assistant", "content": "Checking.", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    req2 = _chat_req(tok, w, {"messages": follow, "tools": TOOLS, "thinking": False})
    assert sampled not in req2.prompt_text  # rendered canonically
    # the live state was rewritten to the canonical transcript (through the turn's EOS) ...
    assert req2.prompt[: len(w.session.tokens)] == w.session.tokens
    assert tok.decode_bytes(w.session.tokens).decode().endswith("</｜DSML｜tool_calls><｜end▁of▁sentence｜>")
    # ... so the next turn reuses all of it
    eng.set("ok")
    live = len(w.session.tokens)
    _, body = _run_job(w, req2)
    assert json.loads(body)["usage"]["prompt_tokens_details"]["cached_tokens"] == live


# ---- Responses API -----------------------------------------------------------------------------

from ds4.server.responses import parse_responses  # noqa: E402

RESP_TOOLS = [{"type": "function", "name": "get", "parameters": {"type": "object"}}]


def _resp_req(tok, w, body):
    return parse_responses(json.dumps(body), tok, w.ctx, tool_memory=w.tools)


def test_responses_parse_items(tok):
    body = {"instructions": "Be terse.", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "need tool"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get", "arguments": "{\"city\": \"Rome\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "compaction", "id": "cmp"}]}
    r = parse_responses(json.dumps(body), tok, 4096)
    assert r.api == "responses" and r.kind == "chat" and r.context_param == "input"
    expected = render([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Weather?"},
                       {"role": "assistant", "content": "Checking.", "reasoning_content": "need tool",
                        "tool_calls": [{"id": "call_1", "function": {"name": "get", "arguments": '{"city": "Rome"}'}}]},
                       {"role": "tool", "content": "sunny"}], think="high").text
    assert r.prompt_text == expected  # assistant text + call merged into one turn, reasoning attached
    assert parse_responses('{"input": "hi", "reasoning": {"effort": "none"}}', tok, 4096).think == "none"
    s = parse_responses('{"input": "hi", "reasoning": {"summary": "auto"}}', tok, 4096)
    assert s.reasoning_summary and s.think == "high"


@pytest.mark.parametrize("body, message", [
    ({"model": "x"}, "missing input"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id is not supported; replay full input instead"),
    ({"input": "x", "conversation": "c"}, "conversation is not supported; replay full input instead"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice: forces a tool call but no tools are given"),
    ({"input": "x", "tool_choice": {"type": "function", "name": "f"}},
     "tool_choice: names the tool 'f', which is not in tools"),
    ({"input": [{"type": "message", "role": "user", "content": "x", "status": "bogus"}]},
     "input[0].status: unknown item status 'bogus'"),
    ({"input": [{"type": "mystery"}]}, "invalid JSON request"),
    ({"input": "x", "top_logprobs": 2}, "top_logprobs: logprobs are not returned by /v1/responses "
                                        "(use /v1/chat/completions)"),
    ({"input": "x", "text": {"format": {"type": "json_schema"}}},
     "text.format: only {\"type\": \"text\"} is supported, got 'json_schema'"),
    ({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "x"}]},
     "Responses continuation state is not available for call_id call_9; retry by replaying the full input history"),
])
def test_responses_parse_errors(tok, body, message):
    with pytest.raises(RequestError) as e:
        parse_responses(json.dumps(body), tok, 4096)
    assert e.value.status == 400 and e.value.message == message


def test_responses_tool_turn_and_visible_continuation(tok):
    sampled = "\n\n" + TC + '<｜DSML｜invoke name="get"><｜DSML｜parameter name="city" string="true">Rome' \
              '</｜DSML｜parameter></｜DSML｜invoke>' + TC_END
    eng = ScriptEngine(tok, "hidden plan</think>Checking." + sampled)
    w = Worker(eng, ctx=4096, default_tokens=400)
    first = [{"type": "message", "role": "user", "content": "Weather?"}]
    req = _resp_req(tok, w, {"input": first, "tools": RESP_TOOLS, "reasoning": {"summary": "auto"}})
    _, body = _run_job(w, req)
    obj = json.loads(body)
    assert obj["object"] == "response" and obj["status"] == "completed" and obj["id"].startswith("resp_")
    kinds = [o["type"] for o in obj["output"]]
    assert kinds == ["reasoning", "message", "function_call"]
    assert obj["output"][0]["summary"] == [{"type": "summary_text", "text": "hidden plan"}]
    assert obj["output"][1]["content"][0]["text"] == "Checking."
    fc = obj["output"][2]
    assert fc["name"] == "get" and fc["arguments"] == '{"city":"Rome"}' and fc["call_id"].startswith("call_")
    assert obj["usage"]["output_tokens_details"] == {"reasoning_tokens": 0}
    live = list(w.session.tokens)
    # the client replays visible items (with the reasoning summary, as it opted in) + the tool output
    follow = first + [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "hidden plan"}]},
                      {"type": "message", "role": "assistant", "content": "Checking."},
                      {"type": "function_call", "call_id": fc["call_id"], "name": "get", "arguments": fc["arguments"]},
                      {"type": "function_call_output", "call_id": fc["call_id"], "output": "sunny"}]
    eng.set("ok</think>Sunny.")
    req2 = _resp_req(tok, w, {"input": follow, "tools": RESP_TOOLS, "reasoning": {"summary": "auto"}})
    _, body = _run_job(w, req2)
    obj2 = json.loads(body)
    assert w.last_result.source in ("responses-visible", "memory-token")
    assert obj2["usage"]["input_tokens_details"]["cached_tokens"] == len(live)
    assert [o["type"] for o in obj2["output"]] == ["reasoning", "message"]


def test_responses_stream_events(tok):
    eng = ScriptEngine(tok, "think</think>Answer." + "\n\n" + TC + '<｜DSML｜invoke name="get"></｜DSML｜invoke>' + TC_END)
    w = Worker(eng, ctx=4096, default_tokens=400)
    req = _resp_req(tok, w, {"input": "q", "tools": RESP_TOOLS, "stream": True, "reasoning": {"summary": "auto"}})
    _, body = _run_job(w, req)
    events = [json.loads(p[6:]) for p in body.decode().split("\n\n") if p.startswith("data: ")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert all(list(e)[:2] == ["type", "sequence_number"] for e in events)
    types = [e["type"] for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert types.count("response.output_item.added") == types.count("response.output_item.done") == 3
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "Answer."
    reasoning = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_summary_text.delta")
    assert reasoning == "think"
    final = events[-1]["response"]
    assert [o["type"] for o in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][0]["status"] == "completed"  # </think> was seen
    args = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert args and args[0]["name"] == "get" and args[0]["arguments"] == "{}"


# ---- robustness: any JSON body either parses or is a clean 400 ---------------------------------

_KEYS = ["messages", "prompt", "input", "model", "max_tokens", "max_completion_tokens", "max_output_tokens",
         "temperature", "top_p", "top_k", "min_p", "seed", "stream", "stream_options", "thinking", "think",
         "reasoning_effort", "reasoning", "stop", "stop_sequences", "tools", "tool_choice", "system",
         "instructions", "role", "content", "type", "text", "tool_calls", "function", "name", "arguments",
         "call_id", "output", "status", "summary", "tool_use_id", "input_text", "effort", "id"]
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12) | st.sampled_from(["user", "assistant", "tool", "system", "message", "function_call",
                                              "function_call_output", "tool_use", "tool_result", "none", "auto",
                                              "enabled", "disabled", "high", "max", "text"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(_KEYS), children, max_size=5),
    max_leaves=25,
)


@given(st.dictionaries(st.sampled_from(_KEYS), _json_values, max_size=8))
def test_parsers_never_crash(tok, body):
    text = json.dumps(body)
    for parse in (parse_chat, parse_completion, parse_anthropic, parse_responses):
        try:
            r = parse(text, tok, 4096)
        except RequestError as e:
            assert e.status == 400 and e.message
        else:
            if not (parse is parse_completion and isinstance(body.get("prompt"), list)):  # token ids stay as sent
                assert r.prompt == tok.encode_rendered(r.prompt_text)
            assert r.max_tokens == int(r.max_tokens)


def test_lone_surrogate_is_a_clean_error(tok):
    body = '{"messages": [{"role": "user", "content": "\\ud800"}]}'
    with pytest.raises(RequestError) as e:
        parse_chat(body, tok, 4096)
    assert e.value.status == 400


# ---- live tool continuation (tool outputs bound to the live session's calls) -------------------

ANTH_TOOLS = [{"name": "get", "input_schema": {"type": "object"}}]
CALL_BLOCK = "\n\n" + TC + '<｜DSML｜invoke name="get"><｜DSML｜parameter name="city" string="true">Rome' \
             '</｜DSML｜parameter></｜DSML｜invoke>' + TC_END


def _anth_req(tok, w, body):
    return parse_anthropic(json.dumps(body), tok, w.ctx, tool_memory=w.tools, live=w.live)


def test_anthropic_tool_result_continues_live_session(tok):
    eng = ScriptEngine(tok, "Checking." + CALL_BLOCK)
    w = Worker(eng, ctx=4096, default_tokens=400)
    first = [{"role": "user", "content": "Weather?"}]
    _, body = _run_job(w, _anth_req(tok, w, {"messages": first, "tools": ANTH_TOOLS, "max_tokens": 400,
                                             "thinking": {"type": "disabled"}}))
    obj = json.loads(body)
    assert obj["stop_reason"] == "tool_use"
    use = obj["content"][-1]
    assert use["type"] == "tool_use" and use["input"] == {"city": "Rome"} and use["id"].startswith("toolu_")
    live = list(w.session.tokens)
    # only the tool result is sent (no replay of the tool_use): bound to the live calls
    result_only = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "sunny"}]}]
    req = _anth_req(tok, w, {"messages": result_only, "tools": ANTH_TOOLS, "max_tokens": 400,
                             "thinking": {"type": "disabled"}})
    assert req.requires_live and req.live_ids == (use["id"],)
    assert req.live_tail == ("<｜end▁of▁sentence｜><｜User｜><tool_result>sunny</tool_result>"
                             "<｜Assistant｜></think>")
    eng.set("Sunny in Rome.")
    _, body = _run_job(w, req)
    obj2 = json.loads(body)
    assert w.last_result.source == "anthropic-tool-output"
    assert obj2["content"] == [{"type": "text", "text": "Sunny in Rome."}]
    assert obj2["usage"]["cache_read_input_tokens"] == len(live)
    assert w.session.tokens[: len(live) + 1] == live + [tok.eos]  # the tail closed the sampled turn
    # the binding is spent: the same tool-result-only request now finds no live state
    with pytest.raises(RequestError) as e:
        _anth_req(tok, w, {"messages": result_only, "max_tokens": 4})
    assert e.value.status == 400


def test_anthropic_live_state_lost_is_409(tok):
    eng = ScriptEngine(tok, CALL_BLOCK)
    w = Worker(eng, ctx=4096, default_tokens=400)
    _, body = _run_job(w, _anth_req(tok, w, {"messages": [{"role": "user", "content": "q"}], "tools": ANTH_TOOLS,
                                             "max_tokens": 400, "thinking": False}))
    use = json.loads(body)["content"][-1]
    req = _anth_req(tok, w, {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use["id"], "content": "r"}]}], "max_tokens": 4, "thinking": False})
    assert req.requires_live
    # another request replaces the live state between parsing and execution
    eng.set("x")
    _run_job(w, _chat_req(tok, w, {"messages": [{"role": "user", "content": "other"}], "thinking": False}))
    head, body = _run_job(w, req)
    assert head.startswith("HTTP/1.1 409 Conflict")
    assert json.loads(body)["error"]["message"] == ("Anthropic continuation state is not available; retry by "
                                                    "replaying the full messages history")


def test_responses_tool_output_only_continuation(tok):
    eng = ScriptEngine(tok, "plan</think>" + CALL_BLOCK)
    w = Worker(eng, ctx=4096, default_tokens=400)
    _, body = _run_job(w, _resp_req(tok, w, {"input": "Weather?", "tools": RESP_TOOLS}))
    fc = json.loads(body)["output"][-1]
    assert fc["type"] == "function_call"
    live = list(w.session.tokens)
    req = parse_responses(json.dumps({"input": [{"type": "function_call_output", "call_id": fc["call_id"],
                                                 "output": "sunny"}], "tools": RESP_TOOLS}),
                          tok, w.ctx, tool_memory=w.tools, live=w.live)
    assert req.requires_live and req.live_tail.endswith("<tool_result>sunny</tool_result><｜Assistant｜><think>")
    eng.set("done</think>Sunny.")
    _, body = _run_job(w, req)
    obj = json.loads(body)
    assert w.last_result.source == "responses-tool-output"
    assert obj["usage"]["input_tokens_details"]["cached_tokens"] == len(live)
    assert [o["type"] for o in obj["output"]] == ["message"]  # no summary opt-in: reasoning not sent


class _RecordingCache:
    """Disk-cache double recording what the worker asks to store."""

    min_tokens = 1

    def __init__(self):
        self.stores = []

    def store(self, session, reason, model=None, **kw):
        self.stores.append((reason, list(session.tokens), kw))

    def shutdown(self, session, model=None, **kw):
        self.store(session, "shutdown", model, **kw)

    def continued_target(self, n):
        return 0

    def prepare(self, session, text, model=None, reuse_live=True):
        from ds4.kvcache import PreparedPrompt
        return PreparedPrompt(list(session.engine.tokenizer.encode_rendered(text)), 0, "cold")

    def sync(self, session, plan, model=None, **kw):
        session.sync(plan.tokens)


def test_visible_transcript_keys_for_evict_and_shutdown(tok):
    from ds4.kvcache_format import EXT_THINKING_VISIBLE

    eng = ScriptEngine(tok, "hidden</think>Shown")
    kv = _RecordingCache()
    w = Worker(eng, ctx=4096, default_tokens=400, kv_cache=kv)
    req = _chat_req(tok, w, {"messages": [{"role": "user", "content": "q"}]})
    _run_job(w, req)
    w.shutdown_store()
    reason, tokens, kw = kv.stores[-1]
    assert reason == "shutdown" and tokens == w.session.tokens
    # keyed by what a client will replay (no reasoning), while the payload keeps the hidden tokens
    assert kw["text"] == (req.prompt_text[: -len("<think>")] + "</think>Shown<｜end▁of▁sentence｜>").encode()
    assert kw["ext_flags"] == EXT_THINKING_VISIBLE
    # an unrelated prompt evicts the live state under the same visible key
    _run_job(w, _chat_req(tok, w, {"messages": [{"role": "user", "content": "other"}], "thinking": False}))
    evicts = [s for s in kv.stores if s[0] == "evict"]
    assert evicts and evicts[0][2]["ext_flags"] == EXT_THINKING_VISIBLE


def test_tool_memory_bounds():
    m = ToolMemory(max_ids=3, max_bytes=11)
    m.remember(["a", "b"], "12345")  # one block shared by two ids counts once
    m.remember(["c"], "abc")
    assert len(m) == 3 and m.lookup(["a", "b"]) == "12345" and m.lookup(["a", "c"]) is None
    # lookups count as use: the order is now b, a, c
    m.remember(["d"], "xyz")  # 4 ids > 3: the least recently used ("b") goes
    assert not m.has("b") and m.has("a") and m.has("c") and m.has("d")
    m.remember(["e"], "0123456789")  # 5 + 3 + 3 + 10 bytes > 11: oldest entries go until it fits
    assert m.has("e") and not any(m.has(i) for i in "acd")
    m.remember(["e"], "short")  # re-pointing an id releases its old block
    assert m.lookup(["e"]) == "short"
    assert ToolMemory(max_ids=0).lookup(["e"]) is None  # replay disabled


def test_responses_namespace_tools(tok):
    tools = [{"type": "namespace", "name": "mcp__files__", "tools": [
        {"type": "function", "name": "read", "description": "Read a file",
         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
        {"type": "function", "name": "ls"}]},
        {"type": "function", "name": "plain", "parameters": {"type": "object"}}]
    eng = ScriptEngine(tok, "\n\n" + TC + '<｜DSML｜invoke name="mcp__files__read"><｜DSML｜parameter name="path" '
                            'string="true">a.txt</｜DSML｜parameter></｜DSML｜invoke>' + TC_END)
    w = Worker(eng, ctx=4096, default_tokens=400)
    req = _resp_req(tok, w, {"input": "read it", "tools": tools, "reasoning": {"effort": "none"}})
    assert ('{"name":"mcp__files__read","description":"Read a file","parameters":{"type": "object", '
            '"properties": {"path": {"type": "string"}}}}') in req.prompt_text
    assert '{"name":"mcp__files__ls","description":"","parameters":{"type":"object","properties":{}}}' in req.prompt_text
    assert '{"type": "function", "name": "plain", "parameters": {"type": "object"}}' in req.prompt_text
    _, body = _run_job(w, req)
    (fc,) = json.loads(body)["output"]
    assert fc["type"] == "function_call" and fc["name"] == "read" and fc["namespace"] == "mcp__files__"
    assert json.loads(fc["arguments"]) == {"path": "a.txt"}
    assert list(fc)[:6] == ["id", "type", "status", "name", "namespace", "call_id"]


@given(st.integers(0, 30))
def test_completion_stream_never_leaks_a_stop_string(tok, cut):
    text = "The quick brown fox jumps over the lazy dog"
    stop = text[cut:cut + 5] if cut + 5 <= len(text) else "never"
    eng = ScriptEngine(tok, text)
    w = Worker(eng, ctx=4096, default_tokens=200)
    req = parse_completion(json.dumps({"prompt": "p", "stream": True, "stop": [stop], "think": False}), tok, 4096)
    _, body = _run_job(w, req)
    chunks = _chunks([body])
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    expected = text[: text.find(stop)] if stop in text else text
    assert streamed == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"  # the stop string, or the script's EOS
    if stop in text:
        assert w.session.tokens == []  # a stop hit drops the live state (its KV ran past the cut)
