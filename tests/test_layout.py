"""ds4.layout: the tensor inventory against docs/model.md §2's Flash tables (values typed in by hand)."""

from __future__ import annotations

import pytest

from ds4.gguf_header import GGMLType as G
from ds4.layout import ROUTED_TYPES, mtp_tensor_specs, shape_problems, tensor_specs
from ds4.shape import FLASH, PRO
from ds4.testing import PRESETS

FLASH_SPECS = {s.name: s for s in tensor_specs(FLASH)}

# (name, type, dims) rows of docs/model.md §2.1-§2.2 with Flash values.
FLASH_TABLE = [
    ("token_embd.weight", G.F16, (4096, 129280)),
    ("output_hc_base.weight", G.F32, (4,)),
    ("output_hc_fn.weight", G.F16, (16384, 4)),
    ("output_hc_scale.weight", G.F32, (1,)),
    ("output_norm.weight", G.F32, (4096,)),
    ("output.weight", G.Q8_0, (4096, 129280)),
    ("blk.7.hc_attn_fn.weight", G.F16, (16384, 24)),
    ("blk.7.hc_attn_scale.weight", G.F32, (3,)),
    ("blk.7.hc_attn_base.weight", G.F32, (24,)),
    ("blk.7.attn_norm.weight", G.F32, (4096,)),
    ("blk.7.attn_q_a.weight", G.Q8_0, (4096, 1024)),
    ("blk.7.attn_q_a_norm.weight", G.F32, (1024,)),
    ("blk.7.attn_q_b.weight", G.Q8_0, (1024, 32768)),
    ("blk.7.attn_kv.weight", G.Q8_0, (4096, 512)),
    ("blk.7.attn_kv_a_norm.weight", G.F32, (512,)),
    ("blk.7.attn_sinks.weight", G.F32, (64,)),
    ("blk.7.attn_output_a.weight", G.Q8_0, (4096, 8192)),
    ("blk.7.attn_output_b.weight", G.Q8_0, (8192, 4096)),
    ("blk.7.hc_ffn_fn.weight", G.F16, (16384, 24)),
    ("blk.7.ffn_norm.weight", G.F32, (4096,)),
    ("blk.7.ffn_gate_inp.weight", G.F16, (4096, 256)),
    ("blk.7.ffn_gate_shexp.weight", G.Q8_0, (4096, 2048)),
    ("blk.7.ffn_down_shexp.weight", G.Q8_0, (2048, 4096)),
    ("blk.7.exp_probs_b.bias", G.F32, (256,)),
    ("blk.2.ffn_gate_tid2eid.weight", G.I32, (6, 129280)),
    ("blk.2.attn_compressor_ape.weight", G.F16, (1024, 4)),
    ("blk.3.attn_compressor_ape.weight", G.F16, (512, 128)),
    ("blk.2.attn_compressor_kv.weight", G.F16, (4096, 1024)),
    ("blk.3.attn_compressor_gate.weight", G.F16, (4096, 512)),
    ("blk.3.attn_compressor_norm.weight", G.F32, (512,)),
    ("blk.4.indexer.attn_q_b.weight", G.F16, (1024, 8192)),
    ("blk.4.indexer.proj.weight", G.F16, (4096, 64)),
    ("blk.4.indexer_compressor_ape.weight", G.F16, (256, 4)),
    ("blk.4.indexer_compressor_kv.weight", G.F16, (4096, 256)),
    ("blk.4.indexer_compressor_gate.weight", G.F16, (4096, 256)),
    ("blk.4.indexer_compressor_norm.weight", G.F32, (128,)),
]


@pytest.mark.parametrize("name, type_id, dims", FLASH_TABLE, ids=[r[0] for r in FLASH_TABLE])
def test_flash_table(name, type_id, dims):
    spec = FLASH_SPECS[name]
    assert spec.dims == dims and spec.types == (type_id,)


def test_flash_counts():
    # 6 globals + 43 x 23 always-present + 3 tid2eid + 41 compressed x 4 + 21 ratio-4 x 6 indexer
    required = [s for s in FLASH_SPECS.values() if s.required]
    assert len(required) == 6 + 43 * 23 + 3 + 41 * 4 + 21 * 6
    optional = [s.name for s in FLASH_SPECS.values() if not s.required]
    assert optional == [f"blk.{il}.exp_probs_b.bias" for il in range(43)]


