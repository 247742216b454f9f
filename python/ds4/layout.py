"""The DS4 tensor inventory (docs/model.md §2) as data, derived from a :class:`~ds4.shape.ModelShape`.

One list of :class:`TensorSpec` serves both the synthetic-model writer (``ds4.testing``) and the
validator (``ds4.inspection``), so the two can never disagree about a name, a dimension or a type.

    >>> from ds4.shape import FLASH
    >>> spec = {s.name: s for s in tensor_specs(FLASH)}["blk.2.attn_compressor_ape.weight"]
    >>> spec.dims, [GGMLType(t).name for t in spec.types]
    ((1024, 4), ['F16'])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .gguf_header import GGMLType
from .shape import ModelShape

__all__ = [
    "TensorSpec",
    "ExpertMix",
    "ROUTED_TYPES",
    "EXPERT_MIXES",
    "tensor_specs",
    "mtp_tensor_specs",
    "layer_tensor_specs",
    "shape_problems",
    "range_problems",
    "INT_LIMITS",
    "FLOAT_LIMITS",
]

ExpertMix = Literal["q2", "q4"]

F32, F16, Q8_0, I32 = GGMLType.F32, GGMLType.F16, GGMLType.Q8_0, GGMLType.I32
ROUTED_TYPES: tuple[int, ...] = (GGMLType.IQ2_XXS, GGMLType.Q2_K, GGMLType.Q4_K)

# (gate/up type, down type) of each routed-expert mix upstream ships.
EXPERT_MIXES: dict[str, tuple[int, int]] = {
    "q2": (GGMLType.IQ2_XXS, GGMLType.Q2_K),
    "q4": (GGMLType.Q4_K, GGMLType.Q4_K),
}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor the engine binds.

    ``types`` lists the ggml type ids the engine accepts (the writer uses the first); ``role``
    tells the writer how to initialise it (``"proj"``, ``"norm"``, ``"hc_fn"`` ...). Optional
    tensors are validated when present.
    """

    name: str
    dims: tuple[int, ...]
    types: tuple[int, ...]
    role: str
    required: bool = True

    @property
    def fan_in(self) -> int:
        return self.dims[0]


def _routed(experts: ExpertMix | None, which: str) -> tuple[int, ...]:
    if experts is None:
        return ROUTED_TYPES
    try:
        gate, down = EXPERT_MIXES[experts]
    except KeyError:
        raise ValueError(f"unknown expert mix {experts!r}, expected one of {sorted(EXPERT_MIXES)}") from None
    return (down,) if which == "down" else (gate,)


def _attention_ffn_common(p: str, s: ModelShape, experts: ExpertMix | None,
                          plain: tuple[int, ...]) -> list[TensorSpec]:
    """Tensors shared by every layer and the MTP block (attention + FFN + their HC mixers)."""
    T = TensorSpec
    return [
        T(f"{p}.hc_attn_fn.weight", (s.hc_dim, s.hc_mix), plain, "hc_fn"),
        T(f"{p}.hc_attn_scale.weight", (3,), (F32,), "hc_scale"),
        T(f"{p}.hc_attn_base.weight", (s.hc_mix,), (F32,), "hc_base"),
        T(f"{p}.attn_norm.weight", (s.n_embd,), (F32,), "norm"),
        T(f"{p}.attn_q_a.weight", (s.n_embd, s.q_lora_rank), (Q8_0,), "proj"),
        T(f"{p}.attn_q_a_norm.weight", (s.q_lora_rank,), (F32,), "norm"),
        T(f"{p}.attn_q_b.weight", (s.q_lora_rank, s.q_dim), (Q8_0,), "proj"),
        T(f"{p}.attn_kv.weight", (s.n_embd, s.head_dim), (Q8_0,), "proj"),
        T(f"{p}.attn_kv_a_norm.weight", (s.head_dim,), (F32,), "norm"),
        T(f"{p}.attn_sinks.weight", (s.n_head,), (F32,), "sinks"),
        T(f"{p}.attn_output_a.weight", (s.group_dim, s.out_low_dim), (Q8_0,), "proj"),
        T(f"{p}.attn_output_b.weight", (s.out_low_dim, s.n_embd), (Q8_0,), "proj"),
        T(f"{p}.hc_ffn_fn.weight", (s.hc_dim, s.hc_mix), plain, "hc_fn"),
        T(f"{p}.hc_ffn_scale.weight", (3,), (F32,), "hc_scale"),
        T(f"{p}.hc_ffn_base.weight", (s.hc_mix,), (F32,), "hc_base"),
        T(f"{p}.ffn_norm.weight", (s.n_embd,), (F32,), "norm"),
        T(f"{p}.ffn_gate_inp.weight", (s.n_embd, s.n_expert), plain, "router"),
        T(f"{p}.ffn_gate_exps.weight", (s.n_embd, s.n_ff_exp, s.n_expert), _routed(experts, "gate"), "experts"),
        T(f"{p}.ffn_up_exps.weight", (s.n_embd, s.n_ff_exp, s.n_expert), _routed(experts, "up"), "experts"),
        T(f"{p}.ffn_down_exps.weight", (s.n_ff_exp, s.n_embd, s.n_expert), _routed(experts, "down"), "experts"),
        T(f"{p}.ffn_gate_shexp.weight", (s.n_embd, s.n_ff_exp), (Q8_0,), "proj"),
        T(f"{p}.ffn_up_shexp.weight", (s.n_embd, s.n_ff_exp), (Q8_0,), "proj"),
        T(f"{p}.ffn_down_shexp.weight", (s.n_ff_exp, s.n_embd), (Q8_0,), "proj"),
    ]


