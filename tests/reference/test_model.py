"""End to end on synthetic models: wiring, long prompts, prefill == decode, chunking, sensitivity.

What is asserted exactly: prefill runs the same per-token math as decode, so prefill logits are
bit-identical to decode logits, and the prefill state equals the decode state after the
after-prefill frontier reset (docs/runtime.md §5.1) is applied to it; any chunking of a prefill gives
bit-identical logits and payload bytes.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ds4.testing
from ds4.errors import ContextOverflowError, InvalidArgumentError
from ds4.reference import ReferenceModel
from ds4.reference.rope import rope_params

N_LONG = 150   # > n_swa = 128; 37 ratio-4 rows > top_k = 8; one ratio-128 row (at p = 127)
SNAP = 127     # the token at this position closes a ratio-4 and a ratio-128 window


def _prompt(n, vocab, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return ReferenceModel(tiny_path)


@pytest.fixture(scope="module")
def long_prompt(tiny):
    return _prompt(N_LONG, tiny.shape.n_vocab)


@pytest.fixture(scope="module")
def decoded(tiny, long_prompt):
    """Token-by-token decode of the long prompt with a full trace; a state snapshot before SNAP."""
    st_ = tiny.new_state(512)
    trace: dict = {}
    logits, snap = [], None
    for i, t in enumerate(long_prompt):
        if i == SNAP:
            snap = st_.copy()
        logits.append(tiny.decode(st_, t, trace))
    return st_, np.stack(logits), trace, snap


def test_logits_finite_and_not_degenerate(decoded):
    _, logits, _, _ = decoded
    assert logits.shape == (N_LONG, 512) and logits.dtype == np.float32
    assert np.all(np.isfinite(logits))
    assert np.all(logits.std(axis=1) > 0.1)            # no flat distribution
    assert len(set(logits.argmax(axis=1).tolist())) >= 10  # the prediction depends on the context


def test_deterministic_across_instances(tiny_path, decoded, long_prompt):
    m = ReferenceModel(tiny_path)
    st_ = m.new_state(64)
    assert np.array_equal(m.prefill(st_, long_prompt[:12]), decoded[1][11])


def test_prefill_in_chunks_equals_decode(tiny, decoded, long_prompt):
    st_dec, logits, _, _ = decoded
    st_ = tiny.new_state(512)
    for a, b in ((0, 50), (50, 129), (129, N_LONG)):
        out = tiny.prefill(st_, long_prompt[a:b])
        assert np.array_equal(out, logits[b - 1])
    ref = st_dec.copy()
    ref.finish_prefill()
    assert st_.to_payload() == ref.to_payload()


def test_cache_schedule(decoded):
    st_, _, trace, _ = decoded
    top_k = st_.shape.indexer_top_k
    sel_sets = set()
    for p in range(N_LONG):
        # ratio-4 layer 2: a row when p+1 crosses a multiple of 4, for both lanes
        assert (trace["blk.2.comp_row"][p] is not None) == ((p + 1) % 4 == 0)
        assert (trace["blk.2.index_row"][p] is not None) == ((p + 1) % 4 == 0)
        # ratio-128 layer 3: one row, closed by token 127
        assert (trace["blk.3.comp_row"][p] is not None) == (p == 127)
        n_comp = (p + 1) // 4
        allowed = trace["blk.2.allowed"][p]
        if n_comp <= top_k:
            assert allowed is None
        else:
            # the mask covers exactly the rows that exist: nothing from the future
            assert allowed.shape == (n_comp,) and allowed.sum() == top_k
            sel = trace["blk.2.indexer_selected"][p]
            assert np.all(sel < n_comp)
            sel_sets.add(tuple(sel.tolist()))
    assert len(sel_sets) > 5  # the indexer really selects, differently over time
    assert [ls.n_comp for ls in st_.layers] == [0, 0, N_LONG // 4, N_LONG // 128]
    assert [ls.n_raw for ls in st_.layers] == [128] * 4


def test_routing(tiny, decoded, long_prompt):
    _, _, trace, _ = decoded
    table = tiny.file.get("blk.0.ffn_gate_tid2eid.weight").values
    for p in (0, 77, 149):
        assert trace["blk.0.experts"][p].tolist() == table[long_prompt[p]].tolist()
    chosen = {tuple(e.tolist()) for e in trace["blk.3.experts"]}
    assert len(chosen) > 3  # biased top-k routing depends on the token
    w = np.stack(trace["blk.3.expert_weights"])
    np.testing.assert_allclose(w.sum(axis=1), tiny.shape.expert_weights_scale, rtol=1e-5)


def _perturb(tensor, rng, name, trace127):
    """Return a new values array for ``tensor``: a change that must reach the logits at SNAP."""
    v = tensor.values
    if name.endswith("ffn_gate_tid2eid.weight"):
        return (v + 1) % int(v.max() + 1)                        # other experts for every token
    if name.endswith("exp_probs_b.bias"):
        il = name.split(".")[1]
        out = v.copy()
        unused = [e for e in range(v.size) if e not in trace127[f"blk.{il}.experts"].tolist()]
        out[unused[0]] += 100.0                                  # force a different selection
        return out
    if "indexer" in name:
        return -v                                                # reverses the indexer's ranking
    return (v * (1 + 0.2 * rng.standard_normal(v.shape))).astype(v.dtype)


def test_every_tensor_is_wired(tiny, decoded, long_prompt):
    """Perturb each tensor in turn and decode one token from a snapshot: the logits must change.

    At SNAP = 127 every tensor is used: both compressors emit, the indexer selects 8 of 32 rows,
    the window is full. Two lanes of the ratio-4 layer can still miss the logits there, because the
    row they emit at 127 need not be among the 8 selected: the attention compressor is then checked
    at p = 31 (8 rows <= top_k, all visible), the indexer compressor through the indexer scores.
    """
    _, logits, trace, snap = decoded
    snap31 = tiny.new_state(512)
    tiny.prefill(snap31, long_prompt[:31])
    trace127 = {k: v[SNAP] for k, v in trace.items() if len(v) == N_LONG}
    rng = np.random.default_rng(0)
    dead = []
    for name, t in tiny.file.tensors.items():
        saved = (t._values, t._values64)
        t._values, t._values64 = _perturb(t, rng, name, trace127), None
        try:
            tr: dict = {}
            wired = not np.array_equal(tiny.decode(snap.copy(), long_prompt[SNAP], tr), logits[SNAP])
            if not wired and ".attn_compressor" in name:
                wired = not np.array_equal(tiny.decode(snap31.copy(), long_prompt[31]), logits[31])
            if not wired and ".indexer_compressor" in name:
                il = name.split(".")[1]
                wired = not np.array_equal(tr[f"blk.{il}.indexer_scores"][0],
                                           trace127[f"blk.{il}.indexer_scores"])
        finally:
            t._values, t._values64 = saved
        if not wired:
            dead.append(name)
    assert dead == [], dead
    assert np.array_equal(tiny.decode(snap.copy(), long_prompt[SNAP]), logits[SNAP])  # restored


def test_context_overflow(fast_path):
    m = ReferenceModel(fast_path)
    st_ = m.new_state(8)
    with pytest.raises(ContextOverflowError):
        m.prefill(st_, list(range(9)))
    assert st_.pos == 0  # rejected before any work
    m.prefill(st_, list(range(8)))
    with pytest.raises(ContextOverflowError):
        m.decode(st_, 1)
    with pytest.raises(InvalidArgumentError):
        m.prefill(m.new_state(8), [])
    with pytest.raises(InvalidArgumentError):
        m.decode(m.new_state(8), m.shape.n_vocab)


@pytest.fixture(scope="module")
def fast_reference(fast_path):
    m = ReferenceModel(fast_path)
    prompt = _prompt(40, m.shape.n_vocab, seed=5)
    st_ = m.new_state(64)
    logits = m.prefill(st_, prompt)
    return m, prompt, logits, st_.to_payload()


@settings(max_examples=8)
@given(st.lists(st.integers(1, 39), max_size=5, unique=True))
def test_any_chunking_gives_identical_logits_and_state(fast_reference, cuts):
    m, prompt, logits, payload = fast_reference
    st_ = m.new_state(64)
    bounds = [0, *sorted(cuts), len(prompt)]
    for a, b in zip(bounds, bounds[1:]):
        out = m.prefill(st_, prompt[a:b])
    assert np.array_equal(out, logits)
    assert st_.to_payload() == payload


def test_fast_shape_window_and_indexer(fast_reference):
    m, prompt, _, _ = fast_reference
    st_ = m.new_state(64)
    trace: dict = {}
    m.prefill(st_, prompt, trace)
    assert st_.layers[0].n_raw == 16                                 # window full, evicting
    assert sum(a is not None for a in trace["blk.2.allowed"]) == 40 - 11  # masks from p = 11 on


def test_pro_pattern(model_dir):
    path = ds4.testing.write_model(model_dir / "tiny-pro.gguf", "tiny-pro", seed=2)
    m = ReferenceModel(path)
    assert m.shape.compress_ratios == (128, 128, 4, 128)
    assert m.ropes[0] == rope_params(m.shape, 128) and m.ropes[0].ext_factor == 1.0  # YaRN on layer 0
    st_ = m.new_state(256)
    logits = m.prefill(st_, _prompt(130, m.shape.n_vocab, seed=3))
    assert np.all(np.isfinite(logits)) and logits.std() > 0.1
    assert [ls.n_comp for ls in st_.layers] == [1, 1, 32, 1]


def test_q4_experts(model_dir, tiny_path):
    path = ds4.testing.write_model(model_dir / "tiny-q4.gguf", "tiny", experts="q4", seed=0)
    m = ReferenceModel(path)
    assert m.layers[0].ffn.gate_exps.qtype.name == "Q4_K"
    prompt = _prompt(12, 512, seed=4)
    logits = m.prefill(m.new_state(64), prompt)
    assert np.all(np.isfinite(logits)) and logits.std() > 0.1


def test_mtp(model_dir):
    path = ds4.testing.write_model(model_dir / "tiny-mtp.gguf", "tiny", mtp=True, seed=0)
    m = ReferenceModel(path)
    assert m.mtp is not None
    prompt = _prompt(20, 512, seed=6)
    st_ = m.new_state(64)
    m.prefill(st_, prompt)
    snap = st_.copy()
    trace: dict = {}
    l1, h1 = m.mtp_step(st_, st_.hidden, prompt[-1], st_.pos - 1, trace)
    assert l1.shape == (512,) and np.all(np.isfinite(l1)) and l1.std() > 0.1
    assert h1.shape == (4, 256) and st_.mtp.n_raw == 1
    assert np.array_equal(m.mtp_logits(snap, snap.hidden, prompt[-1], snap.pos - 1), l1)  # deterministic
    draft = int(l1.argmax())
    l2, _ = m.mtp_step(st_, h1, draft, st_.pos, trace)          # chained draft
    assert st_.mtp.n_raw == 2 and not np.array_equal(l1, l2)
    assert len(trace["mtp.logits"]) == 2 and "mtp.experts" in trace
    # the MTP block does not touch the main caches
    assert st_.to_payload() == snap.to_payload()
    m_plain = ReferenceModel(model_dir / "tiny.gguf") if (model_dir / "tiny.gguf").exists() else None
    if m_plain is not None:
        with pytest.raises(InvalidArgumentError):
            m_plain.mtp_logits(m_plain.new_state(8), np.zeros((4, 256), np.float32), 1, 0)


def test_finish_flag_and_reset_rows(fast_reference):
    m, prompt, logits, payload = fast_reference
    dec = m.new_state(64)
    for t in prompt:
        out = m.decode(dec, t)
    assert np.array_equal(out, logits)
    raw = m.new_state(64)
    m.prefill(raw, prompt, finish=False)
    assert raw.to_payload() == dec.to_payload()            # no reset: exactly the decode state
    assert payload != dec.to_payload()                     # the reset changed bytes ...
    ls = dec.layers[2]                                     # ... only in the ratio-4 frontier rows 4..7
    assert np.array_equal(ls.attn.kv[4:], ls.attn.kv[:4])  # decode: the shift left copies there
    dec.finish_prefill()
    assert dec.to_payload() == payload
    assert not dec.layers[2].attn.kv[4:].any() and np.all(dec.layers[2].attn.score[4:] == -1e30)


@settings(max_examples=6)
@given(ds4.testing.shapes(max_layers=4), st.integers(0, 2**16))
def test_drawn_shapes_run(tmp_path_factory, shape, seed):
    """Any valid small shape (either schedule) runs: finite logits, decode == prefill."""
    path = ds4.testing.write_model(tmp_path_factory.mktemp("drawn") / "m.gguf", shape, seed=seed)
    m = ReferenceModel(path)
    assert m.shape == shape
    prompt = _prompt(9, shape.n_vocab, seed)
    st_ = m.new_state(32)
    logits = m.prefill(st_, prompt)
    assert logits.shape == (shape.n_vocab,) and np.all(np.isfinite(logits))
    dec = m.new_state(32)
    for t in prompt:
        out = m.decode(dec, t)
    assert np.array_equal(out, logits)
