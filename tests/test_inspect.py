"""ds4.inspect: round trip of generated files, one broken file per validation rule, memory plan."""

from __future__ import annotations

import math
import re

import gguf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ds4
import ds4.testing as T
from ds4.errors import InvalidArgumentError, ModelFormatError, UnsupportedModelError
from ds4.gguf_header import GGMLType as G
from ds4.gguf_header import GGUFValueType as V
from ds4.shape import FLASH, PRO

P = "deepseek4."


# ---- round trip -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_full(tmp_path_factory):
    return T.write_model(tmp_path_factory.mktemp("full") / "tiny.gguf", "tiny", experts="q2", mtp=True, seed=5)


def test_full_file_round_trip(tiny_full):
    info = ds4.inspect(tiny_full)
    assert info.shape == T.preset("tiny") and info.variant == "custom" and info.arch == "deepseek4"
    assert info.has_mtp and info.routed_bits == 2
    assert info.expert_types == {"gate": "IQ2_XXS", "up": "IQ2_XXS", "down": "Q2_K"}
    assert info.hash_layers == (0, 1, 2) and info.compress_ratios == (0, 0, 4, 128)
    # offsets are absolute and agree with gguf-py's reader
    r = gguf.GGUFReader(tiny_full)
    for t in r.tensors:
        mine = info.tensors[t.name]
        assert (mine.offset, mine.nbytes, mine.dims, mine.type) == \
            (t.data_offset, t.n_bytes, tuple(int(d) for d in t.shape), int(t.tensor_type))
    assert info.weights_bytes == sum(int(t.n_bytes) for t in r.tensors)
    assert info.tokenizer.n_tokens == 512 and info.tokenizer.add_bos_token is True
    assert info.tokenizer.special_ids["bos"] == 0 and not info.tokenizer.missing_specials
    assert "tokenizer.ggml.tokens" not in info.metadata  # big arrays are summarised, not copied
    assert info.metadata[P + "block_count"] == 4


@settings(max_examples=15)
@given(shape=T.shapes(), experts=st.sampled_from(["q2", "q4"]), mtp=st.booleans())
def test_drawn_shapes_round_trip(tmp_path_factory, shape, experts, mtp):
    plan = T.model_plan(shape, experts=experts, mtp=mtp)
    p = T.write_plan(tmp_path_factory.mktemp("rt") / "m.gguf", plan, header_only=True)
    info = ds4.inspect(p)
    assert info.shape == shape
    assert info.has_mtp == mtp
    assert info.routed_bits == (4 if experts == "q4" else 2)
    assert info.hash_layers == tuple(range(shape.n_hash_layer))
    assert {n: (t.dims, t.type) for n, t in info.tensors.items()} == {t.name: (t.dims, t.type) for t in plan.tensors}
    n_params = sum(math.prod(t.dims) for t in plan.tensors)
    assert info.n_params == n_params
    routed = sum(math.prod(t.dims) for t in plan.tensors if t.name.endswith("_exps.weight") and t.name.startswith("blk."))
    mtp_n = sum(math.prod(t.dims) for t in plan.tensors if t.name.startswith("mtp."))
    assert info.n_params_active == n_params - mtp_n - routed + routed * shape.n_expert_used // shape.n_expert


def test_non_flash_pattern_and_mix(tmp_path):
    p = T.write_model(tmp_path / "pro.gguf", "tiny-pro", experts="q4", header_only=True)
    info = ds4.inspect(p)
    assert info.compress_ratios == (128, 128, 4, 128) and info.routed_bits == 4
    assert info.shape.expert_weights_scale == 2.5


# ---- one broken file per rule ---------------------------------------------------------------

def _set(key, value, vtype, subtype=None):
    return lambda plan: plan.set_meta(key, value, vtype, subtype)


def _drop_meta(key):
    return lambda plan: plan.metadata.pop(key)


def _drop_tensor(name):
    return lambda plan: plan.drop_tensor(name)


