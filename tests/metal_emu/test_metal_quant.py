"""Quantised activations and decode mat-vec on the emulator against the CPU kernels (ds4._core).

Activation quantisation must be byte-identical to the CPU's. The mat-vec and mat-mat bounds and
their derivations are in tests/metal_bounds.py (2*B*u*S and (n+B+10)*u*S). One weight code off by
one step changes a result by about S/n, orders of magnitude above the mat-vec bound
(test_tolerance_catches_one_code_step).
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given, settings, strategies as st

import ds4._core as core
from ds4.metal_emu import ops
from ds4.reference import quant as ref
from metal_bounds import check_bound, matvec_bound
from test_quant_blocks import ACT_PATTERNS, SCALE_MODES, activation, random_weights

MV_TYPES = (Q.F32, Q.F16, Q.Q8_0, Q.Q2_K, Q.Q4_K, Q.IQ2_XXS)
FAST = settings(max_examples=12, deadline=None)


@pytest.mark.parametrize("wtype", [Q.Q8_0, Q.Q4_K], ids=["q8_0_act", "q8_k"])
@FAST
@given(data=st.data())
def test_quantize_act_is_byte_identical(emu, wtype, data):
    elems = 32 if wtype == Q.Q8_0 else 256
    n = elems * data.draw(st.integers(1, 3))
    rows = data.draw(st.integers(1, 3))
    x = activation(n, data.draw(st.integers(0, 2**32 - 1)), data.draw(st.sampled_from(ACT_PATTERNS)), batch=rows)
    got = ops.quantize_act(ops.checked(emu), int(wtype), x)
    want = core.quantize_act(int(wtype), x).reshape(rows, -1)
    assert got.tobytes() == want.tobytes()


def _bound(qtype, raw, n, rows, xq_rows, x):
    return matvec_bound(qtype, raw, n, rows, x)


def _cpu(qtype, raw, n, rows, x):
    return np.stack([core.matvec(int(qtype), raw, (n, rows), r) for r in np.atleast_2d(x)])


_check = check_bound


@pytest.mark.parametrize("qtype", MV_TYPES, ids=lambda q: q.name)
@FAST
@given(data=st.data())
def test_matvec_matches_cpu(emu, qtype, data):
    elems = {Q.F32: 1, Q.F16: 1, Q.Q8_0: 32}.get(qtype, 256)
    # Q8_0 up to 40 blocks: lanes wrap around the 32-lane simdgroup; F16/F32 up to 80 elements.
    n = elems * data.draw(st.integers(1, {1: 80, 32: 40}.get(elems, 3)))
    rows = data.draw(st.integers(1, 13))            # partial groups of MV_ROWS*2 rows
    n_tok = data.draw(st.integers(1, 2))
    seed = data.draw(st.integers(0, 2**32 - 1))
    raw = random_weights(qtype, n, rows, seed, data.draw(st.sampled_from(SCALE_MODES)))
    patterns = ACT_PATTERNS if n % 32 == 0 else [p for p in ACT_PATTERNS if p != "mixed_zero_blocks"]
    x = activation(n, seed ^ 1, data.draw(st.sampled_from(patterns)), batch=n_tok)
    run = ops.checked(emu)
    got = ops.matvec(run, int(qtype), raw, (n, rows), ops.quantize_act(run, int(qtype), x))
    _check(got, _cpu(qtype, raw, n, rows, x), _bound(qtype, raw, n, rows, None, x))


# matmul's worst-case bound is n/B times looser than matvec's: it still sees one Q8_0 or Q4_K code
# step at these sizes, but not every single IQ2_XXS lattice-row swap among 512 weights. The
# tile loaders' values are pinned byte for byte by test_tile_dequantisation_is_byte_identical;
# what the matmul comparison must catch beyond that is tiling and indexing, which moves whole
# rows (test_matmul_tolerance_catches_a_misplaced_row).
@pytest.mark.parametrize("op, qtype, byte", [
    ("matvec", Q.Q8_0, 2), ("matvec", Q.Q4_K, 16), ("matvec", Q.IQ2_XXS, 2),
    ("matmul", Q.Q8_0, 2), ("matmul", Q.Q4_K, 16)], ids=lambda v: getattr(v, "name", str(v)))
def test_tolerance_catches_one_code_step(emu, op, qtype, byte):
    elems = 32 if qtype == Q.Q8_0 else 256
    n, rows, n_tok = 2 * elems, 5, 3
    raw = random_weights(qtype, n, rows, 7)
    x = activation(n, 8, "normal", batch=n_tok)
    bad = raw.copy()
    bad[byte] ^= 1                                   # one code of row 0, block 0, one step off
    assert not np.array_equal(ref.dequantize(int(qtype), bad, (n, rows)), ref.dequantize(int(qtype), raw, (n, rows)))
    run = ops.checked(emu)
    got = getattr(ops, op)(run, int(qtype), bad, (n, rows), ops.quantize_act(run, int(qtype), x))
    bound = _bound(qtype, raw, n, rows, None, x)
    if op == "matmul":
        blocks = n // elems
        bound = bound / (2 * blocks) * (n + blocks + 10)
    want = _cpu(qtype, raw, n, rows, x)
    with pytest.raises(AssertionError, match="max err/bound"):
        _check(got, want, bound)
    # The untouched rows still pass: the bound is not loose enough to hide a wrong row.
    _check(got[:, 1:], want[:, 1:], bound[:, 1:])


def test_iq2xxs_tables_match_the_cpu_tables():
    from pathlib import Path
    import re

    root = Path(__file__).resolve().parents[2]
    metal = (root / "metal" / "iq2xxs_tables.h").read_text()
    cpu = (root / "csrc" / "quant" / "iq2xxs_tables.h").read_text()
    nums = lambda s: [int(v, 16) for v in re.findall(r"0x([0-9a-fA-F]+)", s)]
    assert nums(metal) == nums(cpu) and len(nums(cpu)) == 256 + 128


@pytest.mark.parametrize("qtype", MV_TYPES, ids=lambda q: q.name)
@FAST
@given(data=st.data())
def test_tile_dequantisation_is_byte_identical(emu, qtype, data):
    elems = {Q.F32: 1, Q.F16: 1, Q.Q8_0: 32}.get(qtype, 256)
    n = elems * data.draw(st.integers(1, {1: 70, 32: 5}.get(elems, 2)))
    rows = data.draw(st.integers(1, 5))
    raw = random_weights(qtype, n, rows, data.draw(st.integers(0, 2**32 - 1)), data.draw(st.sampled_from(SCALE_MODES)))
    got = ops.dequantize(ops.checked(emu), int(qtype), raw, (n, rows))
    assert got.tobytes() == core.dequantize(int(qtype), raw, (n, rows)).tobytes()


@pytest.mark.parametrize("qtype", MV_TYPES, ids=lambda q: q.name)
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_matmul_matches_cpu(emu, qtype, data):
    """Tiles multiply dequantised floats (weights as the CPU dequantiser gives them, activations
    d*q): each product rounds once and n of them are summed in float, against the CPU's exact
    integer block sums and B float block additions, so |gpu - cpu| <= (n + B + 10)*u*S."""
    elems = {Q.F32: 1, Q.F16: 1, Q.Q8_0: 32}.get(qtype, 256)
    n = elems * data.draw(st.integers(1, {1: 70, 32: 5}.get(elems, 2)))   # plain types: partial k tiles
    rows = data.draw(st.integers(1, 40))                                     # one or two row tiles
    n_tok = data.draw(st.integers(1, 36))                                    # one or two token tiles
    seed = data.draw(st.integers(0, 2**32 - 1))
    raw = random_weights(qtype, n, rows, seed, data.draw(st.sampled_from(SCALE_MODES)))
    patterns = ACT_PATTERNS if n % 32 == 0 else [p for p in ACT_PATTERNS if p != "mixed_zero_blocks"]
    x = activation(n, seed ^ 1, data.draw(st.sampled_from(patterns)), batch=n_tok)
    run = ops.checked(emu)
    got = ops.matmul(run, int(qtype), raw, (n, rows), ops.quantize_act(run, int(qtype), x))
    blocks = n if qtype in (Q.F32, Q.F16) else n // elems
    bound = _bound(qtype, raw, n, rows, None, x) / (2 * blocks) * (n + blocks + 10)
    _check(got, _cpu(qtype, raw, n, rows, x), bound)


def test_matmul_tolerance_catches_a_misplaced_row(emu):
    qtype, n, rows, n_tok = Q.Q4_K, 512, 33, 3
    raw = random_weights(qtype, n, rows, 11)
    x = activation(n, 12, "normal", batch=n_tok)
    run = ops.checked(emu)
    got = ops.matmul(run, int(qtype), raw, (n, rows), ops.quantize_act(run, int(qtype), x))
    bound = _bound(qtype, raw, n, rows, None, x) / (2 * 2) * (n + 2 + 10)
    want = _cpu(qtype, raw, n, rows, x)
    _check(got, want, bound)
    swapped = got.copy()
    swapped[:, [31, 32]] = got[:, [32, 31]]        # rows across the tile edge exchanged
    with pytest.raises(AssertionError, match="max err/bound"):
        _check(swapped, want, bound)


def test_grouped_output_a_binds_weights_at_offsets(emu):
    """Buffers bound at byte offsets (the zero-copy weight views a host uses) reach the right rows."""
    qtype, group_dim, n_group, rank = Q.Q8_0, 64, 3, 5
    raw = random_weights(qtype, group_dim, n_group * rank, 4)
    heads = activation(n_group * group_dim, 5, "normal")
    got = ops.grouped_output_a(ops.checked(emu), int(qtype), raw, (group_dim, n_group * rank), heads, n_group, rank)
    per_row = raw.reshape(n_group * rank, -1)
    for g in range(n_group):
        w = per_row[g * rank:(g + 1) * rank].reshape(-1)
        x = heads[g * group_dim:(g + 1) * group_dim]
        want = core.matvec(int(qtype), w, (group_dim, rank), x)[None]
        _check(got[None, g * rank:(g + 1) * rank], want, _bound(qtype, w, group_dim, rank, None, x))
