"""ds4.KVCache policy with engine-free fakes (tests/kvcache_fakes.py): lookup, stores, eviction,
corruption handling. Expected values come from docs/runtime.md §7 (numbers quoted next to them)."""

from __future__ import annotations

import errno
import logging
import math
import os
import struct

import pytest
from hypothesis import given, settings, strategies as st

import kvcache_fakes as fk
from ds4 import kvcache_format as fmt
from ds4.errors import CacheFormatError, Ds4IOError, InvalidArgumentError
from ds4.kvcache import MiB, KVCache, eviction_score


def make(tmp_path, **kw):
    kw.setdefault("min_tokens", 8)
    return KVCache(tmp_path / "kv", **kw)


def stored(cache, eng, text, ctx=4096, reason="cold", **kw):
    s = eng.session(ctx=ctx)
    s.sync(eng.tokenizer.encode_rendered(text))
    entry = cache.store(s, reason, eng, **kw)
    assert entry is not None
    return entry


# ---------------------------------------------------------------- defaults and helpers (§7.3, §7.7)

def test_defaults_are_upstream(tmp_path):
    c = KVCache(tmp_path / "kv")
    assert (c.max_bytes, c.min_tokens, c.cold_max_tokens, c.continued_interval, c.boundary_trim,
            c.boundary_align, c.reject_different_quant) == (4096 * MiB, 512, 30000, 10000, 32, 2048, False)
    assert KVCache(tmp_path / "kv2", max_bytes=0).max_bytes == 4096 * MiB   # 0 -> default, as upstream
    assert oct((tmp_path / "kv").stat().st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("kw", [dict(min_tokens=0), dict(cold_max_tokens=100), dict(boundary_trim=-1),
                                dict(boundary_align=-2), dict(continued_interval=-1), dict(max_bytes=-1)])
def test_invalid_options(tmp_path, kw):
    with pytest.raises(InvalidArgumentError):
        KVCache(tmp_path / "kv", **kw)


def test_store_len_examples():
    c = KVCache.__new__(KVCache)
    c.min_tokens, c.boundary_trim, c.boundary_align = 512, 32, 2048
    # tokens > min + trim: stable = tokens - trim aligned down to 2048, kept if >= min.
    assert c.store_len(5000) == 4096
    assert c.store_len(2080) == 2048
    assert c.store_len(2079) == 2079        # 2047 aligns to 0 < min: unchanged
    assert c.store_len(544) == 544          # not > min + trim
    c.boundary_align = 0
    assert c.store_len(1000) == 968


def test_continued_step_and_targets(tmp_path):
    c = make(tmp_path, min_tokens=512)
    assert c.continued_step() == 10240      # spec: 10000 -> 10240
    assert c.continued_target(10240) == 10240
    assert c.continued_target(10241) == 0
    c.note_store(10240)
    assert c.continued_target(10240) == 0 and c.continued_target(20480) == 20480
    assert make(tmp_path, continued_interval=0).continued_step() == 0
    assert make(tmp_path, boundary_align=0, continued_interval=100).continued_step() == 100


def test_chat_anchor(tmp_path):
    c = make(tmp_path, min_tokens=4)
    tok = fk.ByteTokenizer()
    u, a = 256, 257
    # last User before the first Assistant
    toks = [258, 1, 2, 3, 4, u, 5, 6, u, 7, a, 8, u, 9]
    assert c.chat_anchor(toks, tok) == 8
    assert c.chat_anchor([258, u, 1, a], tok) == -1           # anchor 1 < min_tokens
    assert c.chat_anchor([1, 2, 3, 4, 5], tok) == -1


# ---------------------------------------------------------------- store / lookup round trip

def test_store_then_prepare_restores_and_evaluates_only_suffix(tmp_path):
    eng = fk.FakeEngine()
    cache = make(tmp_path)
    base = fk.text_of(300, seed=3)
    entry = stored(cache, eng, base)
    assert entry.tokens == 300 and entry.reason == "cold"

    s = eng.session(ctx=4096)
    prompt = base + "qqq more text"
    eng.tokenizer.calls.clear()
    prepared = cache.prepare(s, prompt, eng)
    assert prepared.source == "disk" and prepared.cached_tokens == 300
    assert eng.tokenizer.calls == ["qqq more text"]            # only the suffix was tokenized
    assert prepared.tokens == eng.tokenizer.encode_rendered(prompt)
    assert s.loads == 1 and s.evaluated == 0
    cache.sync(s, prepared, eng)
    assert s.evaluated == len("qqq more text")
    assert s.tokens == prepared.tokens
    # hit count and last-used were updated in place
    again = cache.lookup(prompt, ctx=4096)
    assert again.sha == entry.sha and again.hits == 1 and again.last_used >= entry.last_used


def test_token_mode_keeps_tokens_exact(tmp_path, caplog):
    eng = fk.FakeEngine()
    cache = make(tmp_path)
    tok = eng.tokenizer
    text = fk.text_of(100, seed=50) + "ab"               # "ab" tokenizes to the merged id 259
    entry = stored(cache, eng, text)
    stored_tokens = tok.encode_rendered(text)
    assert stored_tokens[-1] == 259 and entry.tokens == 101
    tok.calls.clear()
    prompt = stored_tokens + [1, 2]
    prepared = cache.prepare(eng.session(), prompt, eng)
    assert prepared.source == "disk" and prepared.cached_tokens == 101 and prepared.tokens == prompt
    assert tok.calls == []                                # nothing was (re-)tokenized
    # the same bytes spelled with other tokens: the file matches by text, not by tokens
    respelled = stored_tokens[:-1] + [ord("a"), ord("b"), 5]
    assert tok.decode_bytes(respelled).startswith(text.encode())
    s = eng.session()
    p2 = cache.prepare(s, respelled, eng)
    assert p2.source == "cold" and p2.tokens == respelled and s.loads == 0
    # ... whereas text mode takes it and tokenizes the text suffix
    p3 = cache.prepare(eng.session(), text + "\x05", eng)
    assert p3.source == "disk" and p3.tokens == stored_tokens + [5]
    live = eng.session()
    live.sync(stored_tokens)
    assert cache.prepare(live, stored_tokens + [7], eng).source == "memory"


def test_memory_reuse_needs_no_disk(tmp_path):
    eng = fk.FakeEngine()
    cache = make(tmp_path)
    s = eng.session()
    p1 = fk.text_of(50, seed=4)
    s.sync(eng.tokenizer.encode_rendered(p1))
    prepared = cache.prepare(s, p1 + " next", eng)
    assert prepared.source == "memory" and prepared.cached_tokens == 50
    assert cache.entries() == []


def test_prepare_stores_evict_before_replacing_live_state(tmp_path):
    eng = fk.FakeEngine()
    cache = make(tmp_path)
    s = eng.session()
    p1 = fk.text_of(50, seed=5)
    s.sync(eng.tokenizer.encode_rendered(p1))
    prepared = cache.prepare(s, fk.text_of(60, seed=6), eng)
    assert prepared.source == "cold"
    [e] = cache.entries()
    assert e.reason == "evict" and e.tokens == 50


def test_longest_prefix_wins_among_many(tmp_path):
    eng = fk.FakeEngine()
    cache = make(tmp_path)
    full = fk.text_of(400, seed=7)
    for n in (20, 100, 250, 399):
        stored(cache, eng, full[:n])
    for other in range(5):      # unrelated files must not match
        stored(cache, eng, fk.text_of(300, seed=100 + other))
    stored(cache, eng, full[:150] + "X" * 200)  # diverges after 150 bytes: longer but not a prefix
    for prompt_len, want in ((400, 399), (399, 399), (398, 250), (250, 250), (120, 100), (19, None)):
        best = cache.lookup(full[:prompt_len], ctx=4096)
        assert (best.text_bytes if best else None) == want, prompt_len
    s = eng.session()
    prepared = cache.prepare(s, full + "tail", eng)
    assert prepared.cached_tokens == 399 and prepared.entry.text_bytes == 399


def test_ctx_min_tokens_and_quant_filters(tmp_path):
    eng2, eng4 = fk.FakeEngine(routed_bits=2), fk.FakeEngine(routed_bits=4)
    text = fk.text_of(100, seed=8)
    cache = make(tmp_path)
    stored(cache, eng4, text, ctx=2048)
    assert cache.lookup(text, ctx=1024) is None                 # file ctx > session ctx
    assert cache.lookup(text, ctx=2048) is not None
    assert cache.lookup(text, ctx=2048, quant_bits=2) is not None   # cross-quant allowed by default
    strict = make(tmp_path, reject_different_quant=True)
    assert strict.lookup(text, ctx=2048, quant_bits=2) is None
    assert strict.lookup(text, ctx=2048, quant_bits=4) is not None
    assert make(tmp_path, min_tokens=101).lookup(text, ctx=4096) is None
    # a 2-bit session can restore a 4-bit file (payload is the same layout)
    s = eng2.session(ctx=2048)
    assert cache.prepare(s, text + "z", eng2).source == "disk"


def test_store_skips_below_min_and_over_budget(tmp_path, caplog):
    eng = fk.FakeEngine()
    cache = make(tmp_path, min_tokens=64)
    s = eng.session()
    s.sync(eng.tokenizer.encode_rendered(fk.text_of(63)))
    assert cache.store(s, "cold", eng) is None
    tiny = make(tmp_path, max_bytes=1000)
    s.sync(eng.tokenizer.encode_rendered(fk.text_of(100)))
    with caplog.at_level(logging.INFO, logger="ds4.kvcache"):
        assert tiny.store(s, "cold", eng) is None
    assert "exceeds budget" in caplog.text


def test_consumed_when_longer_than_cold_max(tmp_path):
    eng = fk.FakeEngine()
    cache = make(tmp_path, cold_max_tokens=100)
    text = fk.text_of(150, seed=9)
    e = stored(cache, eng, text, reason="continued")
    prepared = cache.prepare(eng.session(), text + "x", eng)
    assert prepared.source == "disk" and prepared.consumed
    assert not e.path.exists()
    short = stored(cache, eng, fk.text_of(90, seed=10))
    prepared = cache.prepare(eng.session(), fk.text_of(90, seed=10) + "x", eng)
    assert not prepared.consumed and short.path.exists()


def test_cold_store_at_store_len_then_full_sync(tmp_path):
    eng = fk.FakeEngine()
    cache = make(tmp_path, min_tokens=64, boundary_trim=8, boundary_align=32)
    s = eng.session()
    text = fk.text_of(200, seed=11)
    prepared = cache.prepare(s, text, eng)
    assert prepared.source == "cold" and prepared.cold_len == 192   # (200-8) aligned down to 32
    cache.sync(s, prepared, eng)
    assert s.syncs == [192, 200] and s.evaluated == 200
    [e] = cache.entries()
    assert e.reason == "cold" and e.tokens == 192 and e.text_bytes == 192
    assert cache.last_store_tokens == 192


def test_cold_store_at_chat_anchor(tmp_path):
    eng = fk.FakeEngine()
    cache = make(tmp_path, min_tokens=32)
    system = fk.BOS + fk.text_of(80, seed=12)
    text = system + fk.USER + "question" + fk.ASSISTANT
    s = eng.session()
    prepared = cache.prepare(s, text, eng)
    anchor = len(eng.tokenizer.encode_rendered(system))
    assert prepared.cold_len == anchor
    cache.sync(s, prepared, eng)
    [e] = cache.entries()
    assert e.tokens == anchor and e.text_bytes == len(system.encode())
    # a different question under the same system prompt reuses it
    s2 = eng.session()
    p2 = cache.prepare(s2, system + fk.USER + "another" + fk.ASSISTANT, eng)
    assert p2.source == "disk" and p2.cached_tokens == anchor


def test_no_cold_store_when_disabled_or_too_long(tmp_path):
    eng = fk.FakeEngine()
    assert make(tmp_path, cold_max_tokens=0).prepare(eng.session(), fk.text_of(100), eng).cold_len == 0
    assert make(tmp_path, cold_max_tokens=50).prepare(eng.session(), fk.text_of(100), eng).cold_len == 0
    assert make(tmp_path, min_tokens=200).prepare(eng.session(), fk.text_of(100), eng).cold_len == 0


def test_continued_stores(tmp_path):
    eng = fk.FakeEngine()
    cache = make(tmp_path, min_tokens=16, continued_interval=50, boundary_align=32, cold_max_tokens=0)
    assert cache.continued_step() == 64
    s = eng.session()
    text = fk.text_of(200, seed=13)
    prepared = cache.prepare(s, text, eng)
    cache.sync(s, prepared, eng, split_continued=True)
    assert s.syncs == [64, 128, 192, 200]
    assert sorted(e.tokens for e in cache.entries()) == [64, 128, 192]
    assert all(e.reason == "continued" for e in cache.entries())
    for _ in range(56):     # decode up to 256: one more continued store, before the step at 256
        s.eval(99)
        cache.maybe_store_continued(s, eng)
    assert sorted(e.tokens for e in cache.entries()) == [64, 128, 192, 256]


def test_shutdown_store(tmp_path):
    eng = fk.FakeEngine()
    cache = make(tmp_path)
    s = eng.session()
    s.sync(eng.tokenizer.encode_rendered(fk.text_of(30)))
    assert cache.shutdown(s, eng).reason == "shutdown"
    s2 = eng.session()
    s2.sync([1, 2])
    assert cache.shutdown(s2, eng) is None


def test_text_override_sets_visible_flag(tmp_path):
    eng = fk.FakeEngine()
    cache = make(tmp_path)
    s = eng.session()
    s.sync(eng.tokenizer.encode_rendered(fk.text_of(30)))
    e = cache.store(s, "evict", eng, text="visible transcript", ext_flags=fmt.EXT_RESPONSES_VISIBLE)
    assert e.key_kind == "responses-visible" and e.text_bytes == len("visible transcript")


def test_existing_compatible_file_is_kept_and_trailer_rewritten(tmp_path):
    eng = fk.FakeEngine()
    cache = make(tmp_path)
    text = fk.text_of(40, seed=14) + "<tool_calls>T</tool_calls>"
    e1 = stored(cache, eng, text)
    e2 = stored(cache, eng, text, tool_map={"id1": b"<tool_calls>T</tool_calls>"})
    assert e1.path == e2.path
    cf = cache.read(e2)
    assert cf.tool_map == {"id1": b"<tool_calls>T</tool_calls>"}
    assert cf.entry.created_at == e1.created_at and cf.entry.ext_flags & fmt.EXT_TOOL_MAP
    prepared = cache.prepare(eng.session(), text + "!", eng)
    assert prepared.tool_map == {"id1": b"<tool_calls>T</tool_calls>"}


def test_tool_maps_scan_every_file(tmp_path):
    eng = fk.FakeEngine()
    cache = make(tmp_path)
    a = fk.text_of(40, seed=16) + "<tool_calls>A</tool_calls>"
    b = fk.text_of(40, seed=17) + "<tool_calls>B</tool_calls>"
    stored(cache, eng, a, tool_map={"ida": b"<tool_calls>A</tool_calls>", "idb": b"<tool_calls>B</tool_calls>"})
    stored(cache, eng, b, tool_map={"idb": b"<tool_calls>B</tool_calls>"})
    stored(cache, eng, fk.text_of(40, seed=18))
    assert cache.tool_maps() == {"ida": b"<tool_calls>A</tool_calls>", "idb": b"<tool_calls>B</tool_calls>"}
    assert cache.tool_maps(["idb", "zzz"]) == {"idb": b"<tool_calls>B</tool_calls>"}


def test_incompatible_existing_file_is_replaced(tmp_path):
    eng = fk.FakeEngine()
    cache = make(tmp_path)
    text = fk.text_of(40, seed=15)
    big = stored(cache, eng, text, ctx=8192)
    small = stored(cache, eng, text, ctx=1024)   # existing ctx 8192 > 1024: replaced
    assert small.path == big.path and cache.read(small).entry.ctx == 1024


# ---------------------------------------------------------------- eviction (§7.6)

def entry_with(tmp_path, name, tokens, hits, size, used, created=1):
    h = fmt.KVCHeader(2, 1, 0, tokens, hits, 4096, created, used, size - 52, 0)
    p = tmp_path / "kv" / (name * 40 + ".kv")[-43:]
    p.parent.mkdir(exist_ok=True)
    p.write_bytes(h.pack_prefix() + bytes(size - 52))
    return p


def test_eviction_score_formula():
    from ds4.kvcache import CacheEntry
    from pathlib import Path

    def e(hits, used, tokens=1000, size=10_000, created=0):
        return CacheEntry("0" * 40, Path("x"), fmt.KVCHeader(2, 1, 0, tokens, hits, 1, created, used, 0, 0), size)

    now = 1_000_000
    assert eviction_score(e(0, now), now) == pytest.approx(0.1)              # (0+1)*1000/10000
    assert eviction_score(e(4, now), now) == pytest.approx(0.5)              # (4+1)*0.1
    assert eviction_score(e(4, now - 21600), now) == pytest.approx(0.3)      # one half-life: 2 hits
    assert eviction_score(e(4, now - 2 * 21600), now) == pytest.approx(0.2)
    assert eviction_score(e(1, now - 21600 * 7), now) == pytest.approx(0.1)  # 1/128 < 0.01 -> 0
    assert eviction_score(e(4, 0, created=0), now) == pytest.approx(0.1)     # never used: hits ignored
    assert eviction_score(e(4, 0, created=now), now) == pytest.approx(0.5)   # falls back to created
    assert eviction_score(e(4, now), now, protected=True) == math.inf


def test_evict_order_follows_score(tmp_path):
    now = 10_000_000
    cache = make(tmp_path, max_bytes=10_000, clock=lambda: now)
    a = entry_with(tmp_path, "a", tokens=100, hits=0, size=4000, used=now)           # 0.025
    b = entry_with(tmp_path, "b", tokens=100, hits=9, size=4000, used=now)           # 0.25
    c = entry_with(tmp_path, "c", tokens=100, hits=9, size=4000, used=now - 86400)   # 9/16 -> 0.039
    junk = tmp_path / "kv" / ("d" * 40 + ".kv")
    junk.write_bytes(b"garbage")                                                       # invalid: first
    removed = cache.evict()
    assert removed == [junk, a]
    assert b.exists() and c.exists()


@settings(max_examples=25)
@given(files=st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 20), st.integers(60, 3000),
                                st.integers(0, 200_000)), min_size=1, max_size=8),
       budget=st.integers(500, 12_000))