def _tensor(name, **change):
    def f(plan):
        t = plan.tensor(name)
        for k, v in change.items():
            setattr(t, k, v)
    return f


def _retype_experts(plan):
    plan.tensor("blk.1.ffn_up_exps.weight").type = G.Q2_K


def _rename_token(plan):
    toks = list(plan.metadata["tokenizer.ggml.tokens"].value)
    toks[toks.index("<think>")] = "<thinking>"
    plan.set_meta("tokenizer.ggml.tokens", toks, V.ARRAY, V.STRING)


def _short_vocab(plan):
    toks = list(plan.metadata["tokenizer.ggml.tokens"].value)[:-1]
    plan.set_meta("tokenizer.ggml.tokens", toks, V.ARRAY, V.STRING)


BROKEN = {
    "missing-int-key": (_drop_meta(P + "block_count"), r"deepseek4\.block_count is missing \(expected UINT32\)"),
    "int-as-int32": (_set(P + "expert_count", 8, V.INT32), r"deepseek4\.expert_count has type INT32, expected UINT32"),
    "int-as-u64": (_set(P + "embedding_length", 256, V.UINT64), r"embedding_length has type UINT64, expected UINT32"),
    "float-as-string": (_set(P + "rope.freq_base", "1e4", V.STRING), r"rope\.freq_base has type STRING, expected FLOAT32"),
    "missing-float": (_drop_meta(P + "hyper_connection.epsilon"), r"hyper_connection\.epsilon is missing"),
    "orig-ctx-as-f32": (_set(P + "rope.scaling.original_context_length", 65536.0, V.FLOAT32),
                        r"original_context_length has type FLOAT32, expected UINT32/UINT64"),
    "norm-as-u32": (_set(P + "expert_weights_norm", 1, V.UINT32), r"expert_weights_norm has type UINT32, expected BOOL"),
    "norm-false": (_set(P + "expert_weights_norm", False, V.BOOL), r"expert_weights_norm is false"),
    "clamp-scalar": (_set(P + "swiglu_clamp_exp", 10.0, V.FLOAT32), r"swiglu_clamp_exp has type FLOAT32, expected ARRAY of FLOAT32"),
    "clamp-short": (_set(P + "swiglu_clamp_exp", [10.0] * 3, V.ARRAY, V.FLOAT32), r"swiglu_clamp_exp has 3 entries, expected at least 4"),
    "clamp-uneven": (_set(P + "swiglu_clamp_exp", [10.0, 10.0, 7.0, 10.0], V.ARRAY, V.FLOAT32), r"swiglu_clamp_exp\[2\] = 7"),
    "ratios-f32": (_set(P + "attention.compress_ratios", [0.0, 0.0, 4.0, 128.0], V.ARRAY, V.FLOAT32),
                   r"compress_ratios has type ARRAY of FLOAT32, expected ARRAY of INT32 or ARRAY of UINT32"),
    "ratios-negative": (_set(P + "attention.compress_ratios", [0, -4, 4, 128], V.ARRAY, V.INT32), r"negative entry -4 at layer 1"),
    "ratios-short": (_set(P + "attention.compress_ratios", [0, 0, 4], V.ARRAY, V.INT32), r"compress_ratios has 3 entries"),
    "value-length": (_set(P + "attention.value_length", 128, V.UINT32), r"attention\.value_length = 128, expected 256"),
    "expert-groups": (_set(P + "expert_group_count", 2, V.UINT32), r"expert_group_count = 2, expected 0"),
    "custom-head-128": (lambda p: (p.set_meta(P + "attention.key_length", 128, V.UINT32),
                                   p.set_meta(P + "attention.value_length", 128, V.UINT32)),
                        r"custom shape is inconsistent: head_dim=128 must differ"),
    "custom-embd": (_set(P + "embedding_length", 320, V.UINT32), r"n_embd=320 is not a multiple of 256"),
    "custom-ratio-8": (_set(P + "attention.compress_ratios", [0, 0, 8, 128], V.ARRAY, V.INT32), r"compress ratios \[8\]"),
    "missing-tensor": (_drop_tensor("blk.1.attn_kv.weight"), r"tensor blk\.1\.attn_kv\.weight is missing \(expected Q8_0 \[256, 256\]\)"),
    "missing-global": (_drop_tensor("output.weight"), r"tensor output\.weight is missing"),
    "wrong-dims": (_tensor("blk.0.attn_q_b.weight", dims=(128, 1024)), r"blk\.0\.attn_q_b\.weight has dims \[128, 1024\], expected \[128, 2048\]"),
    "wrong-type": (_tensor("blk.2.attn_q_a.weight", type=G.F16), r"blk\.2\.attn_q_a\.weight has type F16, expected Q8_0"),
    "expert-type": (_tensor("blk.3.ffn_down_exps.weight", type=G.Q8_0), r"ffn_down_exps\.weight has type Q8_0, expected IQ2_XXS/Q2_K/Q4_K"),
    "up-differs-from-gate": (_retype_experts, r"blk\.1\.ffn_up_exps\.weight has type Q2_K, expected IQ2_XXS \(the type of ffn_gate_exps\)"),
    "missing-tid2eid": (_drop_tensor("blk.2.ffn_gate_tid2eid.weight"), r"blk\.2\.ffn_gate_tid2eid\.weight is missing \(expected I32 \[2, 512\]\)"),
    "tid2eid-type": (_tensor("blk.0.ffn_gate_tid2eid.weight", type=G.F32), r"tid2eid\.weight has type F32, expected I32"),
    "missing-compressor": (_drop_tensor("blk.3.attn_compressor_ape.weight"), r"blk\.3\.attn_compressor_ape\.weight is missing \(expected F16 \[256, 128\]\)"),
    "compressor-dims": (_tensor("blk.2.attn_compressor_ape.weight", dims=(256, 4)), r"attn_compressor_ape\.weight has dims \[256, 4\], expected \[512, 4\]"),
    "missing-indexer": (_drop_tensor("blk.2.indexer.proj.weight"), r"blk\.2\.indexer\.proj\.weight is missing"),
    "bias-dims": (_tensor("blk.3.exp_probs_b.bias", dims=(16,)), r"exp_probs_b\.bias has dims \[16\], expected \[8\]"),
    "token-missing": (_rename_token, r"lacks the think token '<think>'"),
    "vocab-size": (_short_vocab, r"tokenizer\.ggml\.tokens has 511 entries, expected 512"),
    "no-merges": (_drop_meta("tokenizer.ggml.merges"), r"tokenizer\.ggml\.merges is missing"),
    "no-arch": (_drop_meta("general.architecture"), r"general\.architecture is missing"),
}


