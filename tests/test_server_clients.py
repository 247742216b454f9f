"""The official ``openai`` and ``anthropic`` Python clients against a live server on 127.0.0.1.

The engine is :class:`server_fakes.ScriptEngine`: each request "generates" the text the test set,
so reasoning, tool calls and stop strings come out exactly as written and the clients' parsed
objects can be compared with known values. Every test drives the server only through the SDKs
(streams and not, tools, multi-turn replays of the SDK's own output objects, thinking, stop
sequences, errors), as an agent would.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from ds4.chat import forced_tool_opening
from ds4.server import Server, ServerConfig
from server_fakes import ScriptEngine, script_tokenizer

CTX = 4096
TC = "<｜DSML｜tool_calls>"
TC_END = "</｜DSML｜tool_calls>"
CALL = (f'\n\n{TC}\n<｜DSML｜invoke name="get_weather">\n'
        f'<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n{TC_END}')
OPENAI_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Weather of a city",
                    "input_schema": OPENAI_TOOLS[0]["function"]["parameters"]}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
                    "parameters": OPENAI_TOOLS[0]["function"]["parameters"]}]


@pytest.fixture(scope="module")
def engine():
    return ScriptEngine(script_tokenizer())


@pytest.fixture(scope="module")
def server(engine):
    srv = Server(engine, ServerConfig(port=0, ctx=CTX, default_tokens=200, api_key="test-key")).start()
    yield srv
    srv.stop()


@pytest.fixture
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="test-key", max_retries=0, timeout=30)


@pytest.fixture
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="test-key", max_retries=0, timeout=30)


USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def _script_after_forced(engine, name, head=""):
    """A script that writes no tool call on its own: where the server writes the forced call
    opening it says "x x x ...", and what follows completes the call. Only a server that forces
    the opening gets a valid call out of it."""
    tok = engine.tokenizer
    forced = tok.encode_rendered(forced_tool_opening(name))
    rest = ("" if name else 'get_weather">\n') + CALL[CALL.index("<｜DSML｜parameter"):]
    engine.script = (tok.encode_rendered(head) + tok.encode_rendered("x") * len(forced) + tok.encode_rendered(rest)
                     + [tok.eos])


# ---- OpenAI chat completions ---------------------------------------------------------------------


def _stream_chat(oai, **kw):
    """(reasoning, content, tool calls {index: [id, name, args]}, finish, usage) of a stream."""
    reasoning = content = ""
    calls: dict = {}
    finish = usage = None
    for chunk in oai.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            d = ch.delta
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            content += d.content or ""
            for tc in d.tool_calls or []:
                c = calls.setdefault(tc.index, [None, "", ""])
                c[0] = tc.id or c[0]
                c[1] += (tc.function.name or "") if tc.function else ""
                c[2] += (tc.function.arguments or "") if tc.function else ""
            finish = ch.finish_reason or finish
    return reasoning, content, calls, finish, usage


def test_chat_thinking_stream_and_not_agree(oai, engine):
    engine.set("Let me think.</think>It is sunny.")
    r = oai.chat.completions.create(model="deepseek-v4-flash", messages=USER, max_tokens=50)
    msg = r.choices[0].message
    assert (msg.content, msg.model_extra["reasoning_content"], r.choices[0].finish_reason) == (
        "It is sunny.", "Let me think.", "stop")
    assert r.id.startswith("chatcmpl-") and r.usage.completion_tokens == len(engine.script) - 1  # EOS not counted
    reasoning, content, calls, finish, usage = _stream_chat(oai, model="deepseek-v4-flash", messages=USER,
                                                            max_tokens=50)
    assert (reasoning, content, calls, finish) == ("Let me think.", "It is sunny.", {}, "stop")
    assert usage.completion_tokens == r.usage.completion_tokens and usage.prompt_tokens == r.usage.prompt_tokens


def test_chat_reasoning_cut_by_max_tokens_stays_reasoning(oai, engine):
    engine.set("A long chain of thought that goes on.</think>Answer")
    r = oai.chat.completions.create(model="m", messages=USER, max_tokens=3)
    msg = r.choices[0].message
    cut = engine.tokenizer.decode(engine.script[:3])
    assert r.choices[0].finish_reason == "length"
    assert msg.content == "" and msg.model_extra["reasoning_content"] == cut
    reasoning, content, _, finish, _ = _stream_chat(oai, model="m", messages=USER, max_tokens=3)
    assert (reasoning, content, finish) == (cut, "", "length")


def test_chat_multi_turn_replay_of_sdk_message_reuses_live_session(oai, engine):
    engine.set("Sunny.")
    first = oai.chat.completions.create(model="m", messages=USER, max_tokens=20, extra_body={"thinking": False})
    live = first.usage.prompt_tokens + first.usage.completion_tokens
    engine.set("You are welcome.")
    messages = USER + [first.choices[0].message, {"role": "user", "content": "Thanks"}]  # the SDK object itself
    second = oai.chat.completions.create(model="m", messages=messages, max_tokens=20, extra_body={"thinking": False})
    assert second.choices[0].message.content == "You are welcome."
    # the live session held prompt + answer (+ the EOS the renderer writes): only the new turn was evaluated
    assert second.usage.prompt_tokens_details.cached_tokens == live


def test_chat_tools_stream_and_not_then_replay(oai, engine):
    engine.set("I will check." + CALL + "never sampled")
    kw = dict(model="m", messages=USER, tools=OPENAI_TOOLS, max_tokens=200, extra_body={"thinking": False})
    r = oai.chat.completions.create(**kw)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content == "I will check."
    (call,) = msg.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"} and call.id.startswith("call_")
    _, content, calls, finish, _ = _stream_chat(oai, **kw)
    assert content == "I will check." and finish == "tool_calls"
    assert [(c[1], json.loads(c[2])) for c in calls.values()] == [("get_weather", {"city": "Paris"})]
    # replay the streamed call with its id and the tool's result: the live session continues
    live = r.usage.prompt_tokens + r.usage.completion_tokens
    engine.set("It is sunny in Paris.")
    streamed_id = calls[0][0]
    messages = USER + [{"role": "assistant", "content": content, "tool_calls": [
        {"id": streamed_id, "type": "function", "function": {"name": calls[0][1], "arguments": calls[0][2]}}]},
        {"role": "tool", "tool_call_id": streamed_id, "content": "sunny"}]
    r2 = oai.chat.completions.create(**{**kw, "messages": messages})
    assert r2.choices[0].message.content == "It is sunny in Paris." and r2.choices[0].finish_reason == "stop"
    assert r2.usage.prompt_tokens_details.cached_tokens == live  # the exact sampled block was replayed


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_chat_forced_tool_choice(oai, engine, choice):
    named = None if choice == "required" else "get_weather"
    _script_after_forced(engine, named)
    kw = dict(model="m", messages=USER, tools=OPENAI_TOOLS, max_tokens=200, extra_body={"thinking": False})
    unforced = oai.chat.completions.create(**kw)
    assert not unforced.choices[0].message.tool_calls  # on its own the "model" writes no call
    r = oai.chat.completions.create(tool_choice=choice, **kw)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert r.choices[0].finish_reason == "tool_calls"


def test_chat_forced_tool_choice_waits_for_reasoning(oai, engine):
    _script_after_forced(engine, None, head="Plan.</think>")
    r = oai.chat.completions.create(model="m", messages=USER, tools=OPENAI_TOOLS, tool_choice="required",
                                    max_tokens=200)
    msg = r.choices[0].message
    assert msg.model_extra["reasoning_content"] == "Plan." and msg.tool_calls[0].function.name == "get_weather"


def test_chat_stop_sequence_and_logprobs(oai, engine):
    engine.set("alpha beta STOP gamma")
    r = oai.chat.completions.create(model="m", messages=USER, stop=["STOP"], max_tokens=50,
                                    extra_body={"thinking": False})
    assert r.choices[0].message.content == "alpha beta " and r.choices[0].finish_reason == "stop"
    _, content, _, finish, _ = _stream_chat(oai, model="m", messages=USER, stop="STOP", max_tokens=50,
                                            extra_body={"thinking": False})
    assert (content, finish) == ("alpha beta ", "stop")
    engine.set("alpha beta")
    r = oai.chat.completions.create(model="m", messages=USER, max_tokens=50, logprobs=True, top_logprobs=2,
                                    extra_body={"thinking": False})
    lp = r.choices[0].logprobs.content
    assert "".join(t.token for t in lp) == "alpha beta" and len(lp) == len(engine.script) - 1
    # the script puts logit 20 on the chosen token and -20 on the 511 others: log p = -log(1 + 511 e^-40)
    assert all(abs(t.logprob) < 1e-12 for t in lp)
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token for t in lp)
    assert all(abs(t.top_logprobs[1].logprob + 40) < 1e-6 for t in lp)
    assert bytes(lp[0].bytes).decode() == lp[0].token
    # streamed: the chunks' logprobs add up to the same tokens
    streamed = [t for chunk in oai.chat.completions.create(model="m", messages=USER, max_tokens=50, logprobs=True,
                                                           top_logprobs=1, stream=True, extra_body={"thinking": False})
                for ch in chunk.choices if ch.logprobs and ch.logprobs.content for t in ch.logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in lp] and all(len(t.top_logprobs) == 1 for t in streamed)


def test_logit_bias_and_penalties(oai, engine):
    # the script puts logit 20 on its token and -20 elsewhere: a bias of 45 makes "Z" win (25 > 20)
    engine.set("alpha beta gamma")
    z = engine.tokenizer.encode("Z")
    assert len(z) == 1
    kw = dict(model="m", messages=USER, max_tokens=6, temperature=0, extra_body={"thinking": False},
              logit_bias={str(z[0]): 45})
    assert oai.chat.completions.create(**kw).choices[0].message.content == "Z" * 6
    script = engine.tokenizer.decode
    # frequency 2: Z scores 25, 23, 21, 19 ... so the script wins from the fourth token on
    r = oai.chat.completions.create(frequency_penalty=2, **kw).choices[0].message.content
    assert r == "ZZZ" + script(engine.script[3:6])
    # presence 2 with a bias of 41: Z scores 21, then 19 for good
    kw["logit_bias"] = {str(z[0]): 41}
    r = oai.chat.completions.create(presence_penalty=2, **kw).choices[0].message.content
    assert r == "Z" + script(engine.script[1:6])


def test_length_at_the_end_of_the_context(engine):
    with Server(engine, ServerConfig(port=0, ctx=48)) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)
        engine.set("word " * 100)
        r = c.chat.completions.create(model="m", messages=USER, extra_body={"thinking": False})
        assert r.choices[0].finish_reason == "length"
        assert r.usage.prompt_tokens + r.usage.completion_tokens == 48  # up to the context, not one past
        a = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=30)
        m = a.messages.create(model="m", max_tokens=1000, messages=USER, thinking={"type": "disabled"})
        assert m.stop_reason == "max_tokens"
        rr = c.responses.create(model="m", input="What is the weather in Paris?", reasoning={"effort": "none"})
        assert rr.status == "incomplete" and rr.incomplete_details.reason == "max_output_tokens"


# ---- legacy completions ---------------------------------------------------------------------------


def test_completions_text_and_token_ids(oai, engine):
    engine.set("Once more.")
    r = oai.completions.create(model="m", prompt="Tell", max_tokens=20, logprobs=1, extra_body={"think": False})
    assert r.choices[0].text == "Once more." and r.choices[0].finish_reason == "stop"
    assert "".join(r.choices[0].logprobs.tokens) == "Once more."
    ids = engine.tokenizer.encode("Tell")
    r2 = oai.completions.create(model="m", prompt=ids, max_tokens=20, extra_body={"think": False})
    assert r2.choices[0].text == "Once more." and r2.usage.prompt_tokens == r.usage.prompt_tokens
    chunks = list(oai.completions.create(model="m", prompt="Tell", max_tokens=20, stream=True, logprobs=0,
                                         extra_body={"think": False}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Once more."
    lps = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert sum((lp.tokens for lp in lps), []) == r.choices[0].logprobs.tokens
    assert sum((lp.text_offset for lp in lps), []) == r.choices[0].logprobs.text_offset  # absolute offsets


# ---- Responses -------------------------------------------------------------------------------------


def test_responses_tools_and_replay_of_output(oai, engine):
    engine.set("Checking." + CALL)
    kw = dict(model="m", tools=RESPONSES_TOOLS, reasoning={"effort": "none"}, max_output_tokens=200)
    r = oai.responses.create(input=USER, **kw)
    assert r.status == "completed" and r.id.startswith("resp_")
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Paris"}
    assert r.output_text == "Checking."
    engine.set("Sunny.")
    inp = USER + [o.model_dump(exclude_none=True) for o in r.output]  # input += response.output
    inp.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"})
    r2 = oai.responses.create(input=inp, **kw)
    assert r2.output_text == "Sunny." and r2.usage.input_tokens_details.cached_tokens > 0


def test_responses_incomplete_and_reasoning_output_replays(oai, engine):
    engine.set("Thinking hard about it.</think>Done.")
    kw = dict(model="m", reasoning={"effort": "high", "summary": "auto"})
    r = oai.responses.create(input="Hi", max_output_tokens=3, **kw)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["reasoning"]
    engine.set("Ok.</think>Fine.")
    inp = [{"role": "user", "content": "Hi"}] + [o.model_dump(exclude_none=True) for o in r.output]
    inp.append({"role": "user", "content": "Go on"})
    r2 = oai.responses.create(input=inp, max_output_tokens=50, **kw)  # an incomplete item replays
    assert r2.status == "completed" and r2.output_text == "Fine."
    # streamed: the same output items, and the final event carries the whole response
    engine.set("Thinking hard about it.</think>Done.")
    events = list(oai.responses.create(input="Hi", max_output_tokens=50, stream=True, **kw))
    final = events[-1]
    assert final.type == "response.completed"
    assert final.response.output_text == "Done."
    assert final.response.output[0].summary[0].text == "Thinking hard about it."


def test_responses_forced_function(oai, engine):
    _script_after_forced(engine, None)
    r = oai.responses.create(model="m", input=USER, tools=RESPONSES_TOOLS, tool_choice="required",
                             reasoning={"effort": "none"})
    assert [o.type for o in r.output] == ["function_call"]


# ---- Anthropic messages ------------------------------------------------------------------------------


def test_anthropic_thinking_stream_and_not_agree(claude, engine):
    engine.set("Let me think.</think>It is sunny.")
    m = claude.messages.create(model="claude-x", max_tokens=50, messages=USER,
                               thinking={"type": "enabled", "budget_tokens": 1024})
    assert m.id.startswith("msg_") and m.stop_reason == "end_turn" and m.stop_sequence is None
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in m.content] == [
        ("thinking", "Let me think."), ("text", "It is sunny.")]
    u = m.usage
    assert u.cache_creation_input_tokens == 0 and u.input_tokens + u.cache_read_input_tokens == \
        claude.messages.count_tokens(model="claude-x", messages=USER,
                                     thinking={"type": "enabled", "budget_tokens": 1024}).input_tokens
    with claude.messages.stream(model="claude-x", max_tokens=50, messages=USER,
                                thinking={"type": "enabled", "budget_tokens": 1024}) as s:
        final = s.get_final_message()
    assert [b.model_dump(exclude={"signature"}) for b in final.content] == \
        [b.model_dump(exclude={"signature"}) for b in m.content]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == m.usage.output_tokens


def test_anthropic_tools_replay_and_live_reuse(claude, engine):
    engine.set("Checking." + CALL)
    kw = dict(model="claude-x", max_tokens=200, tools=ANTHROPIC_TOOLS, thinking={"type": "disabled"})
    m = claude.messages.create(messages=USER, **kw)
    assert m.stop_reason == "tool_use"
    use = m.content[-1]
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"}
    assert use.id.startswith("toolu_")
    engine.set("Sunny in Paris.")
    messages = USER + [{"role": "assistant", "content": m.content},  # the SDK's blocks, as returned
                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                     "content": "sunny"}]}]
    m2 = claude.messages.create(messages=messages, **kw)
    assert m2.content[0].text == "Sunny in Paris." and m2.stop_reason == "end_turn"
    assert m2.usage.cache_read_input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens \
        + m.usage.output_tokens
    # streamed tool use: the SDK assembles the same input from the JSON deltas
    engine.set("Checking." + CALL)
    with claude.messages.stream(messages=USER, **kw) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[-1].input == {"city": "Paris"}


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_anthropic_forced_tool_choice(claude, engine, choice):
    _script_after_forced(engine, choice.get("name"))
    m = claude.messages.create(model="c", max_tokens=200, messages=USER, tools=ANTHROPIC_TOOLS, tool_choice=choice,
                               thinking={"type": "disabled"})
    assert m.stop_reason == "tool_use" and m.content[-1].input == {"city": "Paris"}


def test_anthropic_stop_sequence(claude, engine):
    engine.set("alpha beta STOP gamma")
    kw = dict(model="c", max_tokens=50, messages=USER, stop_sequences=["STOP", "never"],
              thinking={"type": "disabled"})
    m = claude.messages.create(**kw)
    assert (m.stop_reason, m.stop_sequence, m.content[0].text) == ("stop_sequence", "STOP", "alpha beta ")
    with claude.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert (final.stop_reason, final.stop_sequence, final.content[0].text) == ("stop_sequence", "STOP", "alpha beta ")


# ---- errors as the SDKs see them ---------------------------------------------------------------------


def test_openai_errors(oai, server):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="m", messages=USER, temperature=3)
    assert e.value.param == "temperature" and e.value.status_code == 400
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="m", messages=[])
    assert e.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x " * 6000}])
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="m", messages=USER, n=2)
    assert e.value.param == "n"
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("gpt-nothing")
    assert oai.models.retrieve("deepseek-v4-flash").id == "deepseek-v4-flash"
    assert [m.id for m in oai.models.list()] == ["deepseek-v4-flash"]
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.models.list()
    assert e.value.code == "invalid_api_key"


def test_anthropic_errors(claude, server):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="c", max_tokens=0, messages=USER)
    assert e.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                        "message": "max_tokens: must be an integer >= 1, got 0"}}
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="c", max_tokens=5, messages=[{"role": "system", "content": "x"}])
    assert "messages[0].role" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="c", max_tokens=5, messages=USER, tools=[{"name": "f"}])
    assert e.value.body["error"]["message"] == "tools[0].input_schema: Field required"
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="c", max_tokens=5, messages=USER, extra_body={"temperature": 1.5})
    assert "temperature" in e.value.body["error"]["message"]
    bad = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model="c", max_tokens=5, messages=USER)
    assert e.value.body["error"]["type"] == "authentication_error"
    assert [m.id for m in claude.models.list()] == ["deepseek-v4-flash"]