def test_evict_keeps_directory_under_budget_with_stated_rule(tmp_path_factory, files, budget):
    tmp = tmp_path_factory.mktemp("ev")
    now = 1_000_000
    paths = []
    for i, (tokens, hits, size, age) in enumerate(files):
        paths.append((entry_with(tmp, format(i, "x"), tokens, hits, size, now - age), tokens, hits, size, age))
    cache = KVCache(tmp / "kv", max_bytes=budget, min_tokens=1, clock=lambda: now)  # evicts at open
    # independent oracle: drop lowest (eff_hits+1)*tokens/size, ties -> older, until total <= budget
    def score(t, h, s, age):
        eff = h * 0.5 ** (age / 21600)
        return ((0 if eff < 0.01 else eff) + 1) * t / s
    order = sorted(paths, key=lambda p: (score(*p[1:]), now - p[4]))
    total = sum(p[3] for p in paths)
    expect_gone = set()
    for p in order:
        if total <= budget:
            break
        expect_gone.add(p[0])
        total -= p[3]
    # files with equal score and last use are interchangeable (upstream takes directory order)
    gone = sorted(p[1:] for p in paths if not p[0].exists())
    assert gone == sorted(p[1:] for p in paths if p[0] in expect_gone)
    assert cache.total_bytes() <= budget