@pytest.fixture(scope="module")
def vocab512():
    return T.tiny_vocab(512)


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_file_is_refused(tmp_path, case, vocab512):
    mutate, match = BROKEN[case]
    plan = T.model_plan("tiny", vocab=vocab512)
    mutate(plan)
    p = T.write_plan(tmp_path / f"{case}.gguf", plan, header_only=True)
    with pytest.raises(ModelFormatError) as e:
        ds4.inspect(p)
    msg = str(e.value)
    assert re.search(match, msg), msg
    assert msg.startswith(str(p))


def test_missing_mtp_tensor(tmp_path):
    plan = T.model_plan("tiny", mtp=True)
    plan.drop_tensor("mtp.0.exp_probs_b.bias")
    plan.drop_tensor("mtp.0.h_proj.weight")
    p = T.write_plan(tmp_path / "mtp.gguf", plan, header_only=True)
    with pytest.raises(ModelFormatError) as e:
        ds4.inspect(p)
    assert "tensor mtp.0.exp_probs_b.bias is missing (expected F32 [8])" in str(e.value)
    assert "tensor mtp.0.h_proj.weight is missing (expected Q8_0 [256, 256])" in str(e.value)


def test_accepted_variations(tmp_path):
    """What upstream also accepts: F64/U32 floats, UINT64 original context, UINT32 ratios, longer
    arrays, F32 'plain' MTP tensors, extra tensors, no router bias."""
    plan = T.model_plan("tiny", mtp=True)
    plan.set_meta(P + "rope.freq_base", 10000.0, V.FLOAT64)
    plan.set_meta(P + "attention.compress_rope_freq_base", 160000, V.UINT32)
    plan.set_meta(P + "rope.scaling.original_context_length", 65536, V.UINT64)
    plan.set_meta(P + "attention.compress_ratios", [0, 0, 4, 128, 4, 4], V.ARRAY, V.UINT32)
    plan.set_meta(P + "swiglu_clamp_exp", [10.0] * 6, V.ARRAY, V.FLOAT64)
    plan.tensor("mtp.0.hc_attn_fn.weight").type = G.F32
    plan.drop_tensor("blk.3.exp_probs_b.bias")
    plan.tensors.append(T.TensorPlan("blk.0.extra.weight", (32,), G.F32, "norm"))
    info = ds4.inspect(T.write_plan(tmp_path / "ok.gguf", plan, header_only=True))
    assert info.shape == T.preset("tiny")
    assert info.extra_tensors == ("blk.0.extra.weight",)