def layer_tensor_specs(s: ModelShape, il: int, experts: ExpertMix | None = None) -> list[TensorSpec]:
    """Tensors of layer ``il`` (docs/model.md §2.2), conditional ones included where they apply."""
    T = TensorSpec
    p = f"blk.{il}"
    specs = _attention_ffn_common(p, s, experts, (F16,))
    if s.is_hash_layer(il):
        specs.append(T(f"{p}.ffn_gate_tid2eid.weight", (s.n_expert_used, s.n_vocab), (I32,), "tid2eid"))
    # Upstream accepts the bias on any layer; hash layers ignore it, so it is optional everywhere.
    specs.append(T(f"{p}.exp_probs_b.bias", (s.n_expert,), (F32,), "probs_bias", required=False))
    ratio = s.compress_ratio(il)
    if ratio:
        width = s.coff(ratio) * s.head_dim
        specs += [
            T(f"{p}.attn_compressor_ape.weight", (width, ratio), (F16,), "ape"),
            T(f"{p}.attn_compressor_kv.weight", (s.n_embd, width), (F16,), "proj"),
            T(f"{p}.attn_compressor_gate.weight", (s.n_embd, width), (F16,), "proj"),
            T(f"{p}.attn_compressor_norm.weight", (s.head_dim,), (F32,), "norm"),
        ]
    if ratio == 4:
        iwidth = s.coff(ratio) * s.indexer_head_dim
        specs += [
            T(f"{p}.indexer.attn_q_b.weight", (s.q_lora_rank, s.index_q_dim), (F16,), "proj"),
            T(f"{p}.indexer.proj.weight", (s.n_embd, s.indexer_heads), (F16,), "proj"),
            T(f"{p}.indexer_compressor_ape.weight", (iwidth, ratio), (F16,), "ape"),
            T(f"{p}.indexer_compressor_kv.weight", (s.n_embd, iwidth), (F16,), "proj"),
            T(f"{p}.indexer_compressor_gate.weight", (s.n_embd, iwidth), (F16,), "proj"),
            T(f"{p}.indexer_compressor_norm.weight", (s.indexer_head_dim,), (F32,), "norm"),
        ]
    return specs


def tensor_specs(s: ModelShape, experts: ExpertMix | None = None) -> list[TensorSpec]:
    """Every tensor of the main model (docs/model.md §2.1-§2.2), in file order.

    With ``experts=None`` the routed-expert specs accept any routed type (validation); with
    ``"q2"``/``"q4"`` they name exactly the mix's types (writing).
    """
    T = TensorSpec
    specs = [
        T("token_embd.weight", (s.n_embd, s.n_vocab), (F16,), "embd"),
        T("output_hc_base.weight", (s.n_hc,), (F32,), "out_hc_base"),
        T("output_hc_fn.weight", (s.hc_dim, s.n_hc), (F16,), "hc_fn"),
        T("output_hc_scale.weight", (1,), (F32,), "hc_scale"),
        T("output_norm.weight", (s.n_embd,), (F32,), "norm"),
        T("output.weight", (s.n_embd, s.n_vocab), (Q8_0,), "output"),
    ]
    for il in range(s.n_layer):
        specs += layer_tensor_specs(s, il, experts)
    return specs