def test_store_evicts_others_but_protects_new_file(tmp_path):
    eng = fk.FakeEngine()
    first = make(tmp_path)
    e1 = stored(first, eng, fk.text_of(100, seed=20))
    limit = e1.file_size * 2 + 100
    cache = make(tmp_path, max_bytes=limit)
    e2 = stored(cache, eng, fk.text_of(100, seed=21))
    e3 = stored(cache, eng, fk.text_of(100, seed=22))
    assert e3.path.exists() and cache.total_bytes() <= limit
    assert sum(p.path.exists() for p in (e1, e2)) == 1


# ---------------------------------------------------------------- corruption and I/O failures

def test_truncated_files_never_crash_and_lookup_falls_back(tmp_path, caplog):
    eng = fk.FakeEngine()
    cache = make(tmp_path)
    full = fk.text_of(200, seed=30)
    short = stored(cache, eng, full[:50])
    long = stored(cache, eng, full[:150])
    data = long.path.read_bytes()
    for cut in (0, 10, 47, 51, 52, 120, 52 + 150 + 30, len(data) - 1):
        long.path.write_bytes(data[:cut])
        best = cache.lookup(full, ctx=4096)
        assert best is None or best.sha in (short.sha,), cut
        s = eng.session()
        with caplog.at_level(logging.WARNING, logger="ds4.kvcache"):
            prepared = cache.prepare(s, full, eng)
        assert prepared.source == "disk" and prepared.cached_tokens == 50, cut
        assert "invalid" in caplog.text or "truncated" in caplog.text
        caplog.clear()


