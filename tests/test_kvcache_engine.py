"""KV cache with the real engine on the tiny synthetic model: a restored session continues exactly
like a fresh prefill, files survive a new process, the engine's payload passes the pure-Python
validator, incompatible files are skipped.

Runs once ``ds4.engine`` (the C++ core) is present; until then the module is skipped as a whole.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ds4.engine") is None,
                                reason="ds4.engine (C++ core) not in this tree yet")



@pytest.fixture(scope="module")
def engine():
    import ds4
    import ds4.testing

    return ds4.Engine(ds4.testing.cached_model("tiny"), threads=2)


def prompt_text(engine, n_words: int, seed: int = 0) -> str:
    """A rendered chat prompt: BOS + system text + one user turn + assistant marker."""
    import random

    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "kv", "cache", "token", "the", "of", "42", "x+y"]
    system = " ".join(rng.choice(words) for _ in range(n_words))
    return f"<｜begin▁of▁sentence｜>{system}<｜User｜>what now?<｜Assistant｜>"


def make_cache(tmp_path, **kw):
    from ds4.kvcache import KVCache

    kw.setdefault("min_tokens", 32)
    kw.setdefault("boundary_trim", 4)
    kw.setdefault("boundary_align", 32)
    return KVCache(tmp_path / "kv", **kw)


def test_engine_payload_passes_pure_python_validator(engine):
    from ds4.payload import read_payload_info

    s = engine.session(ctx=512)
    s.sync(engine.tokenizer.encode_rendered(prompt_text(engine, 60)))
    data = s.save_payload()
    sh = engine.info.shape
    info = read_payload_info(data, sh.compress_ratios, head_dim=sh.head_dim,
                             indexer_head_dim=sh.indexer_head_dim, n_vocab=sh.n_vocab)
    assert info.nbytes == len(data) and info.tokens == s.pos
    # cold prefill row counts (docs/runtime.md §6.1): n_comp = T // ratio, indexer rows on ratio 4
    assert info.n_comp == tuple(s.pos // r if r else 0 for r in sh.compress_ratios)
    assert info.n_index_comp == tuple(s.pos // r if r == 4 else 0 for r in sh.compress_ratios)


def test_restored_session_continues_like_a_fresh_prefill(engine, tmp_path):
    cache = make_cache(tmp_path)
    text = prompt_text(engine, 80, seed=1)
    s1 = engine.session(ctx=1024)
    p1 = cache.prepare(s1, text, engine)
    assert p1.source == "cold" and p1.cold_len > 0
    cache.sync(s1, p1, engine)
    [entry] = cache.entries()
    assert entry.tokens == p1.cold_len and entry.quant_bits == engine.info.routed_bits
    # the cache text is the stored tokens' bytes (§7.2)
    assert cache.read(entry).text == engine.tokenizer.decode_bytes(p1.tokens[: p1.cold_len])

    follow = text + "more words after the prompt"
    s2 = engine.session(ctx=1024)
    p2 = cache.prepare(s2, follow, engine)
    assert p2.source == "disk" and p2.cached_tokens == p1.cold_len
    assert s2.tokens == p1.tokens[: p1.cold_len]
    cache.sync(s2, p2, engine)

    fresh = engine.session(ctx=1024)
    fresh.sync(p2.tokens[: p1.cold_len])
    fresh.sync(p2.tokens)
    # Same operations in the same order (prefix prefill, then extend): bit-identical.
    assert np.array_equal(np.asarray(s2.logits), np.asarray(fresh.logits))
    cold = engine.session(ctx=1024)
    cold.sync(p2.tokens)
    # Against one whole-prompt prefill the chunk split differs; the engine promises chunking never
    # changes results, and float32 reassociation would stay far below 1e-3 of the logit scale.
    np.testing.assert_allclose(s2.logits, cold.logits, rtol=0, atol=1e-3 * float(np.abs(cold.logits).max()))
    # and the next greedy tokens agree
    for _ in range(4):
        t = cold.argmax()
        assert s2.argmax() == t
        s2.eval(t)
        cold.eval(t)


def test_round_trip_through_a_new_process(engine, tmp_path):
    cache = make_cache(tmp_path)
    text = prompt_text(engine, 70, seed=2)
    s = engine.session(ctx=1024)
    cache.sync(s, cache.prepare(s, text, engine), engine)
    follow = text + " ok"
    import ds4

    package_root = Path(ds4.__file__).resolve().parent.parent   # the tree this test imports
    code = f"""