def test_strict_refuses_custom(tmp_path):
    p = T.write_model(tmp_path / "t.gguf", "tiny", header_only=True)
    with pytest.raises(ModelFormatError, match="strict mode accepts only DeepSeek V4 Flash or Pro"):
        ds4.inspect(p, strict=True)


def test_bad_ctx(tmp_path):
    p = T.write_model(tmp_path / "t.gguf", "tiny", header_only=True)
    with pytest.raises(InvalidArgumentError, match="ctx"):
        ds4.inspect(p, ctx=0)


def test_random_header_corruption_raises_model_format_error(tmp_path_factory):
    """Byte flips anywhere in a real model's header: a clean ModelFormatError or a valid result."""
    import random
    src = T.write_model(tmp_path_factory.mktemp("c") / "t.gguf", "tiny", header_only=True)
    raw = src.read_bytes()
    from ds4.gguf_header import read_header
    hdr_end = read_header(src).data_offset
    rng = random.Random(0)
    q = tmp_path_factory.mktemp("c2") / "flip.gguf"
    for _ in range(40):
        b = bytearray(raw)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(hdr_end)] = rng.randrange(256)
        q.write_bytes(bytes(b))
        try:
            ds4.inspect(q)
        except ModelFormatError:
            pass


# ---- official variants ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def flash_plan():
    return T.model_plan("flash")


@pytest.fixture(scope="module")
def flash_file(tmp_path_factory, flash_plan):
    return T.write_plan(tmp_path_factory.mktemp("flash") / "flash.gguf", flash_plan, header_only=True)


def test_flash_is_recognised(flash_file):
    info = ds4.inspect(flash_file, strict=True)
    assert info.variant == "flash" and info.shape == FLASH
    assert info.hash_layers == (0, 1, 2)
    # docs/model.md: 284B total parameters; active = everything but 250/256 of the routed experts
    assert 283e9 < info.n_params < 285e9
    assert info.tokenizer.n_tokens == 129280


@pytest.mark.parametrize("key, value, vtype, match", [
    (P + "expert_weights_scale", 2.5, V.FLOAT32, r"expert_weights_scale = 2\.5, expected 1\.5 for DeepSeek V4 Flash"),
    (P + "attention.layer_norm_rms_epsilon", 1e-5, V.FLOAT32, r"layer_norm_rms_epsilon = 1e-05, expected 1e-06"),
    (P + "attention.indexer.top_k", 1024, V.UINT32, r"indexer\.top_k = 1024, expected 512"),
    (P + "attention.compress_ratios", [128, 128] + [4 if i % 2 == 0 else 128 for i in range(2, 43)], V.ARRAY,
     r"compress_ratios\[0\] = 128, expected 0 \(the Flash compression pattern\)"),
])
def test_flash_checked_exactly(tmp_path, flash_plan, key, value, vtype, match):
    import copy
    plan = copy.copy(flash_plan)
    plan.metadata = dict(flash_plan.metadata)
    plan.set_meta(key, value, vtype, V.INT32 if vtype == V.ARRAY else None)
    with pytest.raises(ModelFormatError, match=match):
        ds4.inspect(T.write_plan(tmp_path / "f.gguf", plan, header_only=True))


