"""Named synthetic shapes and a hypothesis strategy drawing valid small ones."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgumentError
from ..shape import FLASH, PRO, ModelShape, flash_ratios, pro_ratios

__all__ = ["PRESETS", "preset", "shapes"]

# The shape upstream's validation used (docs/model.md §9), with the real Flash scalar hyper-parameters.
TINY = ModelShape(
    n_layer=4, n_embd=256, n_vocab=512, n_head=8, head_dim=256, n_rot=64, n_out_group=2,
    q_lora_rank=128, o_lora_rank=128, n_expert=8, n_expert_used=2, n_ff_exp=256,
    n_hash_layer=3, indexer_heads=4, indexer_head_dim=128, indexer_top_k=8,
    compress_ratios=flash_ratios(4), n_expert_shared=1, n_swa=128, n_hc=4, sinkhorn_iters=20,
    expert_weights_scale=1.5,
)

PRESETS: dict[str, ModelShape] = {
    "tiny": TINY,
    "tiny-pro": TINY.replace(compress_ratios=pro_ratios(4), expert_weights_scale=2.5),
    "tiny6": TINY.replace(n_layer=6, compress_ratios=flash_ratios(6)),
    # Flash proportions at about 1 GB, with the real 129280-token vocabulary.
    "small": ModelShape(
        n_layer=8, n_embd=1024, n_vocab=129280, n_head=16, head_dim=512, n_rot=64, n_out_group=4,
        q_lora_rank=512, o_lora_rank=512, n_expert=64, n_expert_used=6, n_ff_exp=512,
        n_hash_layer=3, indexer_heads=16, indexer_head_dim=128, indexer_top_k=64,
        compress_ratios=flash_ratios(8), expert_weights_scale=1.5,
    ),
    # The peer benchmark's model (bench/llama_peer.py): `small` with a 2048-wide residual and
    # 256-wide experts, about 1.2 GB (IQ2_XXS + Q2_K experts, Q8_0 dense).
    "bench": ModelShape(
        n_layer=8, n_embd=2048, n_vocab=129280, n_head=16, head_dim=512, n_rot=64, n_out_group=4,
        q_lora_rank=512, o_lora_rank=512, n_expert=64, n_expert_used=6, n_ff_exp=256,
        n_hash_layer=3, indexer_heads=16, indexer_head_dim=128, indexer_top_k=64,
        compress_ratios=flash_ratios(8), expert_weights_scale=1.5,
    ),
    "flash": FLASH,
    "pro": PRO,
}

# Presets whose vocabulary is the real DeepSeek V4 tokenizer rather than the synthetic byte BPE.
REAL_VOCAB_PRESETS = frozenset({"small", "bench", "flash", "pro"})


def preset(name: str) -> ModelShape:
    """The :class:`ModelShape` of a named preset ("tiny", "tiny-pro", "tiny6", "small", ...)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise InvalidArgumentError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}") from None


def shapes(max_layers: int = 4, pattern: str | None = None) -> Any:
    """A hypothesis strategy drawing small valid DS4 shapes (either compression pattern).

    Every drawn shape satisfies the DS4 math limits: head_dim - n_rot a multiple of 64 and head_dim
    != 128, indexer head dim 128, n_embd and n_ff_exp multiples of 256, n_hc 4.
    """
    from hypothesis import strategies as st

    @st.composite
    def _draw(draw: Any) -> ModelShape:
        n_layer = draw(st.integers(1, max_layers))
        pat = pattern or draw(st.sampled_from(["flash", "pro"]))
        ratios = flash_ratios(n_layer) if pat == "flash" else pro_ratios(n_layer)
        n_head = draw(st.sampled_from([2, 4, 8]))
        n_out_group = draw(st.sampled_from([g for g in (1, 2, 4) if n_head % g == 0 and g <= n_head]))
        n_expert = draw(st.sampled_from([4, 8]))
        return ModelShape(
            n_layer=n_layer,
            n_embd=draw(st.sampled_from([256, 512])),
            n_vocab=draw(st.sampled_from([320, 512])),
            n_head=n_head,
            head_dim=draw(st.sampled_from([192, 256])),
            n_rot=64,
            n_out_group=n_out_group,
            q_lora_rank=draw(st.sampled_from([64, 128])),
            o_lora_rank=draw(st.sampled_from([64, 128])),
            n_expert=n_expert,
            n_expert_used=draw(st.integers(1, min(3, n_expert))),
            n_ff_exp=256,
            n_hash_layer=draw(st.integers(0, min(3, n_layer))),
            indexer_heads=draw(st.sampled_from([2, 4])),
            indexer_head_dim=128,
            indexer_top_k=draw(st.sampled_from([2, 4, 8])),
            compress_ratios=ratios,
            expert_weights_scale=1.5 if pat == "flash" else 2.5,
        )

    return _draw()
