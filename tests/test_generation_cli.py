"""End-to-end generation on the tiny synthetic model, and the ``ds4 generate`` / ``ds4 chat``
commands, on the compiled engine (what users run) and on the numpy reference model."""

from __future__ import annotations

import argparse
import io

import numpy as np
import pytest

import ds4.testing
from ds4.chat import encode_chat_prompt
from ds4.cli import main
from ds4.commands.chat import ChatRepl
from ds4.commands.generate import ReferenceEngine
from ds4.generation import generate
from ds4.reference import ReferenceModel


@pytest.fixture(scope="module")
def model_path():
    return ds4.testing.default_model_path()


@pytest.fixture(scope="module")
def engine(model_path):
    return ReferenceEngine(model_path)


def test_greedy_generation_matches_manual_argmax_loop(engine, model_path):
    prompt = encode_chat_prompt(engine.tokenizer, "Hi", think="none")
    fin = generate(engine, tokens=prompt, max_tokens=4, temperature=0, ctx=128, stream=False)
    # independent loop straight on the reference model
    m = ReferenceModel(model_path)
    st = m.new_state(128)
    logits = m.prefill(st, prompt)
    expected = []
    for _ in range(4):
        t = int(np.argmax(logits))
        if t == engine.tokenizer.eos:
            break
        expected.append(t)
        logits = m.decode(st, t)
    assert list(fin.tokens) == expected
    assert fin.finish_reason == ("length" if len(expected) == 4 else "eos")
    assert fin.content == engine.tokenizer.decode(expected)


def test_cli_generate(capsys, engine):
    rc = main(["generate", "--reference", "-p", "Hello", "-n", "3", "--temp", "0", "--ctx", "128", "--nothink"])
    assert rc == 0
    out, err = capsys.readouterr()
    fin = generate(engine, prompt="Hello", max_tokens=3, temperature=0, ctx=128, think="none", stream=False)
    assert fin.content and not fin.content.endswith("\n")  # the case this test pins
    assert out == fin.content + "\n"  # not a TTY: no colour codes; the line is closed
    assert "ds4: prefill:" in err and "generation:" in err
    assert f"finish: {fin.finish_reason}" in err


def test_cli_generate_missing_model(capsys, tmp_path):
    rc = main(["generate", "--reference", "-m", str(tmp_path / "nope.gguf"), "-p", "x"])
    assert rc != 0
    assert "nope.gguf" in capsys.readouterr().err


def _args(**kw):
    base = dict(model=None, ctx=128, system="You are a helpful assistant", max_tokens=2, temp=0.0, top_k=0,
                top_p=1.0, min_p=0.05, seed=1, think="none", reference=True, progress=False, threads=None)
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.fixture(params=["engine", "reference"])
def repl_engine(request, model_path):
    """The REPL runs on the compiled engine (what users get) and on the numpy reference."""
    if request.param == "reference":
        return request.getfixturevalue("engine"), True
    return request.getfixturevalue("core_engine"), False


def test_chat_repl_reuses_session(repl_engine, tmp_path):
    engine, reference = repl_engine
    out, err = io.StringIO(), io.StringIO()
    repl = ChatRepl(engine, _args(reference=reference), out=out, err=err)
    tok = engine.tokenizer
    f1 = repl.turn("hi")
    assert f1.usage.cached_tokens == 0
    t1 = list(repl.transcript)
    assert t1[-1] == tok.eos
    f2 = repl.turn("more")
    # the second turn reuses every token the session had evaluated
    assert f2.usage.cached_tokens >= len(t1) - 2
    assert repl.transcript[: len(t1)] == t1
    (tmp_path / "msg.txt").write_text("from a file", encoding="utf-8")
    script = io.StringIO("/nothink\n/read " + str(tmp_path / "msg.txt") + "\n/ctx 64\n/bogus\n/quit\nnot reached\n")
    assert repl.loop(script) == 0
    assert "Thinking mode: none" in err.getvalue()
    assert "unknown command /bogus" in err.getvalue()
    assert repl.ctx == 64
    assert tok.encode("from a file")[0] in repl.transcript


def test_chat_think_max_gating(repl_engine):
    engine, reference = repl_engine
    err = io.StringIO()
    repl = ChatRepl(engine, _args(reference=reference), out=io.StringIO(), err=err)
    repl.command("/think-max")
    assert "Thinking mode: high (ctx below 393216)" in err.getvalue()


# ---- the compiled engine (ds4.Engine) ----------------------------------------------------------


@pytest.fixture(scope="module")
def core_engine(model_path):
    try:
        import ds4
        return ds4.Engine(model_path, threads=1)
    except ImportError as e:  # the C++ core is not built in this checkout
        pytest.skip(f"ds4._core not available: {e}")


def test_engine_generate_matches_manual_session_loop(core_engine):
    tok = core_engine.tokenizer
    prompt = encode_chat_prompt(tok, "Tell me", think="high")
    fin = core_engine.generate(tokens=prompt, max_tokens=6, temperature=0, ctx=128, stream=False)
    s = core_engine.session(ctx=128)
    s.sync(prompt)
    expected = []
    for _ in range(6):
        t = int(np.argmax(s.logits))
        if t == tok.eos:
            break
        expected.append(t)
        s.eval(t)
    assert list(fin.tokens) == expected
    # seeded sampling through the engine is reproducible
    a = core_engine.generate(tokens=prompt, max_tokens=6, seed=11, ctx=128, stream=False)
    b = core_engine.generate(tokens=prompt, max_tokens=6, seed=11, ctx=128, stream=False)
    assert a.tokens == b.tokens


