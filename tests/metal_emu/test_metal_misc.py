"""Elementwise and data-movement kernels: exact against numpy / the CPU."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given, settings, strategies as st

import ds4._core as core
from ds4.metal_emu import ops
from test_quant_blocks import random_weights

FAST = settings(max_examples=10, deadline=None)


@FAST
@given(n=st.integers(1, 300), seed=st.integers(0, 2**32 - 1))
def test_add_fill_store_f16(emu, n, seed):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(n) * 1e4).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    run = ops.checked(emu)
    assert ops.add(run, a, b).tobytes() == (a + b).tobytes()
    assert ops.fill(run, n, -2.5).tobytes() == np.full(n, -2.5, np.float32).tobytes()
    wide = np.concatenate([a * 100, [70000.0, 65519.0, 65520.0, 1e-8, 3e-5]]).astype(np.float32)
    with np.errstate(over="ignore"):
        want = wide.astype(np.float16).astype(np.float32)
    assert ops.store_row_f16(run, wide).tobytes() == want.tobytes()


@FAST
@given(n=st.integers(1, 2000), seed=st.integers(0, 2**32 - 1), threads=st.sampled_from([32, 100, 256]))
def test_argmax_first_of_ties(emu, n, seed, threads):
    rng = np.random.default_rng(seed)
    x = rng.integers(-50, 50, size=n).astype(np.float32)
    x[rng.random(n) < 0.05] = np.nan
    want = int(np.argmax(np.where(np.isnan(x), -np.inf, x))) if not np.isnan(x).all() else 0
    assert ops.argmax(ops.checked(emu), x, threads) == want


def test_compressor_store_and_shift(emu):
    rng = np.random.default_rng(3)
    width = 96
    skv, ssc = rng.standard_normal((2, 8, width)).astype(np.float32)
    kv, sc, ape = rng.standard_normal((3, width)).astype(np.float32)
    run = ops.checked(emu)
    sc2, skv2, ssc2 = ops.compressor_store(run, ape, kv, sc, skv, ssc, 6)
    assert sc2.tobytes() == (sc + ape).tobytes()
    want_kv, want_sc = skv.copy(), ssc.copy()
    want_kv[6], want_sc[6] = kv, sc + ape
    assert skv2.tobytes() == want_kv.tobytes() and ssc2.tobytes() == want_sc.tobytes()
    kv3, sc3 = ops.compressor_shift(run, skv2, ssc2)
    assert (kv3[:4] == skv2[4:]).all() and (kv3[4:] == skv2[4:]).all() and (sc3[:4] == ssc2[4:]).all()


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_K], ids=lambda q: q.name)
def test_embed_rows_hc(emu, qtype):
    n_embd = 256 if qtype == Q.Q4_K else 64
    n_vocab = 7
    table = random_weights(qtype, n_embd, n_vocab, 9)
    tokens = np.array([3, 0, 6, 3, 99], np.int32)
    got = ops.embed_rows_hc(ops.checked(emu), int(qtype), table, (n_embd, n_vocab), tokens, 4)
    rows = core.dequantize(int(qtype), table, (n_embd, n_vocab))
    for t, tok in enumerate(tokens[:4]):
        for h in range(4):
            assert got[t, h].tobytes() == rows[tok].tobytes()
    assert np.isnan(got[4]).all()
