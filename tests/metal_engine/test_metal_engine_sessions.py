"""Sessions on metal-emu behave as on the CPU: sync / eval / rewind, snapshots, DSV4 payloads
across backends (written by one, loaded by the other, continued), the disk KV cache, MTP drafts.

Inside one backend, the same operations in the same order give the same bits (the emulator is
deterministic), so those checks are exact; across backends the agreement bound of _noise.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import ds4
from ds4.payload import read_payload_info

from _gpu_backends import metal_under_test
from _noise import assert_agrees

METAL = metal_under_test()   # metal-emu, or metal (the GPU) with DS4_TEST_BACKENDS=metal


@pytest.fixture(scope="module")
def engines(model_path):
    path = model_path("tiny", "q2")
    return ds4.Engine(path, backend=METAL, prefill_chunk=48), ds4.Engine(path, backend="cpu", threads=2,
                                                                                 prefill_chunk=48)


def _toks(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 512, n).tolist()


def test_sync_rewind_and_snapshot(engines):
    """Snapshots restore the exact state; a rewind makes the next sync recompute from the start
    (Session::rewind marks the state stale), so it lands on the bits of a fresh session's sync.
    Batches of another split run other mat-mat tiles (float order): those agree within _noise."""
    metal, _ = engines
    toks = _toks(30, 1)
    s = metal.session(ctx=256)
    s.sync(toks[:20])
    snap = s.snapshot()
    s.eval(toks[20])
    after = np.array(s.logits)
    s.restore(snap)
    assert s.pos == 20
    s.eval(toks[20])
    assert np.array_equal(np.array(s.logits), after)
    s.sync(toks)                        # extends 21..29 as one prefill batch
    extended = np.array(s.logits)
    fresh = metal.session(ctx=256)
    fresh.sync(toks)                    # one batch 0..29
    s.rewind(13)
    assert s.pos == 13 and s.tokens == toks[:13]
    s.sync(toks)
    assert np.array_equal(np.array(s.logits), np.array(fresh.logits))
    rows_s, rows_f = [extended], [np.array(fresh.logits)]
    ext = metal.session(ctx=256)
    ext.sync(toks[:20])
    ext.eval(toks[20])
    ext.sync(toks)
    for t in _toks(12, 11):             # teacher-forced rows after both histories
        ext.eval(t)
        fresh.eval(t)
        rows_s.append(np.array(ext.logits))
        rows_f.append(np.array(fresh.logits))
    assert np.array_equal(rows_s[0], extended)   # the same history gives the same bits
    assert_agrees(np.array(rows_s), np.array(rows_f), "incremental vs one-shot prefill")


# (writer, tokens before the save): the CPU-written state is past the ratio-128 window and the
# raw-window wrap (a CPU prefill is cheap; metal-emu then decodes); the metal-emu-written one
# crosses ratio-4 windows and the indexer's first selection.
@pytest.mark.parametrize("writer,n_saved", [("cpu", 136), ("metal", 44)])
def test_payload_crosses_backends(engines, writer, n_saved):
    """A DSV4 payload written by one backend loads into the other and continues like the writer."""
    metal, cpu = engines
    src, dst = (metal, cpu) if writer == "metal" else (cpu, metal)
    toks = _toks(n_saved + 10, 2)
    a = src.session(ctx=256)
    a.sync(toks[:n_saved])
    blob = a.save_payload()
    sh = cpu.info.shape
    info = read_payload_info(blob, sh.compress_ratios, head_dim=sh.head_dim, indexer_head_dim=sh.indexer_head_dim,
                             n_vocab=sh.n_vocab)
    assert info.tokens == n_saved and info.nbytes == len(blob)
    b = dst.session(ctx=256)
    b.load_payload(blob)
    assert b.pos == n_saved and b.tokens == toks[:n_saved]
    assert np.array_equal(np.array(b.logits), np.array(a.logits))   # the payload carries the logits
    assert b.save_payload() == blob                                # and the state, byte for byte
    rows_a, rows_b = [], []
    for t in toks[n_saved:]:
        a.eval(t)
        b.eval(t)
        rows_a.append(np.array(a.logits))
        rows_b.append(np.array(b.logits))
    assert_agrees(np.array(rows_b), np.array(rows_a), f"payload from {writer}")


def test_disk_kv_cache(engines, tmp_path):
    from ds4.kvcache import KVCache

    metal, _ = engines
    cache = KVCache(tmp_path / "kv", min_tokens=32, boundary_trim=4, boundary_align=32)
    text = "<｜begin▁of▁sentence｜>" + " ".join(["alpha beta gamma delta"] * 3) + "<｜User｜>hi<｜Assistant｜>"
    s1 = metal.session(ctx=512)
    p1 = cache.prepare(s1, text, metal)
    assert p1.source == "cold"
    cache.sync(s1, p1, metal)
    assert len(cache.entries()) == 1
    follow = text + " more"
    s2 = metal.session(ctx=512)
    p2 = cache.prepare(s2, follow, metal)
    assert p2.source == "disk" and p2.cached_tokens == p1.cold_len
    cache.sync(s2, p2, metal)
    fresh = metal.session(ctx=512)
    fresh.sync(p2.tokens[: p1.cold_len])
    fresh.sync(p2.tokens)
    assert np.array_equal(np.array(s2.logits), np.array(fresh.logits))


def test_mtp_drafts(model_path):
    path = model_path("tiny", "q2", mtp=True)
    metal = ds4.Engine(path, backend=METAL)
    cpu = ds4.Engine(path, backend="cpu", threads=2)
    toks = _toks(20, 3)
    rows = {}
    for name, eng in (("metal", metal), ("cpu", cpu)):
        s = eng.session(ctx=256)
        out = []
        for t in toks:
            s.eval(t)
            out.append(np.array(s.mtp_logits()))
        rows[name] = np.array(out)
    assert_agrees(rows["metal"], rows["cpu"], "MTP logits")
    # Speculative decoding on metal-emu: drafts verified by the main model give the greedy tokens.
    s = metal.session(ctx=256)
    s.sync(toks)
    drafts = s.mtp_drafts(s.argmax(), 3)
    assert len(drafts) == 3
    g = metal.session(ctx=256)
    g.sync(toks)
    greedy = []
    for _ in range(4):
        t = g.argmax()
        greedy.append(t)
        g.eval(t)
    first = s.argmax()
    assert first == greedy[0]
    committed = s.speculate(first, drafts)
    got = s.tokens[len(toks):]
    # Verification is one batched pass (mat-mat) where greedy decode ran mat-vecs: the rows agree
    # within float order only, so a near-tie could flip a token; these fixed draws have none.
    assert 1 <= committed <= 4 and len(got) == committed and got == greedy[:committed]


def test_eval_with_mtp_keeps_decode_bits(model_path):
    # Metal's mat-mat tiles do not reproduce its mat-vec bits, so the fused decode + MTP step 0
    # runs two one-row head products there: the same bits as eval() then mtp_logits().
    path = model_path("tiny", "q2", mtp=True)
    metal = ds4.Engine(path, backend=METAL)
    toks = _toks(20, 4)
    a, b = metal.session(ctx=256), metal.session(ctx=256)
    a.sync(toks)
    b.sync(toks)
    for _ in range(3):
        t = a.argmax()
        a.eval_with_mtp(t)
        b.eval(t)
        assert np.array_equal(np.array(a.mtp_logits()), np.array(b.mtp_logits()))
        assert np.array_equal(np.array(a.logits), np.array(b.logits))
    assert a.save_payload() == b.save_payload()
