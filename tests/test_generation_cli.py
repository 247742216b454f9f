"""End-to-end generation on the tiny synthetic model through the numpy reference model (the
compiled engine's own tests cover it), and the ``ds4 generate`` / ``ds4 chat`` commands."""

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
    assert out == fin.content + "\n"  # not a TTY: no colour codes
    assert "ds4: prefill:" in err and "generation:" in err
    assert f"finish: {fin.finish_reason}" in err


def test_cli_generate_missing_model(capsys, tmp_path):
    rc = main(["generate", "--reference", "-m", str(tmp_path / "nope.gguf"), "-p", "x"])
    assert rc != 0
    assert "nope.gguf" in capsys.readouterr().err


def _args(**kw):
    base = dict(model=None, ctx=128, system="You are a helpful assistant", max_tokens=2, temp=0.0, top_k=0,
                top_p=1.0, min_p=0.05, seed=1, think="none", reference=True, progress=False)
    base.update(kw)
    return argparse.Namespace(**base)


def test_chat_repl_reuses_session(engine, tmp_path):
    out, err = io.StringIO(), io.StringIO()
    repl = ChatRepl(engine, _args(), out=out, err=err)
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


def test_chat_think_max_gating(engine):
    err = io.StringIO()
    repl = ChatRepl(engine, _args(), out=io.StringIO(), err=err)
    repl.command("/think-max")
    assert "Thinking mode: high (ctx below 393216)" in err.getvalue()
