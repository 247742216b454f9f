"""The DeepSeek V4 model shape: every size and hyper-parameter the engine needs, as data.

Flash and Pro are two values of :class:`ModelShape`; synthetic test models are others. The shape is
read from GGUF metadata once (``ds4.inspection``), validated, and then passed to every component
(the C++ core, the numpy reference, the synthetic-model writer) so no size is a scattered constant.

    >>> from ds4.shape import FLASH
    >>> FLASH.compress_ratio(2), FLASH.compress_ratio(3), FLASH.hc_dim
    (4, 128, 16384)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelShape", "FLASH", "PRO", "METADATA_KEYS", "flash_ratios", "pro_ratios", "ARCH"]

ARCH = "deepseek4"


def flash_ratios(n_layer: int) -> tuple[int, ...]:
    """Flash compression pattern: layers 0-1 uncompressed, then even -> 4, odd -> 128."""
    return tuple(0 if il < 2 else (4 if il % 2 == 0 else 128) for il in range(n_layer))


def pro_ratios(n_layer: int) -> tuple[int, ...]:
    """Pro compression pattern: layers 0-1 ratio 128, then even -> 4, odd -> 128."""
    return tuple(128 if il < 2 else (4 if il % 2 == 0 else 128) for il in range(n_layer))


@dataclass(frozen=True)
class ModelShape:
    """Sizes and hyper-parameters of a DeepSeek V4 model (GGUF keys under ``deepseek4.``)."""

    n_layer: int
    n_embd: int
    n_vocab: int
    n_head: int
    head_dim: int                 # attention.key_length (== value_length; K and V share the vector)
    n_rot: int                    # rope.dimension_count: RoPE'd tail of every head
    n_out_group: int              # attention.output_group_count
    q_lora_rank: int
    o_lora_rank: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_hash_layer: int
    indexer_heads: int
    indexer_head_dim: int
    indexer_top_k: int
    compress_ratios: tuple[int, ...]
    n_head_kv: int = 1
    n_expert_shared: int = 1
    n_swa: int = 128
    n_hc: int = 4
    sinkhorn_iters: int = 20
    rms_eps: float = 1e-6
    hc_eps: float = 1e-6
    expert_weights_scale: float = 1.5
    expert_weights_norm: bool = True
    swiglu_clamp: float = 10.0
    rope_freq_base: float = 10000.0
    rope_scale_factor: float = 16.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    rope_orig_ctx: int = 65536
    compress_rope_freq_base: float = 160000.0

    # ---- derived sizes (docs/model.md §1.3) ----
    @property
    def value_dim(self) -> int:
        return self.head_dim

    @property
    def hc_dim(self) -> int:
        return self.n_embd * self.n_hc

    @property
    def hc_mix(self) -> int:
        return 2 * self.n_hc + self.n_hc * self.n_hc

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def n_nope(self) -> int:
        return self.head_dim - self.n_rot

    @property
    def group_heads(self) -> int:
        return self.n_head // self.n_out_group

    @property
    def group_dim(self) -> int:
        return self.head_dim * self.group_heads

    @property
    def out_low_dim(self) -> int:
        return self.n_out_group * self.o_lora_rank

    @property
    def index_q_dim(self) -> int:
        return self.indexer_heads * self.indexer_head_dim

    def compress_ratio(self, il: int) -> int:
        return self.compress_ratios[il]

    @staticmethod
    def coff(ratio: int) -> int:
        """Lanes of a compressor: ratio-4 layers keep two overlapping windows."""
        return 2 if ratio == 4 else 1

    def is_hash_layer(self, il: int) -> bool:
        return il < self.n_hash_layer

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["compress_ratios"] = list(self.compress_ratios)
        return d

    def replace(self, **changes: Any) -> "ModelShape":
        return dataclasses.replace(self, **changes)


# GGUF metadata key (without the "deepseek4." prefix) for every field stored in the file.
METADATA_KEYS: dict[str, str] = {
    "n_layer": "block_count",
    "n_embd": "embedding_length",
    "n_vocab": "vocab_size",
    "n_head": "attention.head_count",
    "n_head_kv": "attention.head_count_kv",
    "head_dim": "attention.key_length",       # attention.value_length must equal it
    "n_rot": "rope.dimension_count",
    "n_out_group": "attention.output_group_count",
    "q_lora_rank": "attention.q_lora_rank",
    "o_lora_rank": "attention.output_lora_rank",
    "n_expert": "expert_count",
    "n_expert_used": "expert_used_count",
    "n_expert_shared": "expert_shared_count",
    "n_ff_exp": "expert_feed_forward_length",
    "n_hash_layer": "hash_layer_count",
    "n_swa": "attention.sliding_window",
    "indexer_heads": "attention.indexer.head_count",
    "indexer_head_dim": "attention.indexer.key_length",
    "indexer_top_k": "attention.indexer.top_k",
    "n_hc": "hyper_connection.count",
    "sinkhorn_iters": "hyper_connection.sinkhorn_iterations",
    "compress_ratios": "attention.compress_ratios",
    "rms_eps": "attention.layer_norm_rms_epsilon",
    "hc_eps": "hyper_connection.epsilon",
    "expert_weights_scale": "expert_weights_scale",
    "expert_weights_norm": "expert_weights_norm",
    "swiglu_clamp": "swiglu_clamp_exp",       # an array, one entry per layer, all equal
    "rope_freq_base": "rope.freq_base",
    "rope_scale_factor": "rope.scaling.factor",
    "yarn_beta_fast": "rope.scaling.yarn_beta_fast",
    "yarn_beta_slow": "rope.scaling.yarn_beta_slow",
    "rope_orig_ctx": "rope.scaling.original_context_length",
    "compress_rope_freq_base": "attention.compress_rope_freq_base",
}

FLASH = ModelShape(
    n_layer=43, n_embd=4096, n_vocab=129280, n_head=64, head_dim=512, n_rot=64, n_out_group=8,
    q_lora_rank=1024, o_lora_rank=1024, n_expert=256, n_expert_used=6, n_ff_exp=2048,
    n_hash_layer=3, indexer_heads=64, indexer_head_dim=128, indexer_top_k=512,
    compress_ratios=flash_ratios(43), expert_weights_scale=1.5,
)

# Pro sizes come from a later upstream version; its scalar hyper-parameters other than the
# expert weight scale are not pinned by our source, so they default to Flash's (inspect checks the
# integer shape exactly and reports the rest).
PRO = ModelShape(
    n_layer=61, n_embd=7168, n_vocab=129280, n_head=128, head_dim=512, n_rot=64, n_out_group=16,
    q_lora_rank=1536, o_lora_rank=1024, n_expert=384, n_expert_used=6, n_ff_exp=3072,
    n_hash_layer=3, indexer_heads=64, indexer_head_dim=128, indexer_top_k=1024,
    compress_ratios=pro_ratios(61), expert_weights_scale=2.5,
)
