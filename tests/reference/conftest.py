"""Seeded synthetic models for the reference tests, written once per test session."""

import pytest

import ds4.testing
from ds4.shape import ModelShape, flash_ratios

# A cheaper shape for many-run tests: a 16-row window and top_k 2, so window eviction and indexer
# selection both happen within 40 tokens.
FAST = ModelShape(
    n_layer=4, n_embd=256, n_vocab=320, n_head=2, head_dim=192, n_rot=64, n_out_group=1,
    q_lora_rank=64, o_lora_rank=64, n_expert=4, n_expert_used=2, n_ff_exp=256, n_hash_layer=2,
    indexer_heads=2, indexer_head_dim=128, indexer_top_k=2, compress_ratios=flash_ratios(4), n_swa=16,
)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("reference-models")


@pytest.fixture(scope="session")
def tiny_path(model_dir):
    return ds4.testing.write_model(model_dir / "tiny.gguf", "tiny", experts="q2", seed=0)


@pytest.fixture(scope="session")
def fast_path(model_dir):
    return ds4.testing.write_model(model_dir / "fast.gguf", FAST, experts="q2", seed=1)
