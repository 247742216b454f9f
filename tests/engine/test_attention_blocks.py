"""Prefill attention in query blocks (backend AttentionBlock, engine/forward.cpp) against the same
prompt fed one token per forward pass (prefill_chunk=1: the per-token Attention op). The rest of
a forward pass is row-independent (chunked prefill is already bit-identical, test_engine.py), so
on every SIMD path the logits and the saved KV state must agree bit for bit. The prompt crosses
the 128-row ring wrap, several compression boundaries and the switch-on of the indexer (tiny:
top_k 8, so from 36 tokens), with blocks of 16 that straddle each."""

from __future__ import annotations

import numpy as np
import pytest

import ds4
import ds4._core as _core


@pytest.mark.parametrize("kernel_path", _core.simd_paths(), indirect=True)
def test_block_prefill_equals_token_by_token(tiny_path, kernel_path) -> None:
    toks = np.random.default_rng(5).integers(0, 512, 171).tolist()
    blocked = ds4.Engine(tiny_path, threads=2).session(ctx=512)
    blocked.sync(toks)
    single = ds4.Engine(tiny_path, threads=2, prefill_chunk=1).session(ctx=512)
    single.sync(toks)
    assert np.array_equal(blocked.logits, single.logits), f"logits differ on {kernel_path}"
    assert blocked.save_payload() == single.save_payload()
