"""Logits of the whole Metal graph (metal-emu) against the CPU engine, tiny Flash and Pro models,
both expert mixes, over prompts that cross every boundary, prefilled in chunks and teacher-forced.

Boundaries the token counts cross (tiny presets: n_swa 128, indexer top-k 8):
  * ratio-4 windows every 4 tokens and the ratio-4 frontier shift; the indexer starts selecting
    (top-k mask) once a ratio-4 layer has more than 8 compressed rows (token 36);
  * the first ratio-128 window closes at token 128 (Pro: layers 0, 1 and 3; Flash: layer 3);
  * the raw window (128 rows) wraps from token 129 on;
  * prefill chunks: prefill_chunk=48 splits a prefill into 48-token chunks;
  * decode alone (one token per forward pass) across the 128 boundary and the wrap (Pro case).
Agreement: _noise.py (the bound the CPU SIMD paths meet against upstream).
"""

from __future__ import annotations

import numpy as np
import pytest

import ds4

from _gpu_backends import metal_under_test
from _noise import assert_agrees, assert_rejects_perturbations

METAL = metal_under_test()   # metal-emu, or metal (the GPU) with DS4_TEST_BACKENDS=metal

CHUNK = 48          # prefill chunk: a 136-token prefill runs as 48 + 48 + 40


def _prompt(n_vocab: int, n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, n_vocab, n).tolist()


def _run(engine: "ds4.Engine", prompt: list[int], forced: list[int]) -> np.ndarray:
    """Rows: the logits after the chunked prefill, then after each teacher-forced token."""
    s = engine.session(ctx=512)
    s.sync(prompt)
    rows = [np.array(s.logits)]
    for t in forced:
        s.eval(t)
        rows.append(np.array(s.logits))
    return np.array(rows)


# (preset, experts, prefill tokens, teacher-forced tokens). The first two cross the ratio-128
# window and the raw-window wrap, Flash in the prefill (136), Pro (three ratio-128 layers) in
# decode (120 prefilled, then 121..136 one by one). The expert mix changes only the routed FFN,
# whose work does not depend on the position, so the other two mixes run a shorter prompt that
# still crosses a prefill chunk, ratio-4 windows and the indexer's first selection (36).
CASES = [("tiny", "q2", 136, 8), ("tiny-pro", "q4", 120, 16), ("tiny", "q4", 50, 8), ("tiny-pro", "q2", 50, 8)]


@pytest.mark.parametrize("preset,experts,prefill,decode", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_prefill_and_decode_match_cpu(model_path, preset, experts, prefill, decode):
    path = model_path(preset, experts)
    metal = ds4.Engine(path, backend=METAL, prefill_chunk=CHUNK)
    cpu = ds4.Engine(path, backend="cpu", threads=2, prefill_chunk=CHUNK)
    assert metal.backend == METAL
    toks = _prompt(cpu.info.shape.n_vocab, prefill + decode, seed=len(preset) + len(experts))
    ours = _run(metal, toks[:prefill], toks[prefill:])
    want = _run(cpu, toks[:prefill], toks[prefill:])
    assert np.all(np.isfinite(ours))
    assert_agrees(ours, want, f"{preset}/{experts}")
    assert_rejects_perturbations(ours, want)
