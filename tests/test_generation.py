"""Generation loop tests against a fake engine whose session scripts the next token (deterministic
logits), so expected texts are known without the model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ds4.chat import encode_chat_prompt
from ds4.errors import ContextOverflowError, InvalidArgumentError
from ds4.generation import FinishEvent, TokenEvent, build_prompt, generate
from ds4.tokenizer import Tokenizer, byte_to_unicode
from test_tokenizer_fixtures import tiny_vocab
from ds4.session import common_prefix_len
from server_fakes import scripted_logits


class FakeSession:
    """Session API double: after a sync to P tokens, logits peak at script[len(tokens) - len(P)]."""

    def __init__(self, engine, ctx):
        self.engine, self.ctx = engine, ctx
        self.tokens: list[int] = []
        self.base = 0
        self.evals = 0
        self.syncs: list[list[int]] = []

    @property
    def pos(self):
        return len(self.tokens)

    def sync(self, tokens):
        if len(tokens) >= self.ctx:
            raise ContextOverflowError("prompt exceeds context")
        self.syncs.append(list(tokens))
        if self.tokens != list(tokens[: len(self.tokens)]):
            self.tokens = []
        for t in tokens[len(self.tokens):]:
            self.eval(t)
        self.base = len(tokens)

    def common_prefix(self, tokens):  # Session.common_prefix
        return common_prefix_len(self.tokens, tokens)

    def eval(self, token):
        if len(self.tokens) >= self.ctx:
            raise ContextOverflowError("context full")
        self.tokens.append(int(token))
        self.evals += 1

    @property
    def logits(self):
        return scripted_logits(self.engine, len(self.tokens) - self.base)


class FakeEngine:
    def __init__(self, tokenizer, script):
        self.tokenizer, self.script = tokenizer, list(script)

    def session(self, ctx):
        return FakeSession(self, ctx)


@pytest.fixture(scope="module")
def tok():
    tokens, merges, types = tiny_vocab()
    return Tokenizer(tokens, merges, types)


def _byte_ids(tok, data: bytes):
    b2u = byte_to_unicode()
    return [tok.id_of(b2u[b]) for b in data]


def _run(engine, **kw):
    events = list(generate(engine, **kw))
    assert isinstance(events[-1], FinishEvent)
    assert all(isinstance(e, TokenEvent) for e in events[:-1])
    return events[:-1], events[-1]


def test_greedy_until_eos(tok):
    script = tok.encode("Hello world") + [tok.eos]
    eng = FakeEngine(tok, script)
    evs, fin = _run(eng, prompt="hi", temperature=0, think="none", ctx=256)
    assert fin.finish_reason == "eos"
    assert fin.content == "Hello world" and fin.reasoning == ""
    assert list(fin.tokens) == script[:-1]  # EOS is not part of the output
    assert "".join(e.text for e in evs) == "Hello world"
    assert fin.usage.prompt_tokens == len(encode_chat_prompt(tok, "hi", think="none"))
    assert fin.usage.completion_tokens == len(script) - 1
    assert fin.usage.total_tokens == fin.usage.prompt_tokens + fin.usage.completion_tokens


def test_prompt_building(tok):
    eng = FakeEngine(tok, [tok.eos])
    fin = generate(eng, prompt="hi", think="high", system="S", ctx=64, stream=False)
    assert fin.finish_reason == "eos" and fin.tokens == ()
    assert build_prompt(tok, prompt="hi", system="S", think="high") == encode_chat_prompt(tok, "hi", "S", "high")
    assert build_prompt(tok, prompt="plain", raw=True) == tok.encode("plain")
    rendered = "<｜begin▁of▁sentence｜><｜User｜>x<｜Assistant｜></think>"
    assert build_prompt(tok, prompt=rendered) == tok.encode_rendered(rendered)
    assert build_prompt(tok, tokens=[1, 2]) == [1, 2]
    msgs = [{"role": "user", "content": "m"}]
    assert build_prompt(tok, messages=msgs, think="none") == tok.encode_rendered(
        "<｜begin▁of▁sentence｜><｜User｜>m<｜Assistant｜></think>")
    with pytest.raises(InvalidArgumentError):
        build_prompt(tok, prompt="a", tokens=[1])


def test_max_tokens_length(tok):
    script = tok.encode("one two three four five six")
    eng = FakeEngine(tok, script)
    _, fin = _run(eng, prompt="x", temperature=0, max_tokens=3, ctx=256)
    assert fin.finish_reason == "length" and len(fin.tokens) == 3
    _, fin = _run(eng, prompt="x", temperature=0, max_tokens=0, ctx=256)
    assert fin.finish_reason == "length" and fin.tokens == ()


def test_stop_string_not_emitted(tok):
    eng = FakeEngine(tok, tok.encode("Hello world, how are you") + [tok.eos])
    evs, fin = _run(eng, prompt="x", temperature=0, think="none", stop=["lo wo", "zzz"], ctx=256)
    assert fin.finish_reason == "stop" and fin.stop == "lo wo"
    assert fin.content == "Hel"
    assert "".join(e.text for e in evs) == "Hel"


def test_stop_prefix_released_at_end(tok):
    eng = FakeEngine(tok, tok.encode("abc wor") + [tok.eos])
    evs, fin = _run(eng, prompt="x", temperature=0, think="none", stop=["world"], ctx=256)
    assert fin.finish_reason == "eos" and fin.content == "abc wor"
    assert "".join(e.text for e in evs) == "abc wor"
    assert evs[-1].token is None  # the held-back " wor" is flushed at the end


def test_utf8_split_across_tokens(tok):
    text = "é🙂中"
    eng = FakeEngine(tok, _byte_ids(tok, text.encode()) + [tok.eos])
    evs, fin = _run(eng, prompt="x", temperature=0, think="none", ctx=256)
    assert fin.content == text
    assert all("\ufffd" not in e.text for e in evs)
    assert [e.text for e in evs if e.text] == ["é", "🙂", "中"]


def test_thinking_channels(tok):
    script = tok.encode("let me think") + [tok.think_end] + tok.encode("answer") + [tok.eos]
    eng = FakeEngine(tok, script)
    evs, fin = _run(eng, prompt="q", temperature=0, think="high", ctx=256)
    assert fin.reasoning == "let me think" and fin.content == "answer"
    assert fin.text == "let me thinkanswer"
    marker = [e for e in evs if e.token == tok.think_end]
    assert len(marker) == 1 and marker[0].channel == "reasoning"
    assert "".join(e.text for e in evs if e.channel == "content") == "answer"
    # without thinking, </think> is ordinary content text
    _, fin = _run(eng, prompt="q", temperature=0, think="none", ctx=256)
    assert fin.content == "let me think</think>answer" and fin.reasoning == ""


def test_context_full(tok):
    eng = FakeEngine(tok, tok.encode("aaaa bbbb cccc dddd eeee ffff gggg hhhh"))
    prompt = encode_chat_prompt(tok, "x", think="none")
    ctx = len(prompt) + 4
    _, fin = _run(eng, tokens=prompt, temperature=0, ctx=ctx)
    assert fin.finish_reason == "context"
    assert len(fin.tokens) == 5  # 4 evaluated tokens fill the context, the 5th is sampled from the last logits
    with pytest.raises(ContextOverflowError):
        list(generate(eng, tokens=prompt, ctx=len(prompt)))


def test_session_reuse_evaluates_only_new_tokens(tok):
    eng = FakeEngine(tok, tok.encode("reply") + [tok.eos])
    s = eng.session(ctx=512)
    p1 = encode_chat_prompt(tok, "first", think="none")
    fin1 = generate(eng, tokens=p1, temperature=0, session=s, stream=False)
    # EOS finish: every emitted token was evaluated (EOS itself never is)
    assert fin1.usage.cached_tokens == 0 and s.evals == len(p1) + len(fin1.tokens)
    p2 = p1 + list(fin1.tokens) + [tok.eos, tok.user] + tok.encode("second") + [tok.assistant, tok.think_end]
    before = s.evals
    fin2 = generate(eng, tokens=p2, temperature=0, session=s, stream=False)
    assert fin2.usage.cached_tokens == len(p1) + len(fin1.tokens)
    assert s.evals - before == len(p2) - fin2.usage.cached_tokens + len(fin2.tokens)
    assert s.syncs[-1] == p2
    # a prompt that is not an extension of the live tokens reuses nothing
    fin3 = generate(eng, tokens=p1[:5] + [7], temperature=0, session=s, stream=False)
    assert fin3.usage.cached_tokens == 0


def test_seeded_sampling_is_reproducible(tok):
    class FlatSession(FakeSession):
        logits = property(lambda self: np.zeros(tok.n_vocab, np.float32))

    class Flat(FakeEngine):
        def session(self, ctx):
            return FlatSession(self, ctx)

    eng = Flat(tok, [])
    a = generate(eng, prompt="x", max_tokens=20, seed=7, min_p=0.0, ctx=128, stream=False)
    b = generate(eng, prompt="x", max_tokens=20, seed=7, min_p=0.0, ctx=128, stream=False)
    c = generate(eng, prompt="x", max_tokens=20, seed=8, min_p=0.0, ctx=128, stream=False)
    assert a.tokens == b.tokens and a.tokens != c.tokens
    assert len(set(a.tokens)) > 5  # uniform over 512 tokens: 20 draws are almost surely varied


def test_logprobs(tok):
    eng = FakeEngine(tok, tok.encode("ab") + [tok.eos])
    evs, _ = _run(eng, prompt="x", temperature=0, logprobs=3, ctx=128)
    ev = evs[0]
    # logits are +20 for the scripted token, -20 for the other 511: p = 1 / (1 + 511 e^-40)
    assert ev.logprob == pytest.approx(-511 * np.exp(-40.0), abs=1e-12)
    assert len(ev.top_logprobs) == 3 and ev.top_logprobs[0].id == ev.token


@given(st.lists(st.integers(0, 255), max_size=40), st.lists(st.text(min_size=1, max_size=3), max_size=3))
def test_streamed_text_equals_final_text_with_stops(tok, data, stops):
    eng = FakeEngine(tok, _byte_ids(tok, bytes(data)) + [tok.eos])
    evs, fin = _run(eng, prompt="x", temperature=0, think="none", stop=stops, ctx=512)
    streamed = "".join(e.text for e in evs)
    assert streamed == fin.content
    whole = bytes(data).decode("utf-8", errors="replace")
    hits = [whole.find(s) for s in stops if s in whole]
    if fin.finish_reason == "stop":
        assert hits and whole[: min(hits)] == fin.content
    else:
        assert fin.finish_reason == "eos"
        assert not hits and fin.content == whole


# ---- tool calls: the DSML greedy rule and the "tool_calls" finish --------------------------------


class WeakSession(FakeSession):
    """Logits +20 on the scripted token at 'strong' positions, only +0.5 elsewhere (so sampling at
    T=1 almost never picks it there, while argmax always does)."""

    @property
    def logits(self):
        i = len(self.tokens) - self.base
        script, strong = self.engine.script, self.engine.strong
        nxt = script[i] if i < len(script) else self.engine.tokenizer.eos
        out = np.zeros(self.engine.tokenizer.n_vocab, dtype=np.float32)
        out[nxt] = 20.0 if (i >= len(script) or strong[i]) else 0.5
        return out


class WeakEngine(FakeEngine):
    def __init__(self, tokenizer, pieces):
        script, strong = [], []
        for text, is_strong in pieces:
            ids = tokenizer.encode_rendered(text)
            script += ids
            strong += [is_strong] * len(ids)
        super().__init__(tokenizer, script)
        self.strong = strong

    def session(self, ctx):
        return WeakSession(self, ctx)


def _tool_engine(tok):
    return WeakEngine(tok, [
        ("Sure.\n\n<｜DSML｜tool_calls>", True),
        ('\n<｜DSML｜invoke name="get">\n<｜DSML｜parameter name="q" string="true">', False),  # structural
        ("the body text", False),  # payload: sampled
        ("</｜DSML｜parameter>", True),
        ("\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", False),  # structural
        ("never reached", True),
    ])


def test_dsml_greedy_rule_and_tool_calls_finish(tok):
    tools = [{"type": "function", "function": {"name": "get", "parameters": {}}}]
    msgs = [{"role": "user", "content": "x"}]
    for seed in (1, 2):
        fin = generate(_tool_engine(tok), messages=msgs, tools=tools, think="none", seed=seed, ctx=4096,
                       stream=False)
        assert fin.finish_reason == "tool_calls"
        m = fin.message()
        assert m.ok and m.content == "Sure." and len(m.tool_calls) == 1
        assert m.tool_calls[0].name == "get"
        body = json.loads(m.tool_calls[0].arguments)["q"]
        assert body != "the body text"  # the payload was sampled, not forced
        assert fin.raw_text.endswith("</｜DSML｜tool_calls>")
    # without the rule, the weak structural tokens are sampled and the block falls apart
    fin = generate(_tool_engine(tok), messages=msgs, think="none", seed=1, ctx=4096, max_tokens=80, stream=False)
    assert fin.finish_reason != "tool_calls" and fin.message().tool_calls == ()


def test_raw_text_and_message_with_thinking_and_stop(tok):
    script = tok.encode("plan") + [tok.think_end] + tok.encode("answer STOP more") + [tok.eos]
    fin = generate(FakeEngine(tok, script), prompt="q", temperature=0, think="high", stop=["STOP"], ctx=256,
                   stream=False)
    assert fin.finish_reason == "stop"
    assert fin.raw_text == "plan</think>answer "
    assert fin.thinking and fin.message().reasoning == "plan" and fin.message().content == "answer "