def mtp_tensor_specs(s: ModelShape, experts: ExpertMix | None = None) -> list[TensorSpec]:
    """The ``mtp.0.*`` block (docs/model.md §2.3). "plain" tensors accept F16 or F32 (F16 written)."""
    T = TensorSpec
    plain = (F16, F32)
    p = "mtp.0"
    specs = [
        T(f"{p}.hc_head_base.weight", (s.n_hc,), (F32,), "out_hc_base"),
        T(f"{p}.hc_head_fn.weight", (s.hc_dim, s.n_hc), plain, "hc_fn"),
        T(f"{p}.hc_head_scale.weight", (1,), (F32,), "hc_scale"),
        T(f"{p}.e_proj.weight", (s.n_embd, s.n_embd), (Q8_0,), "proj"),
        T(f"{p}.h_proj.weight", (s.n_embd, s.n_embd), (Q8_0,), "proj"),
        T(f"{p}.enorm.weight", (s.n_embd,), (F32,), "norm"),
        T(f"{p}.hnorm.weight", (s.n_embd,), (F32,), "norm"),
        T(f"{p}.norm.weight", (s.n_embd,), (F32,), "norm"),
    ]
    specs += _attention_ffn_common(p, s, experts, plain)
    specs.append(T(f"{p}.exp_probs_b.bias", (s.n_expert,), (F32,), "probs_bias"))
    return specs


def shape_problems(s: ModelShape) -> list[str]:
    """Why ``s`` cannot be a DS4 model the engine runs (empty when it can).

    These are the limits of the DS4 math and block formats: the FP8 KV round trip works on 64-wide
    blocks of the non-RoPE dims, the indexer is fixed at 128-wide heads (and the attention head_dim
    must differ from it, because the compressor picks its KV format by comparing widths), routed
    expert rows are whole 256-element k-quant blocks and Q8_0 rows whole 32-element blocks.
    """
    p: list[str] = []
    ints = {k: getattr(s, k) for k in ("n_layer", "n_embd", "n_vocab", "n_head", "head_dim", "n_rot",
                                       "n_out_group", "q_lora_rank", "o_lora_rank", "n_expert",
                                       "n_expert_used", "n_ff_exp", "indexer_heads", "indexer_head_dim",
                                       "indexer_top_k", "n_swa", "n_hc", "sinkhorn_iters")}
    for k, v in ints.items():
        if v < 1:
            p.append(f"{k}={v} must be positive")
    if p:
        return p
    p = range_problems(s)
    if p:
        return p
    if len(s.compress_ratios) != s.n_layer:
        p.append(f"{len(s.compress_ratios)} compress ratios for {s.n_layer} layers")
    bad = sorted({r for r in s.compress_ratios if r not in (0, 4, 128)})
    if bad:
        p.append(f"compress ratios {bad} are not 0, 4 or 128")
    if s.n_embd % 256:
        p.append(f"n_embd={s.n_embd} is not a multiple of 256")
    if s.n_ff_exp % 256:
        p.append(f"n_ff_exp={s.n_ff_exp} is not a multiple of 256")
    if s.n_hc != 4:
        p.append(f"n_hc={s.n_hc}, expected 4")
    if s.n_head_kv != 1:
        p.append(f"n_head_kv={s.n_head_kv}, expected 1")
    if s.n_expert_shared != 1:
        p.append(f"n_expert_shared={s.n_expert_shared}, expected 1")
    if s.indexer_head_dim != 128:
        p.append(f"indexer_head_dim={s.indexer_head_dim}, expected 128")
    if s.n_rot % 2 or s.n_rot >= s.head_dim:
        p.append(f"n_rot={s.n_rot} must be even and below head_dim={s.head_dim}")
    elif (s.head_dim - s.n_rot) % 64:
        p.append(f"head_dim-n_rot={s.head_dim - s.n_rot} is not a multiple of 64")
    if s.head_dim == s.indexer_head_dim:
        p.append(f"head_dim={s.head_dim} must differ from the indexer head dim {s.indexer_head_dim}")
    if s.n_head % s.n_out_group:
        p.append(f"n_head={s.n_head} is not a multiple of n_out_group={s.n_out_group}")
    if s.q_lora_rank % 32:
        p.append(f"q_lora_rank={s.q_lora_rank} is not a multiple of 32")
    if s.out_low_dim % 32:
        p.append(f"n_out_group*o_lora_rank={s.out_low_dim} is not a multiple of 32")
    if s.n_expert_used > s.n_expert:
        p.append(f"n_expert_used={s.n_expert_used} exceeds n_expert={s.n_expert}")
    if s.n_hash_layer < 0 or s.n_hash_layer > s.n_layer:
        p.append(f"n_hash_layer={s.n_hash_layer} is outside 0..n_layer={s.n_layer}")
    return p