def corrupt_variants(data: bytes, text_len: int):
    """(description, bytes) with damage the header/size scan cannot see."""
    pay = 52 + text_len
    yield "text byte", data[:60] + bytes([data[60] ^ 1]) + data[61:]
    yield "payload magic", data[:pay] + b"XXXX" + data[pay + 4:]
    tokens_field = pay + 28
    yield "payload token count", data[:tokens_field] + struct.pack("<I", 7) + data[tokens_field + 4:]
    counts = pay + 52 + 4 * 150 + 4 * fk.SHAPE.n_vocab
    yield "row count", data[:counts + 8] + struct.pack("<I", 9999) + data[counts + 12:]


@pytest.mark.parametrize("which", range(4))
def test_corrupt_payloads_are_skipped_and_deleted(tmp_path, which, caplog):
    eng = fk.FakeEngine()
    cache = make(tmp_path)
    full = fk.text_of(200, seed=31)
    short = stored(cache, eng, full[:50])
    long = stored(cache, eng, full[:150])
    name, bad = list(corrupt_variants(long.path.read_bytes(), 150))[which]
    long.path.write_bytes(bad)
    with pytest.raises(CacheFormatError):
        cache.read(long, shape=fk.SHAPE)
    with caplog.at_level(logging.WARNING, logger="ds4.kvcache"):
        prepared = cache.prepare(eng.session(), full, eng)
    assert prepared.cached_tokens == 50, name
    assert "corrupt" in caplog.text, name
    assert not long.path.exists() and short.path.exists()