def test_conditional_tensors_follow_ratio_and_hash():
    names = set(FLASH_SPECS)
    assert "blk.0.attn_compressor_kv.weight" not in names and "blk.1.indexer.proj.weight" not in names
    assert "blk.3.indexer.proj.weight" not in names and "blk.3.attn_compressor_kv.weight" in names
    assert "blk.3.ffn_gate_tid2eid.weight" not in names and "blk.2.ffn_gate_tid2eid.weight" in names
    pro = {s.name for s in tensor_specs(PRO)}
    assert "blk.0.attn_compressor_ape.weight" in pro and "blk.0.indexer.proj.weight" not in pro


def test_routed_expert_types():
    assert FLASH_SPECS["blk.5.ffn_gate_exps.weight"].types == ROUTED_TYPES
    assert FLASH_SPECS["blk.5.ffn_down_exps.weight"].dims == (2048, 4096, 256)
    q2 = {s.name: s for s in tensor_specs(FLASH, "q2")}
    q4 = {s.name: s for s in tensor_specs(FLASH, "q4")}
    assert q2["blk.5.ffn_up_exps.weight"].types == (G.IQ2_XXS,)
    assert q2["blk.5.ffn_down_exps.weight"].types == (G.Q2_K,)
    assert {q4[f"blk.5.ffn_{k}_exps.weight"].types for k in ("gate", "up", "down")} == {(G.Q4_K,)}
    with pytest.raises(ValueError, match="q3"):
        tensor_specs(FLASH, "q3")  # type: ignore[arg-type]


def test_mtp_specs():
    m = {s.name: s for s in mtp_tensor_specs(FLASH)}
    assert len(m) == 8 + 23 + 1
    assert m["mtp.0.e_proj.weight"].dims == (4096, 4096) and m["mtp.0.e_proj.weight"].types == (G.Q8_0,)
    assert m["mtp.0.hc_head_fn.weight"].types == (G.F16, G.F32)
    assert m["mtp.0.exp_probs_b.bias"].required
    assert not any("tid2eid" in n or "compressor" in n or "indexer" in n for n in m)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid(name):
    assert shape_problems(PRESETS[name]) == []


def test_tiny_is_the_upstream_validation_shape():
    t = PRESETS["tiny"]
    assert (t.n_layer, t.compress_ratios, t.n_embd, t.n_vocab, t.n_head, t.head_dim, t.n_rot) == \
        (4, (0, 0, 4, 128), 256, 512, 8, 256, 64)
    assert (t.n_out_group, t.q_lora_rank, t.o_lora_rank, t.n_expert, t.n_expert_used, t.n_ff_exp) == \
        (2, 128, 128, 8, 2, 256)
    assert (t.n_hash_layer, t.indexer_heads, t.indexer_head_dim, t.indexer_top_k) == (3, 4, 128, 8)
    assert PRESETS["tiny-pro"].compress_ratios == (128, 128, 4, 128)
    assert PRESETS["tiny-pro"].expert_weights_scale == 2.5


TINY = PRESETS["tiny"]


@pytest.mark.parametrize("change, match", [
    (dict(head_dim=128, n_rot=64), "must differ from the indexer head dim"),
    (dict(head_dim=288), "head_dim-n_rot=224 is not a multiple of 64"),
    (dict(n_rot=63), "n_rot=63 must be even"),
    (dict(n_embd=320), "n_embd=320 is not a multiple of 256"),
    (dict(n_ff_exp=128), "n_ff_exp=128 is not a multiple of 256"),
    (dict(n_hc=3), "n_hc=3, expected 4"),
    (dict(indexer_head_dim=64), "indexer_head_dim=64, expected 128"),
    (dict(n_out_group=3), "n_head=8 is not a multiple of n_out_group=3"),
    (dict(q_lora_rank=80), "q_lora_rank=80 is not a multiple of 32"),
    (dict(n_expert_used=9), "n_expert_used=9 exceeds n_expert=8"),
    (dict(n_hash_layer=5), "n_hash_layer=5 is outside"),
    (dict(compress_ratios=(0, 0, 4)), "3 compress ratios for 4 layers"),
    (dict(compress_ratios=(0, 0, 8, 128)), r"compress ratios \[8\]"),
    (dict(n_head_kv=2), "n_head_kv=2"),
    (dict(n_layer=0, compress_ratios=()), "n_layer=0 must be positive"),
])
def test_shape_problems(change, match):
    import re
    problems = shape_problems(TINY.replace(**change))
    assert any(re.search(match, p) for p in problems), problems