def test_flash_float_tolerance(tmp_path, flash_plan):
    import copy
    plan = copy.copy(flash_plan)
    plan.metadata = dict(flash_plan.metadata)
    # inside upstream's 1e-6 * max(1, |expected|) tolerance (and representable in f32)
    plan.set_meta(P + "rope.freq_base", 10000.001, V.FLOAT32)
    assert ds4.inspect(T.write_plan(tmp_path / "f.gguf", plan, header_only=True)).variant == "flash"


def test_pro_is_recognised(tmp_path):
    p = T.write_model(tmp_path / "pro.gguf", "pro", header_only=True)
    info = ds4.inspect(p, strict=True)
    assert info.variant == "pro" and info.shape == PRO
    assert info.compress_ratios[:3] == (128, 128, 4)
    plan = T.model_plan("pro")
    plan.set_meta(P + "expert_weights_scale", 1.5, V.FLOAT32)
    with pytest.raises(ModelFormatError, match=r"expected 2\.5 for DeepSeek V4 Pro"):
        ds4.inspect(T.write_plan(tmp_path / "pro2.gguf", plan, header_only=True))


# ---- memory plan (docs/runtime.md §5.3) ----------------------------------------------------------

def test_flash_memory_plan_at_32768(flash_file):
    m = ds4.inspect(flash_file, ctx=32768).memory
    # hand-computed from docs/runtime.md §5: 43 layers x min(128, ctx) raw rows x 512 floats
    assert m.raw_cap == 128 and m.raw_bytes == 43 * 128 * 512 * 4 == 11_272_192
    # 21 ratio-4 layers: ctx/4+2 rows of 512; 20 ratio-128 layers: ctx/128+2 rows of 512
    assert m.compressed_bytes == 21 * 8194 * 512 * 4 + 20 * 258 * 512 * 4
    # ratio-4 indexer rows: ctx/4+2 rows of 128
    assert m.indexer_bytes == 21 * 8194 * 128 * 4
    # upstream's "compressed" figure (worked value in §5.3)
    assert m.compressed_bytes + m.indexer_bytes == 451_077_120
    # frontiers: kv + score each; 32768 B (ratio-4 attn), 262144 B (ratio 128), 8192 B (indexer)
    assert m.frontier_bytes == 21 * 2 * (32768 + 8192) + 20 * 2 * 262144
    assert m.logits_bytes == 129280 * 4
    # CPU estimate: 441.0 MiB at ctx 32768
    assert m.upstream_estimate_bytes == 11_272_192 + 451_077_120 + (128 + 8194) * 4 + 8194 * 4 + 8194
    assert round(m.upstream_estimate_bytes / 2**20, 1) == 441.0
    assert m.layers[2].indexer_bytes == 8194 * 128 * 4 and m.layers[3].indexer_bytes == 0
    assert m.layers[0].compressed_bytes == 0 and m.layers[0].frontier_bytes == 0
    assert m.weights_bytes == ds4.inspect(flash_file).weights_bytes