import json, sys
sys.path.insert(0, {str(package_root)!r})
import numpy as np, ds4, ds4.testing
from ds4.kvcache import KVCache
eng = ds4.Engine(ds4.testing.cached_model("tiny"), threads=2)
cache = KVCache({str(cache.dir)!r}, min_tokens=32, boundary_trim=4, boundary_align=32)
s = eng.session(ctx=1024)
p = cache.prepare(s, {follow!r}, eng)
cache.sync(s, p, eng)
np.save({str(tmp_path / "logits.npy")!r}, np.asarray(s.logits))
print(json.dumps({{"source": p.source, "cached": p.cached_tokens, "tokens": p.tokens}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["source"] == "disk" and got["cached"] > 0
    ref = engine.session(ctx=1024)
    ref.sync(got["tokens"][: got["cached"]])
    ref.sync(got["tokens"])
    assert np.array_equal(np.load(tmp_path / "logits.npy"), np.asarray(ref.logits))


def test_context_incompatible_files_are_skipped(engine, tmp_path):
    cache = make_cache(tmp_path)
    text = prompt_text(engine, 60, seed=3)
    s = engine.session(ctx=512)
    cache.sync(s, cache.prepare(s, text, engine), engine)
    assert len(cache.entries()) == 1
    # ctx 256 < file ctx 512: not even a candidate
    assert cache.prepare(engine.session(ctx=256), text + "!", engine).source == "cold"
    # ctx 1024: the engine's prefill chunk differs (min(ctx, 2048) -> 512 vs 1024), load refused,
    # the file is kept (it is valid for ctx-512 sessions)
    assert cache.prepare(engine.session(ctx=1024), text + "!", engine).source == "cold"
    assert cache.prepare(engine.session(ctx=512), text + "!", engine).source == "disk"


def test_corrupt_header_file_is_skipped_with_engine(engine, tmp_path):
    cache = make_cache(tmp_path)
    text = prompt_text(engine, 60, seed=4)
    s = engine.session(ctx=512)
    cache.sync(s, cache.prepare(s, text, engine), engine)
    [e] = cache.entries()
    data = bytearray(e.path.read_bytes())
    off = 52 + e.text_bytes + 4 * 9          # payload header field 9 (head dim)
    data[off] ^= 0x01
    e.path.write_bytes(bytes(data))
    s2 = engine.session(ctx=512)
    assert cache.prepare(s2, text + "!", engine).source == "cold"
    s2.sync(engine.tokenizer.encode_rendered(text))   # the session is still usable


def test_token_prompts_restore_exact_prefixes(engine, tmp_path):
    cache = make_cache(tmp_path)
    tokens = engine.tokenizer.encode_rendered(prompt_text(engine, 70, seed=5))
    s = engine.session(ctx=1024)
    p = cache.prepare(s, tokens, engine)
    assert p.source == "cold" and p.tokens == tokens
    cache.sync(s, p, engine)
    more = tokens + engine.tokenizer.encode(" and then")
    s2 = engine.session(ctx=1024)
    p2 = cache.prepare(s2, more, engine)
    assert p2.source == "disk" and p2.tokens == more and p2.cached_tokens == p.cold_len
    cache.sync(s2, p2, engine)
    ref = engine.session(ctx=1024)
    ref.sync(more[: p.cold_len])
    ref.sync(more)
    assert np.array_equal(np.asarray(s2.logits), np.asarray(ref.logits))


def test_continued_checkpoints_during_prefill_equal_fresh_prefills(engine, tmp_path):
    from ds4.kvcache import KVCache

    cache = KVCache(tmp_path / "kv", min_tokens=32, cold_max_tokens=0, continued_interval=64,
                    boundary_align=32)
    tokens = engine.tokenizer.encode_rendered(prompt_text(engine, 80, seed=6))
    assert len(tokens) > 128
    s = engine.session(ctx=1024)
    cache.sync(s, cache.prepare(s, tokens, engine), engine)
    stored = sorted(cache.entries(), key=lambda e: e.tokens)
    assert [e.tokens for e in stored] == list(range(64, len(tokens) + 1, 64))
    assert all(e.reason == "continued" for e in stored)
    for e in stored:
        fresh = engine.session(ctx=1024)
        fresh.sync(tokens[: e.tokens])
        # a checkpoint taken mid-prefill is exactly the state of a prefill that stops there
        assert cache.read(e).payload == fresh.save_payload()
