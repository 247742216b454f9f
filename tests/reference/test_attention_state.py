"""Attention core with sinks and masks, and the per-layer cache / payload layout (docs/model.md §3.8, docs/runtime.md §6.1)."""

import struct

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ds4.reference.attention import attend
from ds4.reference.numerics import NEG
from ds4.reference.state import LayerState, ReferenceState
from ds4.shape import ModelShape, flash_ratios

seeds = st.integers(0, 2**32 - 1)


def _softmax_attention(q, rows, sink):
    """Independent double-precision formula: softmax over [sink, scores] with the sink carrying no value."""
    s = rows.astype(np.float64) @ q.astype(np.float64) / np.sqrt(q.size)
    m = max(s.max(initial=-np.inf), sink)
    w = np.exp(s - m)
    return (w @ rows.astype(np.float64)) / (w.sum() + np.exp(sink - m))


@given(seeds, st.integers(1, 12), st.integers(0, 12))
def test_attend_matches_softmax_with_sink(seed, n_raw, n_comp):
    rng = np.random.default_rng(seed)
    n_head, hd = 2, 64
    q = rng.standard_normal(n_head * hd).astype(np.float32)
    raw = rng.standard_normal((n_raw, hd)).astype(np.float32)
    comp = rng.standard_normal((n_comp, hd)).astype(np.float32)
    sinks = rng.standard_normal(n_head).astype(np.float32)
    allowed = rng.random(n_comp) < 0.5 if n_comp else None
    out = attend(q, raw, comp, allowed, sinks, n_head, hd).reshape(n_head, hd)
    visible = np.concatenate([raw, comp[allowed]]) if n_comp else raw
    for h in range(n_head):
        ref = _softmax_attention(q[h * hd:(h + 1) * hd], visible, float(sinks[h]))
        np.testing.assert_allclose(out[h], ref, rtol=1e-4, atol=1e-5)  # float32 exp/sum vs double


def test_sink_only_scales_down():
    # one row identical for every score: output = row * w/(w + e^(sink-mx))
    row = np.ones((1, 4), np.float32)
    q = np.zeros(4, np.float32)  # score 0
    out = attend(q, row, np.zeros((0, 4), np.float32), None, np.array([0.0], np.float32), 1, 4)
    np.testing.assert_allclose(out, 0.5, rtol=1e-7)  # e^0 / (e^0 + e^0)
    out = attend(q, row, np.zeros((0, 4), np.float32), None, np.array([-1e30], np.float32), 1, 4)
    np.testing.assert_allclose(out, 1.0, rtol=1e-7)


def test_masked_and_all_masked_rows():
    rng = np.random.default_rng(0)
    q = rng.standard_normal(64).astype(np.float32)
    raw = rng.standard_normal((2, 64)).astype(np.float32)
    comp = rng.standard_normal((3, 64)).astype(np.float32) * 100
    none = attend(q, raw, comp, np.zeros(3, bool), np.zeros(1, np.float32), 1, 64)
    assert np.array_equal(none, attend(q, raw, comp[:0], None, np.zeros(1, np.float32), 1, 64))


def _shape():
    return ModelShape(n_layer=4, n_embd=256, n_vocab=64, n_head=2, head_dim=192, n_rot=64, n_out_group=1,
                      q_lora_rank=64, o_lora_rank=64, n_expert=4, n_expert_used=2, n_ff_exp=256,
                      n_hash_layer=1, indexer_heads=2, indexer_head_dim=128, indexer_top_k=2,
                      compress_ratios=flash_ratios(4), n_swa=4)


def test_raw_window_oldest_first_with_f16_rounding():
    ls = LayerState(0, 0, 8, 128, raw_cap=3, comp_cap=0)
    for p in range(5):
        ls.push_raw(np.full(8, p + 1 / 3, np.float32))
    assert ls.n_raw == 3
    assert ls.raw_rows[:, 0].tolist() == [float(np.float16(p + 1 / 3)) for p in (2, 3, 4)]


def test_capacities_and_initial_frontiers():
    s = _shape()
    st_ = ReferenceState(s, 10)
    assert st_.raw_cap == 4 and ReferenceState(s, 3).raw_cap == 3
    assert [ls.comp.shape[0] for ls in st_.layers] == [0, 0, 10 // 4 + 2, 10 // 128 + 2]
    assert st_.layers[2].index.kv.shape == (8, 256) and st_.layers[2].attn.kv.shape == (8, 384)
    assert st_.layers[3].attn.kv.shape == (128, 192) and st_.layers[3].index is None
    assert np.all(st_.layers[3].attn.score == NEG)


def test_payload_layout_and_size():
    s = _shape()
    st_ = ReferenceState(s, 40)
    rng = np.random.default_rng(0)
    for p in range(9):  # fill caches by hand (no model needed)
        st_.tokens.append(p)
        for ls in st_.layers:
            ls.push_raw(rng.standard_normal(s.head_dim).astype(np.float32))
            if ls.ratio == 4 and (p + 1) % 4 == 0:
                ls.push_comp(rng.standard_normal(s.head_dim).astype(np.float32))
                ls.push_index(rng.standard_normal(128).astype(np.float32))
    st_.logits = rng.standard_normal(s.n_vocab).astype(np.float32)
    blob = st_.to_payload()
    hdr = struct.unpack_from("<13I", blob)
    assert hdr == (0x34565344, 1, 40, 40, 4, 4, 40 // 4 + 2, 9, 4, 192, 128, 64, 4)
    names = [n for n, _ in st_.payload_arrays()]
    assert names[:4] == ["tokens", "logits", "n_comp", "n_index_comp"]
    assert names[4:] == ["layer0.raw", "layer1.raw", "layer2.raw", "layer2.comp", "layer2.attn_state_kv",
                         "layer2.attn_state_score", "layer2.index_comp", "layer2.index_state_kv",
                         "layer2.index_state_score", "layer3.raw", "layer3.comp", "layer3.attn_state_kv",
                         "layer3.attn_state_score"]
    # docs/runtime.md §6.1 size formula
    R, D, I = 4, 192, 128
    expect = 52 + 4 * 9 + 4 * 64 + 8 * 4 + 4 * R * 4 * D
    expect += 2 * 4 * D + 2 * (2 * 4 * 2 * D * 4) + 2 * 4 * I + 2 * (2 * 4 * 2 * I * 4)  # ratio 4 layer
    expect += 0 + 2 * (128 * D * 4)                                                       # ratio 128 layer
    assert len(blob) == expect
    # the logits and the first raw row sit where the layout says
    off = 52 + 4 * 9
    assert np.array_equal(np.frombuffer(blob, "<f4", 64, off), st_.logits)
    off += 4 * 64
    assert list(np.frombuffer(blob, "<u4", 8, off)) == [0, 0, 2, 0, 0, 0, 2, 0]
    off += 32
    assert np.array_equal(np.frombuffer(blob, "<f4", D, off), st_.layers[0].raw_rows[0])


def test_payload_readable_by_ds4_payload():
    from ds4 import payload
    s = _shape()
    st_ = ReferenceState(s, 40)
    for p in range(6):
        st_.tokens.append(p)
        for ls in st_.layers:
            ls.push_raw(np.zeros(s.head_dim, np.float32))
    info = payload.read_payload_info(st_.to_payload(), s.compress_ratios)
    assert info.tokens == 6 and info.nbytes == len(st_.to_payload())
