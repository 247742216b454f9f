"""A cache file written by upstream ds4's own kvstore code (tests/data/kvcache/README.md): our
reader accepts it, our writer produces the same bytes, and the engine restores from it."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import struct
from pathlib import Path

import numpy as np
import pytest

from ds4 import kvcache_format as fmt
from ds4.kvcache import KVCache, read_cache_file
from ds4.payload import read_payload_info

DATA = Path(__file__).resolve().parent / "data" / "kvcache"
SHA = "ed438b2b10366f91d309b837782b97578caa4a72"
TOKENS = [0, 92, 286, 393, 261, 273, 100, 457, 410, 49, 504, 498, 35, 110, 121, 505]
TEXT = "<｜begin▁of▁sentence｜>You are a cache test.<｜User｜>hello kv<｜Assistant｜>"
TINY_RATIOS = (0, 0, 4, 128)
MODEL_SHA256 = "390562e7c14863177e2e44f8ccab21f398061660d2a02f630a75ce49b8041faa"


@pytest.fixture
def upstream_dir(tmp_path):
    d = tmp_path / "kv"
    d.mkdir()
    (d / f"{SHA}.kv").write_bytes(gzip.decompress((DATA / f"{SHA}.kv.gz").read_bytes()))
    return d


def test_upstream_file_reads_and_matches_our_layout(upstream_dir):
    cache = KVCache(upstream_dir, min_tokens=1)
    [e] = cache.entries()
    assert (e.sha, e.quant_bits, e.reason, e.tokens, e.hits, e.ctx, e.ext_flags) == (SHA, 2, "cold", 16, 0, 512, 0)
    assert e.text_bytes == len(TEXT.encode()) and e.created_at == e.last_used > 0
    assert hashlib.sha1(TEXT.encode()).hexdigest() == SHA
    shape = type("Tiny", (), dict(n_layer=4, head_dim=256, indexer_head_dim=128, n_vocab=512,
                                  compress_ratios=TINY_RATIOS))
    cf = read_cache_file(e, shape=shape, ctx=512, prompt=TEXT.encode() + b"more")
    assert cf.text == TEXT.encode()
    info = read_payload_info(cf.payload, TINY_RATIOS, head_dim=256, indexer_head_dim=128, n_vocab=512)
    assert info.n_comp == (0, 0, 4, 0) and info.n_index_comp == (0, 0, 4, 0)
    assert struct.unpack_from("<16I", cf.payload, 52) == tuple(TOKENS)
    # our writer's bytes for the same fields are the upstream file, byte for byte
    h = fmt.KVCHeader(2, fmt.REASON_COLD, 0, 16, 0, 512, e.created_at, e.last_used, len(cf.payload), len(cf.text))
    assert h.pack_prefix() + cf.text + cf.payload == e.path.read_bytes()
    assert cache.lookup(TEXT + "and more", ctx=512).sha == SHA


@pytest.mark.skipif(importlib.util.find_spec("ds4.engine") is None, reason="ds4.engine (C++ core) not in this tree yet")
def test_engine_restores_upstream_file(upstream_dir):
    import ds4
    import ds4.testing

    model = ds4.testing.cached_model("tiny")
    eng = ds4.Engine(model, threads=2)
    cache = KVCache(upstream_dir, min_tokens=1)
    s = eng.session(ctx=512)
    prepared = cache.prepare(s, TEXT + "hello", eng)
    assert prepared.source == "disk" and prepared.cached_tokens == 16 and s.tokens == TOKENS
    payload = read_cache_file(cache.entries()[0]).payload
    assert np.array_equal(np.asarray(s.logits), np.frombuffer(payload, "<f4", 512, 52 + 4 * 16))
    assert cache.entries()[0].hits == 1           # upstream's file got its hit count bumped in place
    cache.sync(s, prepared, eng)
    assert s.tokens == prepared.tokens
    if hashlib.sha256(model.read_bytes()).hexdigest() == MODEL_SHA256:
        # same weights as upstream used: the restored state continues like our own prefill
        ref = eng.session(ctx=512)
        ref.sync(prepared.tokens)
        diff = np.abs(np.asarray(s.logits) - np.asarray(ref.logits))
        # Upstream and this engine round Q8_0 activations differently on ties (docs/model.md §4.6), so
        # the states differ by noise: measured mean |diff| 0.026 (upstream's own strict vs
        # fast-math builds differ by ~0.03, docs/validation.md). A wrong state is
        # far off: 8 wrong prefix tokens give 0.79, no prefix at all 1.1.
        assert diff.mean() < 0.1