def test_engine_cli_and_chat(core_engine, capsys):
    assert main(["generate", "-p", "Hi", "-n", "4", "--temp", "0", "--ctx", "128", "-t", "1"]) == 0
    out, err = capsys.readouterr()
    assert "ds4: prefill:" in err
    repl = ChatRepl(core_engine, _args(reference=False), out=io.StringIO(), err=io.StringIO())
    repl.turn("one")
    n_live = len(repl.transcript)
    f2 = repl.turn("two")
    assert f2.usage.cached_tokens >= n_live - 2  # only the new turn (and the unevaluated tail) is prefilled


def test_progress_bar_and_printer():
    from ds4.commands.generate import ProgressBar, StreamPrinter

    err = io.StringIO()
    bar = ProgressBar(err, enabled=True, min_total=10)
    bar(5, 5)  # short prompts draw nothing
    assert err.getvalue() == ""
    bar(50, 100)
    bar(100, 100)  # the final update is always drawn
    assert "50/100 tokens" in err.getvalue() and "100/100 tokens" in err.getvalue()
    bar.close()
    assert err.getvalue().endswith("\r")

    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    pr = StreamPrinter(out)
    pr.write("think", "reasoning")
    pr.write("answer", "content")
    pr.end()
    assert out.getvalue() == "\x1b[2mthink\x1b[0manswer\n"
    pr.end()  # a second end adds nothing
    assert out.getvalue() == "\x1b[2mthink\x1b[0manswer\n"


def test_printer_closes_the_line_once_like_upstream():
    from ds4.commands.generate import StreamPrinter

    for pieces, expected in [([], ""), (["a"], "a\n"), (["a\n"], "a\n"), (["a\n", "b"], "a\nb\n"),
                             (["x", ""], "x\n")]:
        out = io.StringIO()
        pr = StreamPrinter(out)
        for p in pieces:
            pr.write(p, "content")
        pr.end()
        assert out.getvalue() == expected, pieces


def test_cli_generate_error_mid_stream_starts_stderr_on_a_new_line(capsys, monkeypatch):
    import ds4.generation as G
    from ds4.errors import ContextOverflowError

    def failing(*args, **kwargs):
        yield G.TokenEvent(token=1, text="partial", channel="content")
        raise ContextOverflowError("context full")

    monkeypatch.setattr(G, "generate", failing)
    rc = main(["generate", "--reference", "-p", "Hello", "-n", "3", "--temp", "0", "--ctx", "128", "--nothink"])
    out, err = capsys.readouterr()
    assert rc != 0 and "context full" in err
    assert out == "partial\n"


def test_cli_dump_tokens(capsys, engine):
    assert main(["generate", "-p", "Hi you", "--nothink", "--dump-tokens"]) == 0
    out = capsys.readouterr().out.splitlines()
    ids = encode_chat_prompt(engine.tokenizer, "Hi you", think="none")
    assert out[0] == "[" + ", ".join(map(str, ids)) + "]"
    assert out[1] == f"{ids[0]:6d}  <｜begin▁of▁sentence｜>"
    assert len(out) == len(ids) + 1


def test_prompt_too_long_fails_at_call_time(engine):
    from ds4.errors import ContextOverflowError

    with pytest.raises(ContextOverflowError, match="context holds 5"):
        generate(engine, prompt="x", ctx=5)  # raised before any iteration


def test_cli_dump_logprobs(tmp_path, engine, capsys):
    import json

    out = tmp_path / "lp.json"
    assert main(["generate", "--reference", "-p", "Hi", "--nothink", "-n", "3", "--ctx", "128",
                 "--dump-logprobs", str(out), "--logprobs-top-k", "4"]) == 0
    d = json.loads(out.read_text(encoding="utf-8"))
    assert d["source"] == "ds4" and d["top_k"] == 4 and d["ctx"] == 128
    fin = generate(engine, prompt="Hi", think="none", max_tokens=3, temperature=0, ctx=128, stream=False)
    assert d["prompt_tokens"] == fin.usage.prompt_tokens
    assert [s["selected"]["id"] for s in d["steps"]] == list(fin.tokens)[: len(d["steps"])]
    for s in d["steps"]:
        tops = s["top_logprobs"]
        assert len(tops) == 4 and tops[0]["token"]["id"] == s["selected"]["id"]
        assert all(a["logprob"] >= b["logprob"] for a, b in zip(tops, tops[1:]))
        assert bytes(s["selected"]["bytes"]) == engine.tokenizer.token_to_bytes(s["selected"]["id"])


def test_json_token_text_escapes():
    from ds4.commands.generate import _json_token_text

    assert _json_token_text(b'a"\\\n\t\x01') == '"a\\"\\\\\\n\\t\\u0001"'
    assert _json_token_text("é".encode()) == '"é"'  # valid UTF-8 stays as is
    assert _json_token_text(b"\xc3") == '"\\u00c3"'  # a cut character: bytes escaped
