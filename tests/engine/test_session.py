"""Session semantics: prefill == decode, chunking, sync reuse, rewind, snapshots, payloads,
context limits, threads. Exact equality is expected everywhere here: the engine runs one float
order per row whatever the batch, chunk or thread count."""

from __future__ import annotations

import os

import numpy as np
import pytest

import ds4
import ds4.testing
from ds4.errors import CacheFormatError, ContextOverflowError, InvalidArgumentError


def _tokens(n: int, seed: int = 0, vocab: int = 512) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def test_prefill_equals_decode_bitwise(tiny_engine) -> None:
    toks = _tokens(140, 1)
    a = tiny_engine.session(ctx=256)
    a.sync(toks)
    b = tiny_engine.session(ctx=256)
    for t in toks:
        b.eval(t)
    assert np.array_equal(a.logits, b.logits)


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_chunking_does_not_change_results(tiny_path, tiny_engine, chunk: int) -> None:
    # Chunks of 3/7 split ratio-4 windows and the 128-token window at every offset.
    toks = _tokens(150, 2)
    whole = tiny_engine.session(ctx=256)
    whole.sync(toks)
    eng = ds4.Engine(tiny_path, threads=1, prefill_chunk=chunk)
    part = eng.session(ctx=256)
    seen = []
    part.sync(toks, progress=lambda done, total: seen.append((done, total)))
    assert np.array_equal(whole.logits, part.logits)
    assert part.save_payload() == whole.save_payload()
    assert seen[-1] == (150, 150) and len(seen) == -(-150 // chunk)


def test_threads_do_not_change_results(tiny_path, tiny_engine) -> None:
    toks = _tokens(60, 3)
    one = ds4.Engine(tiny_path, threads=1).session(ctx=128)
    two = tiny_engine.session(ctx=128)
    one.sync(toks)
    two.sync(toks)
    assert np.array_equal(one.logits, two.logits)


def test_sync_reuses_prefix(tiny_engine) -> None:
    toks = _tokens(90, 4)
    s = tiny_engine.session(ctx=256)
    s.sync(toks[:50])
    s.sync(toks)
    fresh = tiny_engine.session(ctx=256)
    fresh.sync(toks)
    assert np.array_equal(s.logits, fresh.logits) and s.tokens == toks
    # sync's state does not depend on how the prompt was split (frontier reset included)
    assert s.save_payload() == fresh.save_payload()
    # A prompt that diverges rebuilds and still equals a fresh session.
    other = toks[:30] + _tokens(20, 5)
    s.sync(other)
    fresh2 = tiny_engine.session(ctx=256)
    fresh2.sync(other)
    assert np.array_equal(s.logits, fresh2.logits) and s.pos == 50


def test_rewind_then_reeval(tiny_engine) -> None:
    toks = _tokens(40, 6)
    s = tiny_engine.session(ctx=128)
    s.sync(toks[:25])
    want = s.logits.copy()
    for t in toks[25:]:
        s.eval(t)
    s.rewind(25)
    assert s.pos == 25 and s.tokens == toks[:25]
    assert np.array_equal(s.logits, want)
    s.eval(toks[25])
    ref = tiny_engine.session(ctx=128)
    ref.sync(toks[:26])
    assert np.array_equal(s.logits, ref.logits)
    with pytest.raises(InvalidArgumentError):
        s.rewind(27)


def test_snapshot_restore_bitexact(tiny_engine) -> None:
    toks = _tokens(70, 7)
    s = tiny_engine.session(ctx=256)
    s.sync(toks[:50])
    snap = s.snapshot()
    for t in toks[50:]:
        s.eval(t)
    after = s.logits.copy()
    s.restore(snap)
    assert s.pos == 50 and s.save_payload() == snap.payload
    for t in toks[50:]:
        s.eval(t)
    assert np.array_equal(s.logits, after)


def test_save_load_roundtrip(tiny_engine, tmp_path) -> None:
    toks = _tokens(133, 8)
    s = tiny_engine.session(ctx=256)
    s.sync(toks)
    path = tmp_path / "s.kv"
    s.save(path)
    # exactly the saved file: the writer's temp file (s.kv.tmp.<pid>.<hex>, ds4/_atomic.py) is gone
    assert os.listdir(tmp_path) == ["s.kv"]
    loaded = tiny_engine.load_session(path)
    assert loaded.ctx == 256 and loaded.tokens == toks
    assert np.array_equal(loaded.logits, s.logits)
    assert loaded.save_payload() == path.read_bytes()
    s.eval(3)
    loaded.eval(3)
    assert np.array_equal(loaded.logits, s.logits)


def test_payload_matches_python_reader(tiny_engine) -> None:
    from ds4.payload import read_payload_info
    s = tiny_engine.session(ctx=256)
    s.sync(_tokens(150, 9))
    blob = s.save_payload()
    sh = tiny_engine.shape
    info = read_payload_info(blob, sh.compress_ratios, head_dim=sh.head_dim,
                             indexer_head_dim=sh.indexer_head_dim, n_vocab=sh.n_vocab)
    assert info.nbytes == len(blob) == s.payload_size()
    # Row counts after T tokens: floor(T / ratio) (docs/runtime.md §6.1).
    assert info.n_comp == tuple(0 if r == 0 else 150 // r for r in sh.compress_ratios)


def _bad_payloads(good: bytes) -> dict[str, bytes]:
    import struct
    hdr = list(struct.unpack_from("<13I", good))

    def with_field(i: int, v: int) -> bytes:
        h = hdr.copy()
        h[i] = v
        return struct.pack("<13I", *h) + good[52:]

    return {
        "truncated": good[:-5],
        "header only": good[:30],
        "trailing": good + b"\0\0\0\0",
        "magic": with_field(0, 0x12345678),
        "version": with_field(1, 2),
        "bigger ctx": with_field(2, 4096),
        "layers": with_field(8, 5),
        "vocab": with_field(11, 513),
        "raw rows": with_field(12, 3),
        "bad token": good[:52] + struct.pack("<I", 10_000) + good[56:],
    }


def test_bad_payloads_raise(tiny_engine) -> None:
    s = tiny_engine.session(ctx=256)
    s.sync(_tokens(20, 10))
    good = s.save_payload()
    s.sync(_tokens(12, 11))
    before = s.save_payload()
    for name, blob in _bad_payloads(good).items():
        with pytest.raises(CacheFormatError):
            s.load_payload(blob)
        assert s.save_payload() == before, f"session changed by rejected payload ({name})"
    # A payload written with another ctx below 2048 has another chunk layout.
    with pytest.raises(CacheFormatError):
        tiny_engine.session(ctx=512).load_payload(good)


def test_context_overflow_leaves_session_usable(tiny_engine) -> None:
    s = tiny_engine.session(ctx=16)
    toks = _tokens(15, 12)
    with pytest.raises(ContextOverflowError):
        s.sync(_tokens(16, 12))
    s.sync(toks)
    want = s.logits.copy()
    with pytest.raises(ContextOverflowError):
        s.eval(1)
    assert s.pos == 15 and np.array_equal(s.logits, want)
    s.rewind(14)
    s.eval(toks[14])
    assert np.array_equal(s.logits, want)


def test_invalid_tokens(tiny_engine) -> None:
    s = tiny_engine.session(ctx=32)
    with pytest.raises(InvalidArgumentError):
        s.eval(512)
    with pytest.raises(InvalidArgumentError):
        s.sync([1, -1])
    with pytest.raises(InvalidArgumentError):
        s.sync([])
    assert s.pos == 0
    s.sync([1, 2])
    assert s.pos == 2


def test_logits_are_a_readonly_view(tiny_engine) -> None:
    s = tiny_engine.session(ctx=32)
    s.eval(5)
    v = s.logits
    assert v.dtype == np.float32 and not v.flags.writeable
    before = v.copy()
    s.eval(6)
    assert v is s.logits and not np.array_equal(v, before)
    assert s.argmax() == int(np.argmax(v))


def test_payload_from_smaller_ctx_loads_when_layout_matches(tiny_engine) -> None:
    # ctx >= 2048 all share the 2048 chunk tag and 128-row window (docs/runtime.md §6.2 step 5), so a
    # ctx-2048 payload loads into a ctx-4096 session and continues bit-identically.
    toks = _tokens(60, 13)
    small = tiny_engine.session(ctx=2048)
    small.sync(toks)
    big = tiny_engine.session(ctx=4096)
    big.load_payload(small.save_payload())
    small.eval(7)
    big.eval(7)
    assert np.array_equal(small.logits, big.logits)
    with pytest.raises(CacheFormatError):          # and not into a smaller context
        tiny_engine.session(ctx=2047).load_payload(big.save_payload())


def test_sampling_helpers_use_the_live_logits(tiny_engine) -> None:
    from ds4 import sampling
    s = tiny_engine.session(ctx=32)
    s.sync([3, 4, 5])
    assert s.sample(temperature=0) == s.argmax()
    a, b = sampling.Rng(7), sampling.Rng(7)
    assert s.sample(temperature=0.8, rng=a) == sampling.sample(s.logits, temperature=0.8, rng=b)
    top = s.top_logprobs(3)
    assert [t.id for t in top] == [t.id for t in sampling.top_logprobs(s.logits, 3)]
    assert top[0].id == s.argmax()


def test_failed_save_leaves_no_temp_file(tiny_engine, tmp_path, monkeypatch) -> None:
    from ds4.errors import Ds4IOError

    s = tiny_engine.session(ctx=64)
    s.sync([1, 2, 3])
    renamed: list[str] = []

    def refuse(src, dst):
        renamed.append(os.path.basename(src))
        assert os.path.exists(src)           # the complete temp file exists at the rename
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(Ds4IOError, match="s.kv"):
        s.save(tmp_path / "s.kv")
    assert renamed and renamed[0].startswith("s.kv.tmp.")   # the check below looks at the real name
    assert os.listdir(tmp_path) == []