# What a DS4 model can mean, per metadata value (docs/robustness.md). Every size the core allocates
# or loops over from is bounded here before anything is allocated: the upper limits are far above
# Flash and Pro (n_layer 61, n_embd 7168, n_expert 384, sinkhorn 20 ...) yet keep any one buffer
# or loop of a token in the range a machine can run. Integer limits are inclusive.
INT_LIMITS: dict[str, tuple[int, int]] = {
    "n_layer": (1, 512),
    "n_embd": (1, 65536),
    "n_vocab": (1, 1 << 24),
    "n_head": (1, 1024),
    "head_dim": (1, 4096),
    "n_rot": (1, 4096),
    "n_out_group": (1, 1024),
    "q_lora_rank": (1, 65536),
    "o_lora_rank": (1, 65536),
    "n_expert": (1, 4096),
    "n_expert_used": (1, 4096),
    "n_ff_exp": (1, 65536),
    "n_hash_layer": (0, 512),
    "indexer_heads": (1, 1024),
    "indexer_head_dim": (1, 4096),
    "indexer_top_k": (1, 1 << 20),
    "n_swa": (1, 1 << 20),
    "n_hc": (1, 16),
    # The Sinkhorn normalisation of the HC mixer runs this many sweeps per token and layer: the
    # models use 20; 2**31-1 passed load and hung the first sync.
    "sinkhorn_iters": (1, 1000),
    "rope_orig_ctx": (1, 2**31 - 1),
    "n_head_kv": (1, 1024),
    "n_expert_shared": (1, 1024),
}

# (low, high, low is exclusive): finite values only. Epsilons are small positive numbers; RoPE
# bases are above 1 (a base <= 1 has no decaying frequencies); a float stored under an integer
# type is read as that integer, so a float's bit pattern in a UINT32 (10000.0f reads 1176256512)
# lands outside these bounds and is refused.
FLOAT_LIMITS: dict[str, tuple[float, float, bool]] = {
    "rms_eps": (0.0, 0.1, True),
    "hc_eps": (0.0, 0.1, True),
    "expert_weights_scale": (0.0, 1000.0, True),
    "swiglu_clamp": (0.0, 1.0e6, True),
    "rope_freq_base": (1.0, 1.0e8, True),
    "rope_scale_factor": (1.0, 1.0e4, False),
    "yarn_beta_fast": (0.0, 1.0e4, True),
    "yarn_beta_slow": (0.0, 1.0e4, True),
    "compress_rope_freq_base": (1.0, 1.0e8, True),
}


def range_problems(s: ModelShape) -> list[str]:
    """Values of ``s`` outside what a DS4 model can mean (:data:`INT_LIMITS`, :data:`FLOAT_LIMITS`)."""
    import math

    p: list[str] = []
    for k, (lo, hi) in INT_LIMITS.items():
        v = getattr(s, k)
        if not lo <= v <= hi:
            p.append(f"{k}={v} is outside {lo}..{hi}")
    for k, (lo, hi, open_lo) in FLOAT_LIMITS.items():
        v = getattr(s, k)
        if not math.isfinite(v) or (v <= lo if open_lo else v < lo) or v > hi:
            p.append(f"{k}={v} is outside {'(' if open_lo else '['}{lo:g}, {hi:g}]")
    return p