def test_incompatible_model_file_is_skipped_not_deleted(tmp_path):
    eng = fk.FakeEngine()
    cache = make(tmp_path)
    text = fk.text_of(60, seed=32)
    e = stored(cache, eng, text)
    other = type("S", (), {})()
    other.n_layer, other.head_dim, other.indexer_head_dim, other.n_vocab = 4, 16, 4, 300
    other.compress_ratios = fk.RATIOS
    with pytest.raises(CacheFormatError, match="different DS4 layout"):
        cache.read(e, shape=other)
    s = eng.session()
    prepared = cache.prepare(s, text + "x", eng.tokenizer, quant_bits=2, shape=other)
    assert prepared.source == "cold" and e.path.exists()


def test_engine_rejection_of_chunk_layout_is_skipped(tmp_path):
    eng = fk.FakeEngine()
    cache = make(tmp_path)
    text = fk.text_of(60, seed=33)
    stored(cache, eng, text, ctx=1024)       # prefill chunk 1024 only loads into ctx 1024 (§6.2)
    s = eng.session(ctx=4096)
    assert cache.prepare(s, text + "x", eng).source == "cold"
    assert cache.prepare(eng.session(ctx=1024), text + "x", eng).source == "disk"


@settings(max_examples=40)
@given(data=st.data())
def test_fuzzed_files_never_crash(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("fz")
    eng = fk.FakeEngine()
    cache = KVCache(tmp / "kv", min_tokens=8)
    text = fk.text_of(40, seed=34)
    e = stored(cache, eng, text)
    raw = bytearray(e.path.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    e.path.write_bytes(bytes(raw[:cut]))
    try:
        cf = cache.read(e.path, shape=fk.SHAPE)
        assert cf.text == text.encode()[: len(cf.text)]
    except CacheFormatError:
        pass
    s = eng.session()
    prompt = text + "y" if data.draw(st.booleans()) else eng.tokenizer.encode_rendered(text + "y")
    if data.draw(st.booleans()):
        prepared = cache.prepare(s, prompt, eng)      # never raises
    else:                                             # no model shape known: fewer checks up front
        s.engine = None
        prepared = cache.prepare(s, prompt, eng.tokenizer, quant_bits=2)
    if prepared.source == "disk":
        assert s.tokens == prepared.tokens[: prepared.cached_tokens]


def test_temp_files_are_ignored_and_stale_ones_cleaned(tmp_path):
    cache = make(tmp_path)
    d = cache.dir
    dead = d / ("a" * 40 + ".kv.tmp.999999999.abc")
    live = d / ("b" * 40 + f".kv.tmp.{os.getpid()}.abc")
    dead.write_bytes(fmt.KVCHeader(2, 1, 0, 10, 0, 1, 1, 1, 0, 0).pack_prefix())
    live.write_bytes(b"x")
    assert cache.entries() == []
    assert not dead.exists() and live.exists()


def test_missing_or_readonly_directory(tmp_path, caplog):
    base = tmp_path / "file"
    base.write_text("x")
    with pytest.raises(Ds4IOError, match="cannot create KV cache directory"):
        KVCache(base / "kv")
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(Ds4IOError, match="not writable"):
            KVCache(ro)
    eng = fk.FakeEngine()
    cache = make(tmp_path)
    s = eng.session()
    s.sync(eng.tokenizer.encode_rendered(fk.text_of(30)))
    for p in cache.dir.iterdir():
        p.unlink()
    cache.dir.rmdir()
    assert cache.store(s, "cold", eng) is not None    # recreated
    cache.dir.joinpath(next(iter(os.listdir(cache.dir)))).unlink()
    os.rmdir(cache.dir)
    base2 = cache.dir
    base2.write_text("now a file")                    # directory replaced by a file: logged skip
    with caplog.at_level(logging.WARNING, logger="ds4.kvcache"):
        assert cache.store(s, "cold", eng) is None
    assert "store failed" in caplog.text
    assert cache.prepare(s, fk.text_of(30) + "x", eng).source == "memory"


def test_disk_full_is_logged_not_raised(tmp_path, monkeypatch, caplog):
    eng = fk.FakeEngine()
    cache = make(tmp_path)
    s = eng.session()
    s.sync(eng.tokenizer.encode_rendered(fk.text_of(30)))
    real = fmt.write_file_atomic

    def full_disk(path, chunks, fsync=True):
        def gen():
            yield next(iter(chunks))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, gen(), fsync=fsync)

    monkeypatch.setattr(fmt, "write_file_atomic", full_disk)
    with caplog.at_level(logging.WARNING, logger="ds4.kvcache"):
        assert cache.store(s, "cold", eng) is None
    assert "No space left" in caplog.text
    assert os.listdir(cache.dir) == []
