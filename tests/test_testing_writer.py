"""ds4.testing.write_model: files read back by gguf's own reader match the DS4 layout."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from gguf import quants

import ds4.testing as T
from ds4.gguf_header import GGMLType
from ds4.layout import mtp_tensor_specs, tensor_specs
from ds4.shape import METADATA_KEYS
from ds4.testing._blocks import pack_q4_k_scales, random_quant


@pytest.fixture(scope="module", params=[("q2", False), ("q4", True)], ids=["q2", "q4-mtp"])
def tiny(request, tmp_path_factory):
    experts, mtp = request.param
    path = T.write_model(tmp_path_factory.mktemp("w") / "tiny.gguf", "tiny", experts=experts, mtp=mtp, seed=3)
    return experts, mtp, path, gguf.GGUFReader(path)


def _field(r: gguf.GGUFReader, key: str):
    f = r.fields[key]
    return f, f.types


def test_every_tensor_matches_layout(tiny):
    experts, mtp, path, r = tiny
    s = T.preset("tiny")
    specs = tensor_specs(s, experts) + (mtp_tensor_specs(s, experts) if mtp else [])
    got = {t.name: t for t in r.tensors}
    required = {sp.name for sp in specs if sp.required}
    assert required <= set(got), sorted(required - set(got))[:5]
    by_name = {sp.name: sp for sp in specs}
    for name, t in got.items():
        sp = by_name[name]
        assert tuple(int(d) for d in t.shape) == sp.dims, name
        assert int(t.tensor_type) == sp.types[0], name


def test_expert_types_follow_the_mix(tiny):
    experts, _, _, r = tiny
    types = {t.name: int(t.tensor_type) for t in r.tensors}
    want = {"q2": (GGMLType.IQ2_XXS, GGMLType.Q2_K), "q4": (GGMLType.Q4_K, GGMLType.Q4_K)}[experts]
    assert types["blk.0.ffn_gate_exps.weight"] == want[0]
    assert types["blk.0.ffn_up_exps.weight"] == want[0]
    assert types["blk.0.ffn_down_exps.weight"] == want[1]


def test_metadata_types_are_the_ones_upstream_requires(tiny):
    _, _, _, r = tiny
    V = gguf.GGUFValueType
    for fld, key in METADATA_KEYS.items():
        f = r.fields["deepseek4." + key]
        if fld == "compress_ratios":
            assert f.types == [V.ARRAY, V.INT32]
            assert [int(f.parts[i][0]) for i in f.data] == [0, 0, 4, 128]
        elif fld == "swiglu_clamp":
            assert f.types == [V.ARRAY, V.FLOAT32] and len(f.data) == 4
        elif fld == "expert_weights_norm":
            assert f.types == [V.BOOL]
        elif isinstance(getattr(T.preset("tiny"), fld), float):
            assert f.types == [V.FLOAT32], key
        else:
            assert f.types == [V.UINT32], key
    assert r.fields["general.architecture"].contents() == "deepseek4"
    assert r.fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert r.fields["tokenizer.ggml.pre"].contents() == "joyai-llm"
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == 512
    for special in ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                    "<think>", "</think>", "｜DSML｜"):
        assert special in tokens
    assert tokens[r.fields["tokenizer.ggml.bos_token_id"].contents()] == "<｜begin▁of▁sentence｜>"


def test_tid2eid_rows_are_distinct_valid_experts(tiny):
    _, _, _, r = tiny
    s = T.preset("tiny")
    t = {t.name: t for t in r.tensors}["blk.1.ffn_gate_tid2eid.weight"]
    ids = np.asarray(t.data).reshape(s.n_vocab, s.n_expert_used)
    assert ids.min() >= 0 and ids.max() < s.n_expert
    assert all(len(set(row)) == s.n_expert_used for row in ids.tolist())
    assert len({tuple(row) for row in ids.tolist()}) > 1  # routing depends on the token


def test_weights_are_finite_and_scaled(tiny):
    _, _, _, r = tiny
    for t in r.tensors:
        if t.tensor_type == GGMLType.I32:
            continue
        w = quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float64)
        assert np.isfinite(w).all(), t.name
        if t.name.endswith(("_exps.weight", "attn_q_b.weight", "attn_kv.weight", "shexp.weight")):
            # fan-in scaling 1/sqrt(ne0); 30% slack for the random block scales of the k-quants
            want = 1.0 / np.sqrt(int(t.shape[0]))
            assert 0.7 * want < w.std() < 1.3 * want, (t.name, w.std(), want)


def test_seed_determines_bytes(tmp_path):
    a = T.write_model(tmp_path / "a.gguf", "tiny", seed=1).read_bytes()
    b = T.write_model(tmp_path / "b.gguf", "tiny", seed=1).read_bytes()
    c = T.write_model(tmp_path / "c.gguf", "tiny", seed=2).read_bytes()
    assert a == b and a != c and len(a) == len(c)


@pytest.mark.parametrize("type_id", [GGMLType.Q2_K, GGMLType.Q4_K, GGMLType.IQ2_XXS])
def test_random_blocks_have_requested_scale(type_id):
    rng = np.random.default_rng(0)
    w = quants.dequantize(random_quant(rng, type_id, (1024, 64), 0.05), type_id)
    # 15%: the per-block scale jitter (0.8..1.2) and estimated code statistics
    assert abs(w.std() - 0.05) < 0.15 * 0.05
    assert abs(w.mean()) < 0.005


def test_q4_k_scale_packing_matches_gguf_dequantizer():
    rng = np.random.default_rng(1)
    sc = rng.integers(0, 64, size=(1, 8), dtype=np.uint8)
    m = rng.integers(0, 64, size=(1, 8), dtype=np.uint8)
    block = np.zeros((1, 144), dtype=np.uint8)
    block[:, 0:2] = np.array([1.0], dtype="<f2").view(np.uint8)
    block[:, 2:4] = np.array([1.0], dtype="<f2").view(np.uint8)
    block[:, 4:16] = pack_q4_k_scales(sc, m)
    block[:, 16:] = 0x21  # low nibble 1, high nibble 2
    w = quants.dequantize(block, GGMLType.Q4_K).reshape(8, 32)
    q = np.array([1, 2] * 4)
    np.testing.assert_array_equal(w[:, 0], sc[0].astype(np.float32) * q - m[0])


def test_header_only_flash_is_sparse(tmp_path):
    p = T.write_model(tmp_path / "flash.gguf", "flash", header_only=True)
    assert p.stat().st_size > 80e9 and p.stat().st_blocks * 512 < 50e6  # a hole, not 80 GB of disk
    from ds4.gguf_header import read_header  # gguf-py's reader takes seconds on 129k tokens
    names = set(read_header(p).tensors)
    assert {sp.name for sp in tensor_specs(T.preset("flash")) if sp.required} <= names


@settings(max_examples=8)
@given(shape=T.shapes(max_layers=3), experts=st.sampled_from(["q2", "q4"]), mtp=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_drawn_shapes_write_full_data(tmp_path_factory, shape, experts, mtp, seed):
    p = T.write_model(tmp_path_factory.mktemp("d") / "m.gguf", shape, experts=experts, mtp=mtp, seed=seed)
    r = gguf.GGUFReader(p)
    specs = {sp.name: sp for sp in tensor_specs(shape, experts) + (mtp_tensor_specs(shape, experts) if mtp else [])}
    assert {sp.name for sp in specs.values() if sp.required} <= {t.name for t in r.tensors}
    for t in r.tensors:
        assert tuple(int(d) for d in t.shape) == specs[t.name].dims
        if t.tensor_type != GGMLType.I32:
            assert np.isfinite(quants.dequantize(np.asarray(t.data), t.tensor_type)).all(), t.name
