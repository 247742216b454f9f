"""ds4.reference.compare: payload fields, state diffs and logit agreement."""

import math

import numpy as np

from ds4.reference.compare import logit_agreement, payload_fields, state_differences
from ds4.reference.state import ReferenceState
from ds4.shape import ModelShape, flash_ratios


def _state():
    s = ModelShape(n_layer=4, n_embd=256, n_vocab=16, n_head=2, head_dim=192, n_rot=64, n_out_group=1,
                   q_lora_rank=64, o_lora_rank=64, n_expert=4, n_expert_used=2, n_ff_exp=256,
                   n_hash_layer=1, indexer_heads=2, indexer_head_dim=128, indexer_top_k=2,
                   compress_ratios=flash_ratios(4), n_swa=4)
    st_ = ReferenceState(s, 32)
    rng = np.random.default_rng(0)
    for p in range(6):
        st_.tokens.append(p)
        for ls in st_.layers:
            ls.push_raw(rng.standard_normal(192).astype(np.float32))
            if ls.ratio == 4 and (p + 1) % 4 == 0:
                ls.push_comp(rng.standard_normal(192).astype(np.float32))
                ls.push_index(rng.standard_normal(128).astype(np.float32))
        st_.layers[2].attn.kv[p] = p
    st_.logits = rng.standard_normal(16).astype(np.float32)
    return st_


def test_payload_fields_round_trip_the_state():
    st_ = _state()
    fields = payload_fields(st_.to_payload(), st_.shape.compress_ratios)
    for name, arr in st_.payload_arrays():
        assert np.array_equal(fields[name], arr.reshape(-1)), name
    assert fields["header"][7] == 6


def test_state_differences():
    a = _state()
    b = a.copy()
    b.layers[2].attn.score[7, 5] = 1.0          # a sentinel replaced by a value
    b.layers[3].raw[0, 0] += 0.5
    r = a.shape.compress_ratios
    diffs = {d.name: d for d in state_differences(payload_fields(a.to_payload(), r), payload_fields(b.to_payload(), r))}
    assert not diffs["layer2.attn_state_score"].same_sentinels
    assert math.isclose(diffs["layer3.raw"].max_abs, 0.5, rel_tol=1e-6) and diffs["layer3.raw"].n_diff == 1
    assert diffs["layer0.raw"].max_abs == 0 and diffs["layer0.raw"].n_diff == 0
    assert all(d.same_shape for d in diffs.values())


def test_logit_agreement_hand_values():
    a = np.array([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    r = logit_agreement(a, a + 7)  # a constant shift is invisible after centring
    assert r.mean_abs == 0 and r.argmax_agree == 1 and abs(r.mean_kl) < 1e-12
    b = a.copy()
    b[1] = [0.0, 3.0, 0.0]
    r = logit_agreement(a, b)
    assert r.argmax_agree == 0.5 and r.max_abs == 3.0 and r.mean_kl > 0