def test_memory_plan_follows_the_shape(tmp_path):
    s = T.preset("tiny").replace(n_swa=64)
    m = ds4.inspect(T.write_model(tmp_path / "t.gguf", s, header_only=True), ctx=1000).memory
    assert m.raw_bytes == 4 * 64 * 256 * 4
    assert m.compressed_bytes == (1000 // 4 + 2) * 256 * 4 + (1000 // 128 + 2) * 256 * 4
    assert m.indexer_bytes == (1000 // 4 + 2) * 128 * 4
    small = ds4.inspect(tmp_path / "t.gguf", ctx=10).memory
    assert small.raw_cap == 10


# ---- other architectures --------------------------------------------------------------------

def _v2_lite(tmp_path, split: bool):
    M = T.MetaItem
    a = "deepseek2."
    meta = [
        M("general.architecture", "deepseek2", V.STRING),
        M(a + "block_count", 27, V.UINT32), M(a + "embedding_length", 2048, V.UINT32),
        M(a + "attention.head_count", 16, V.UINT32), M(a + "attention.kv_lora_rank", 512, V.UINT32),
        M(a + "rope.dimension_count", 64, V.UINT32), M(a + "attention.key_length", 192, V.UINT32),
        M(a + "attention.value_length", 128, V.UINT32),
        M("tokenizer.ggml.add_bos_token", True, V.BOOL),
    ]
    tensors = []
    for il in range(27):
        if split:
            tensors += [(f"blk.{il}.attn_k_b.weight", (128, 512, 16), G.F16),
                        (f"blk.{il}.attn_v_b.weight", (512, 128, 16), G.F16)]
        else:
            tensors.append((f"blk.{il}.attn_kv_b.weight", (512, 16 * 256), G.F16))
    return T.write_gguf(tmp_path / f"v2lite-{split}.gguf", meta, tensors)


@pytest.mark.parametrize("split", [True, False])
def test_deepseek_v2_lite(tmp_path, split):
    info = ds4.inspect(_v2_lite(tmp_path, split), ctx=32768)
    assert info.arch == "deepseek2" and info.variant == "deepseek-v2-lite" and info.shape is None
    m = info.mla
    assert (m.split_kv_b, m.legacy_kv_b) == (split, not split)
    # 27 layers x 32768 tokens x (512 + 64) x 2 bytes
    assert m.latent_kv_bytes == 972 * 2**20
    assert (m.legacy_k_bytes, m.legacy_v_bytes) == (5184 * 2**20, 3456 * 2**20)
    assert m.legacy_kv_bytes == 8640 * 2**20
    assert info.tokenizer.add_bos_token is True
    assert "972 MiB" in info.summary() and "8640 MiB" in info.summary()
    with pytest.raises(UnsupportedModelError, match="deepseek2"):
        info.check_supported()
    with pytest.raises(ModelFormatError, match="strict"):
        ds4.inspect(tmp_path / f"v2lite-{split}.gguf", strict=True)


def test_deepseek4_is_supported(tiny_full):
    ds4.inspect(tiny_full).check_supported()


# docs/runtime.md §5.3 worked values (graph backend) and the CPU figure, in MiB to one decimal.
@pytest.mark.parametrize("ctx, backend, mib", [
    (32768, "graph", 751.7), (100000, "graph", 1896.6), (393216, "graph", 6889.7),
    (1048576, "graph", 18049.7), (32768, "cpu", 441.0),
])
def test_upstream_context_estimate(ctx, backend, mib):
    from ds4.memory_plan import context_estimate
    e = context_estimate(FLASH, ctx, backend)
    assert round(e.total / 2**20, 1) == mib


def test_upstream_context_estimate_bytes_at_32768():
    from ds4.memory_plan import context_estimate
    e = context_estimate(FLASH, 32768, "graph")
    assert (e.raw, e.compressed, e.scratch, e.total) == (202_899_456, 451_077_120, 134_250_496, 788_227_072)
    assert (e.prefill_cap, e.raw_cap, e.comp_cap) == (2048, 2304, 8194)
    c = context_estimate(FLASH, 32768, "cpu")
    assert (c.prefill_cap, c.raw_cap, c.comp_cap) == (0, 128, 8194)
    with pytest.raises(InvalidArgumentError):
        context_estimate(FLASH, 10, "tpu")
