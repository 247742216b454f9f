"""Logits of the whole Metal graph (metal-emu) against the CPU engine, tiny Flash and Pro models,
both expert mixes, over prompts that cross every boundary, prefilled in chunks and teacher-forced.

Boundaries the token counts cross (tiny presets: n_swa 128, indexer top-k 8):
  * ratio-4 windows every 4 tokens and the ratio-4 frontier shift; the indexer starts selecting
    (top-k mask) once a ratio-4 layer has more than 8 compressed rows (token 36);
  * the first ratio-128 window closes at token 128 (Pro: layers 0, 1 and 3; Flash: layer 3);
  * the raw window (128 rows) wraps from token 129 on;
  * prefill chunks: prefill_chunk=48 splits a prefill into 48-token chunks.
Agreement: _noise.py (the bound the CPU SIMD paths meet against upstream).
"""

from __future__ import annotations

import numpy as np
import pytest

import ds4

from _noise import assert_agrees, assert_rejects_perturbations

CHUNK = 48          # prefill chunk: a 136-token prefill runs as 48 + 48 + 40
PREFILL = 136       # past the ratio-128 window (128) and the raw-window wrap (129)
DECODE = 20         # teacher-forced decode rows after the prefill


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


CASES = [("tiny", "q2"), ("tiny-pro", "q4"), ("tiny", "q4"), ("tiny-pro", "q2")]


@pytest.mark.parametrize("preset,experts", CASES, ids=[f"{p}-{e}" for p, e in CASES])
def test_prefill_and_decode_match_cpu(model_path, preset, experts):
    path = model_path(preset, experts)
    metal = ds4.Engine(path, backend="metal-emu", prefill_chunk=CHUNK)
    cpu = ds4.Engine(path, backend="cpu", threads=2, prefill_chunk=CHUNK)
    assert metal.backend == "metal-emu"
    n_vocab = cpu.info.shape.n_vocab
    toks = _prompt(n_vocab, PREFILL + DECODE, seed=len(preset) + len(experts))
    ours = _run(metal, toks[:PREFILL], toks[PREFILL:])
    want = _run(cpu, toks[:PREFILL], toks[PREFILL:])
    assert np.all(np.isfinite(ours))
    assert_agrees(ours, want, f"{preset}/{experts}")
    assert_rejects_perturbations(ours, want)


def test_decode_only_crosses_the_boundaries(model_path):
    """Token by token from position 0 (decode path only: mat-vec everywhere, one row per
    compressor store/pool/shift, the indexer switching on at 36, the ring wrapping at 129)."""
    path = model_path("tiny", "q2")
    metal = ds4.Engine(path, backend="metal-emu")
    cpu = ds4.Engine(path, backend="cpu", threads=2)
    toks = _prompt(cpu.info.shape.n_vocab, 140, seed=7)
    rows = {}
    for name, eng in (("metal", metal), ("cpu", cpu)):
        s = eng.session(ctx=256)
        out = []
        for i, t in enumerate(toks):
            s.eval(t)
            if i % 4 == 3 or i >= 124:
                out.append(np.array(s.logits))
        rows[name] = np.array(out)
    assert_agrees(rows["metal"], rows["cpu"], "decode from 0")
