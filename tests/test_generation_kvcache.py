"""The disk KV cache inside generation: ``generate(kv_cache=...)`` on the compiled engine with the
tiny synthetic model, and ``ds4 generate`` / ``ds4 chat --kv-cache-dir`` across processes.

The cache knobs are lowered (min 32 tokens, align 16, trim 8, continued every 64) so prompts of a
few hundred tokens exercise every store kind; expected store positions are computed here by hand
from the policy of docs/runtime.md §7.3-7.4, not by the cache's own helpers.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ds4.testing
from ds4.chat import BOS, USER, encode_chat_prompt
from ds4.generation import build_prompt, generate, prompt_text
from ds4.kvcache import KVCache, read_cache_file
from _installed import installed_env

pytest.importorskip("ds4._core")
from ds4.engine import Engine  # noqa: E402  (needs the compiled core)

MIN, ALIGN, TRIM, EVERY = 32, 16, 8, 64
KNOBS = dict(min_tokens=MIN, boundary_align=ALIGN, boundary_trim=TRIM, continued_interval=EVERY, fsync=False)
CTX = 1024
PROMPT = "the quick brown fox jumps over the lazy dog " * 12
GREEDY = dict(max_tokens=24, temperature=0.0, ctx=CTX, stream=False)


@pytest.fixture(scope="module")
def model_path():
    return ds4.testing.default_model_path()


@pytest.fixture(scope="module")
def engine(model_path):
    return Engine(model_path, threads=1)


def cache(d, **kw) -> KVCache:
    return KVCache(d, **{**KNOBS, **kw})


class CountingSession:
    """A real session that records how many tokens each ``sync`` had to evaluate."""

    def __init__(self, session) -> None:
        self._s = session
        self.evaluated = 0

    def sync(self, tokens, progress=None):
        tokens = list(tokens)
        live = self._s.tokens
        keep = len(live) if tokens[: len(live)] == live else 0
        self.evaluated += len(tokens) - keep
        self._s.sync(tokens, progress=progress)

    def __getattr__(self, name):
        return getattr(self._s, name)


def files(d) -> dict[int, str]:
    """token count -> save reason of every cache file."""
    return {e.tokens: e.reason for e in KVCache(d, **KNOBS).entries()}


# ---- prompt text ---------------------------------------------------------------------------------

TEXT = st.lists(st.sampled_from(list("ab xyz.\n") + ["é", "🙂", USER, "<think>"]), max_size=30).map("".join)


@given(prompt=TEXT, system=st.sampled_from([None, "", "Be brief.", "sys <｜Assistant｜> text"]),
       think=st.sampled_from(["none", "high", "max"]), raw=st.booleans(), rendered=st.booleans())
def test_prompt_text_is_the_bytes_of_the_built_prompt(engine, prompt, system, think, raw, rendered):
    tok = engine.tokenizer
    if rendered:
        prompt = BOS + prompt
    for ctx in (CTX, 400_000):  # think max is gated on the context
        ids = build_prompt(tok, prompt, system=system, think=think, ctx=ctx, raw=raw)
        assert tok.decode_bytes(ids) == prompt_text(prompt, system=system, think=think, ctx=ctx, raw=raw).encode()


def test_prompt_text_of_messages_is_the_rendered_chat(engine):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"}, {"role": "user", "content": "more"}]
    ids = build_prompt(engine.tokenizer, messages=msgs, think="high", ctx=CTX)
    assert engine.tokenizer.decode_bytes(ids) == prompt_text(messages=msgs, think="high", ctx=CTX).encode()


# ---- Engine.generate(kv_cache=...) -----------------------------------------------------------------

def test_cold_then_hit_matches_no_cache_and_evaluates_only_the_suffix(engine, tmp_path):
    ref = engine.generate(prompt=PROMPT, **GREEDY)
    P = ref.usage.prompt_tokens
    assert P > 2 * EVERY + MIN and ref.finish_reason == "length"  # the store positions below need both

    s1 = CountingSession(engine.session(ctx=CTX))
    cold = engine.generate(prompt=PROMPT, kv_cache=cache(tmp_path), session=s1, **GREEDY)
    assert cold.tokens == ref.tokens and cold.usage == ref.usage and cold.cache_source == ""
    assert s1.evaluated == P

    cold_len = (P - TRIM) // ALIGN * ALIGN  # no chat anchor >= MIN: trimmed and aligned down
    last = P + len(ref.tokens) - 1  # the session never evaluates the last sampled token
    want = {n: "continued" for n in range(EVERY, last + 1, EVERY)}
    want[cold_len] = "cold"
    assert files(tmp_path) == want

    s2 = CountingSession(engine.session(ctx=CTX))
    hit = engine.generate(prompt=PROMPT, kv_cache=cache(tmp_path), session=s2, **GREEDY)
    assert hit.tokens == ref.tokens and hit.text == ref.text
    assert hit.usage.cached_tokens == cold_len and hit.cache_source == "disk"
    assert s2.evaluated == P - cold_len
    assert s2.tokens[:P] == build_prompt(engine.tokenizer, PROMPT, ctx=CTX)


def test_whole_prompt_restored_evaluates_nothing(engine, tmp_path):
    ref = engine.generate(prompt=PROMPT, **GREEDY)
    P = ref.usage.prompt_tokens
    kw = dict(KNOBS, boundary_align=4096)  # trimmed and aligned below MIN: the cold store is the whole prompt
    engine.generate(prompt=PROMPT, kv_cache=KVCache(tmp_path, **kw), **GREEDY)
    s = CountingSession(engine.session(ctx=CTX))
    hit = engine.generate(prompt=PROMPT, kv_cache=KVCache(tmp_path, **kw), session=s, **GREEDY)
    assert hit.usage.cached_tokens == P and s.evaluated == 0  # the logits came with the payload
    assert hit.tokens == ref.tokens


def test_sampled_generation_is_the_same_with_a_cache(engine, tmp_path):
    kw = dict(prompt=PROMPT, max_tokens=16, temperature=0.8, seed=7, ctx=CTX, stream=False)
    ref = engine.generate(**kw)
    for _ in range(2):  # a miss, then a hit
        got = engine.generate(kv_cache=cache(tmp_path), **kw)
        assert got.tokens == ref.tokens
    assert got.usage.cached_tokens > 0


def test_tokens_prompt_uses_exact_token_prefixes(engine, tmp_path):
    ids = build_prompt(engine.tokenizer, PROMPT, ctx=CTX)
    ref = engine.generate(tokens=ids, **GREEDY)
    engine.generate(tokens=ids, kv_cache=cache(tmp_path), **GREEDY)
    longer = ids[:-2] + engine.tokenizer.encode(" and a cat") + ids[-2:]
    hit = engine.generate(tokens=longer, kv_cache=cache(tmp_path), **GREEDY)
    assert hit.cache_source == "disk" and hit.usage.cached_tokens == (len(ids) - TRIM) // ALIGN * ALIGN
    assert hit.tokens == engine.generate(tokens=longer, **GREEDY).tokens
    again = engine.generate(tokens=ids, kv_cache=cache(tmp_path), **GREEDY)
    assert again.tokens == ref.tokens


def test_cold_store_at_the_chat_anchor(engine, tmp_path):
    system = "You answer questions about foxes and dogs. " * 8
    ids = build_prompt(engine.tokenizer, "what does the fox say?", system=system, ctx=CTX)
    anchor = ids.index(engine.tokenizer.special.user)  # the only User marker: ends the system part
    assert anchor >= MIN
    engine.generate(prompt="what does the fox say?", system=system, kv_cache=cache(tmp_path, continued_interval=0),
                    **GREEDY)
    assert files(tmp_path) == {anchor: "cold"}
    # another question with the same system prompt restores the system part
    other = engine.generate(prompt="and the dog?", system=system, kv_cache=cache(tmp_path), **GREEDY)
    assert other.cache_source == "disk" and other.usage.cached_tokens == anchor
    assert other.tokens == engine.generate(prompt="and the dog?", system=system, **GREEDY).tokens


def test_evict_before_an_unrelated_prompt_and_memory_reuse(engine, tmp_path):
    kv = cache(tmp_path, continued_interval=0, cold_max_tokens=0)  # only evict stores
    s = engine.session(ctx=CTX)
    first = engine.generate(prompt=PROMPT, session=s, kv_cache=kv, **{**GREEDY, "max_tokens": 1})
    held = s.pos
    assert held == first.usage.prompt_tokens  # one token sampled, none evaluated
    # a rendered prompt that extends the live session's text reuses it in memory (no store)
    cont = engine.generate(prompt=prompt_text(PROMPT, ctx=CTX) + " more words", session=s, kv_cache=kv, **GREEDY)
    assert cont.cache_source == "memory" and cont.usage.cached_tokens == held
    assert cont.tokens == engine.generate(prompt=prompt_text(PROMPT, ctx=CTX) + " more words", **GREEDY).tokens
    # a token prompt that extends the live tokens too
    live = s.tokens
    got = engine.generate(tokens=live + engine.tokenizer.encode(" and more"), session=s, kv_cache=kv, **GREEDY)
    assert got.cache_source == "memory" and got.usage.cached_tokens == len(live)
    assert files(tmp_path) == {}
    held = s.pos
    # an unrelated prompt replaces the session: its state is stored first
    other = engine.generate(prompt="something else entirely " * 6, session=s, kv_cache=kv, **GREEDY)
    assert other.usage.cached_tokens == 0
    assert files(tmp_path) == {held: "evict"}


def test_shutdown_store_keeps_the_live_session(engine, tmp_path):
    kv = cache(tmp_path, continued_interval=0, cold_max_tokens=0)
    s = engine.session(ctx=CTX)
    engine.generate(prompt=PROMPT, session=s, kv_cache=kv, **GREEDY)
    entry = kv.shutdown(s, engine)
    assert entry is not None and files(tmp_path) == {s.pos: "shutdown"}
    assert read_cache_file(entry).text == engine.tokenizer.decode_bytes(s.tokens)


def test_corrupt_files_are_skipped_with_a_warning(engine, tmp_path, caplog):
    ref = engine.generate(prompt=PROMPT, **GREEDY)
    engine.generate(prompt=PROMPT, kv_cache=cache(tmp_path, continued_interval=0), **GREEDY)
    [cold] = list(tmp_path.glob("*.kv"))
    data = bytearray(cold.read_bytes())
    data[60] ^= 0xFF  # inside the cached text: its SHA-1 no longer matches the name
    cold.write_bytes(bytes(data))
    (tmp_path / ("0" * 40 + ".kv")).write_bytes(b"KVC\x01 not a cache file")
    caplog.set_level(logging.WARNING, logger="ds4.kvcache")
    got = engine.generate(prompt=PROMPT, kv_cache=cache(tmp_path, continued_interval=0), **GREEDY)
    assert got.tokens == ref.tokens and got.usage.cached_tokens == 0
    text = caplog.text
    assert "corrupt" in text and str(cold) in text
    assert "invalid file" in text and "0" * 40 in text
    # the corrupt file was replaced by a good cold store that the next run restores
    hit = engine.generate(prompt=PROMPT, kv_cache=cache(tmp_path), **GREEDY)
    assert hit.cache_source == "disk" and hit.tokens == ref.tokens


def test_store_failures_never_lose_output(engine, tmp_path, caplog):
    d = tmp_path / "kv"
    kv = cache(d)
    d.rmdir()
    d.write_bytes(b"")  # the directory is gone and a file is in its way: every store fails
    caplog.set_level(logging.WARNING, logger="ds4.kvcache")
    got = engine.generate(prompt=PROMPT, kv_cache=kv, **GREEDY)
    assert got.tokens == engine.generate(prompt=PROMPT, **GREEDY).tokens
    assert "store failed" in caplog.text


# ---- the CLI across processes ---------------------------------------------------------------------

def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = installed_env()
    return subprocess.run([sys.executable, "-m", "ds4.cli", *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=120)


def kv_flags(d, every: int = EVERY) -> list[str]:
    return ["--kv-cache-dir", str(d), "--kv-cache-min-tokens", str(MIN), "--kv-cache-boundary-align-tokens",
            str(ALIGN), "--kv-cache-boundary-trim-tokens", str(TRIM),
            "--kv-cache-continued-interval-tokens", str(every)]


def test_cli_generate_second_process_skips_the_cached_prefill(engine, model_path, tmp_path):
    args = ["generate", "-m", str(model_path), "-t", "1", "-c", str(CTX), "-p", PROMPT, "-n", "24", "--temp", "0",
            *kv_flags(tmp_path)]
    first = cli(*args)
    assert first.returncode == 0, first.stderr
    assert "restored from disk" not in first.stderr
    P = len(build_prompt(engine.tokenizer, PROMPT, ctx=CTX))
    second = cli(*args)
    assert second.returncode == 0, second.stderr
    m = re.search(r"kv cache: (\d+) of (\d+) prompt tokens restored from disk", second.stderr)
    assert m and int(m.group(1)) == (P - TRIM) // ALIGN * ALIGN and int(m.group(2)) == P
    assert second.stdout == first.stdout
    ref = engine.generate(prompt=PROMPT, **GREEDY)
    assert first.stdout == ref.text + "\n"
    # the clean exit stored the final state (prompt + all generated tokens but the last)
    assert files(tmp_path)[P + len(ref.tokens) - 1] == "shutdown"


def test_cli_chat_restores_and_stores_on_exit(engine, model_path, tmp_path):
    args = ["chat", "-m", str(model_path), "-t", "1", "-c", str(CTX), "-n", "12", "--temp", "0",
            *kv_flags(tmp_path, every=0)]
    line = PROMPT + "\n"
    P = len(encode_chat_prompt(engine.tokenizer, PROMPT))  # the first turn's transcript
    cold_len = (P - TRIM) // ALIGN * ALIGN
    first = cli(*args, stdin=line)
    assert first.returncode == 0, first.stderr
    ref = engine.generate(prompt=PROMPT, **{**GREEDY, "max_tokens": 12})
    end = P + len(ref.tokens) - 1  # the live session at exit: the transcript but the last token
    assert f"kv cache: saved {end} tokens" in first.stderr
    assert files(tmp_path) == {cold_len: "cold", end: "shutdown"}
    second = cli(*args, stdin=line)
    assert second.returncode == 0, second.stderr
    assert f"kv cache: {cold_len} of {P} prompt tokens restored from disk" in second.stderr
    assert second.stdout == first.stdout


def test_cli_unusable_cache_dir_is_a_clear_error(model_path, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = cli("generate", "-m", str(model_path), "-p", "hi", "-n", "2", "--kv-cache-dir", str(blocker / "kv"))
    assert r.returncode == 2 and r.stdout == ""
    assert "cannot create KV cache directory" in r.stderr and str(blocker / "kv") in r.stderr


def test_cli_reference_and_cache_are_rejected(model_path, tmp_path):
    r = cli("generate", "--reference", "-m", str(model_path), "-p", "hi", "--kv-cache-dir", str(tmp_path))
    assert r.returncode == 2 and "--reference" in r.stderr


# ---- call-time errors and the tool-call rule ----------------------------------------------------

def test_prompt_errors_are_raised_at_call_time(engine, tmp_path):
    from ds4.errors import ContextOverflowError, InvalidArgumentError

    with pytest.raises(ContextOverflowError):
        engine.generate(prompt=PROMPT, kv_cache=cache(tmp_path), ctx=64)
    with pytest.raises(InvalidArgumentError):
        engine.generate(prompt="", raw=True, kv_cache=cache(tmp_path), ctx=64)
    with pytest.raises(InvalidArgumentError):
        engine.generate(tokens=[], kv_cache=cache(tmp_path), ctx=64)


class ScriptedSession:
    """A real session (so it can be stored) whose logits pick ``script`` after the prompt."""

    def __init__(self, session, prompt_len: int, script: list[int]) -> None:
        self._s, self._base, self._script = session, prompt_len, script
        self._logits = np.full(session.engine.shape.n_vocab, -20.0, dtype=np.float32)

    @property
    def logits(self):
        self._logits.fill(-20.0)
        self._logits[self._script[self._s.pos - self._base]] = 20.0
        return self._logits

    def __getattr__(self, name):
        return getattr(self._s, name)


def test_no_continued_store_inside_or_after_a_tool_block(engine, tmp_path):
    tok = engine.tokenizer
    ids = build_prompt(tok, PROMPT, think="none", ctx=CTX)
    P = len(ids)
    script = tok.encode_rendered("hello there friend " * 4 + "\n\n<｜DSML｜tool_calls>\n" + "x y " * 30)
    marker_at = next(k for k in range(len(script))
                     if "<｜DSML｜tool_calls>".encode() in tok.decode_bytes(script[: k + 1]))
    n = len(script) - 1
    every = 16
    assert P + marker_at + 2 * every < P + n  # the script runs well past the block start
    s = ScriptedSession(engine.session(ctx=CTX), P, script)
    kv = cache(tmp_path, continued_interval=every, cold_max_tokens=0)
    fin = generate(engine, prompt=PROMPT, think="none", session=s, kv_cache=kv, dsml=True, max_tokens=n,
                   temperature=0.0, stream=False)
    assert list(fin.tokens) == script[:n]
    # checks run at the top of every decode step, at positions P .. P + n - 1; once the marker is
    # out (after step marker_at) none may store
    want = {m: "continued" for m in range(every, P + marker_at + 1, every) if m >= MIN}
    assert files(tmp_path) == want
    # without the tool rule the same run stores past the marker too
    kv2 = cache(tmp_path / "plain", continued_interval=every, cold_max_tokens=0)
    s2 = ScriptedSession(engine.session(ctx=CTX), P, script)
    generate(engine, prompt=PROMPT, think="none", session=s2, kv_cache=kv2, dsml=False, max_tokens=n,
             temperature=0.0, stream=False)
    assert max(files(tmp_path / "plain")) > P + marker_at


def test_chat_repl_stores_evict_before_ctx_change_and_shutdown_on_quit(engine, model_path, tmp_path):
    import io

    from ds4.cli import build_parser
    from ds4.commands.chat import ChatRepl
    from ds4.kvcache import from_args

    args = build_parser().parse_args(["chat", "-m", str(model_path), "-c", str(CTX), "-n", "8", "--temp", "0",
                                      *kv_flags(tmp_path, every=0), "--kv-cache-cold-max-tokens", "0"])
    out, err = io.StringIO(), io.StringIO()
    repl = ChatRepl(engine, args, out, err, kv_cache=from_args(args))
    # /ctx with the same size still drops the session; the next turn gets it back from the evict file
    repl.loop(io.StringIO(PROMPT + "\n/ctx " + str(CTX) + "\nhi again\n/quit\n"))
    first_turn = len(encode_chat_prompt(engine.tokenizer, PROMPT)) + 8 - 1
    assert files(tmp_path) == {first_turn: "evict", repl.session.pos: "shutdown"}
    assert re.search(rf"kv cache: {first_turn} of \d+ prompt tokens restored from disk", err.getvalue())
    assert f"kv cache: saved {repl.session.pos} tokens" in err.getvalue()
