"""The software prefetch distances of the weight-streaming products (common/decode_switches.h:
`q8_prefetch` for Q8_0 rows, issued inside the one-activation kernel or per row by matvec
(`q8_prefetch_inline`), `half_prefetch` for the F16/BF16 one-token tiles; docs/kernels.md,
"The Q8_0 weight streaming at 2 threads") are timing knobs: for any distance, including none (a
separate loop in quant/matvec.cpp's dot_rows, a skipped branch in dot_half_tile.inc), every
output row is the row kernel's result for that row, on every SIMD path and thread count, in
matvec, in LinearGroup's single dispatch and in a whole decode."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given, settings, strategies as st

import ds4._core as core
from ds4.errors import InvalidArgumentError
from test_quant_blocks import activation, random_weights
from _decode_bits import decode_digest

DEFAULT = 16384
HALF_DEFAULT = 8192
# None, less than a line, the old 3 KiB, the default, and the largest allowed (past any test matrix).
DISTANCES = (0, 32, 3072, DEFAULT, 1 << 20)


@contextlib.contextmanager
def _kept_core_state():
    """Threads, SIMD path and decode switches as they were, whatever the body sets (the hypothesis
    tests cannot take a function-scoped fixture)."""
    threads, path, switches = core.threads(), core.simd_path(), core._decode_switches()
    try:
        yield
    finally:
        core.set_threads(threads)
        core.set_simd_path(path)
        core._decode_switches(**switches)


@pytest.fixture
def restore():
    with _kept_core_state():
        yield


def _one_row_at_a_time(qtype, w, n: int, rows: int, x) -> np.ndarray:
    """The row kernel's result for every row: one matvec call per row."""
    rb = len(w) // rows
    return np.concatenate([core.matvec(int(qtype), w[r * rb:(r + 1) * rb], (n, 1), x) for r in range(rows)])


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("key,default", [("q8_prefetch", DEFAULT), ("half_prefetch", HALF_DEFAULT)])
def test_default_and_bounds(key, default, restore):
    assert core._decode_switches()[key] == default
    assert core._decode_switches()["q8_prefetch_inline"] is True
    assert core._decode_switches(**{key: 0})[key] == 0
    for bad in (-1, (1 << 20) + 1):
        with pytest.raises(InvalidArgumentError, match=key):
            core._decode_switches(tapered=False, **{key: bad})
    now = core._decode_switches()
    assert now[key] == 0 and now["tapered"], "a rejected call must change nothing"


@settings(max_examples=12, deadline=None, derandomize=True)
@given(rows=st.integers(1, 700), blocks=st.integers(1, 70), threads=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_matvec_rows_are_the_row_kernel_for_any_distance(rows, blocks, threads, seed):
    """Up to 700 rows of up to 70 blocks (2380 bytes): with 3 threads the ranges start inside the
    matrix, and the distances reach past a range's end and past the matrix."""
    n = 32 * blocks
    w = random_weights(Q.Q8_0, n, rows, seed)
    x = activation(n, seed + 1, "normal")
    with _kept_core_state():
        core.set_threads(threads)
        for path in core.simd_paths():
            core.set_simd_path(path)
            # One row per call: the row kernel's result for each row, whatever the distance.
            core._decode_switches(q8_prefetch=DEFAULT)
            want = _one_row_at_a_time(Q.Q8_0, w, n, rows, x)
            for d in DISTANCES:
                for inline in (True, False):
                    core._decode_switches(q8_prefetch=d, q8_prefetch_inline=inline)
                    got = core.matvec(int(Q.Q8_0), w, (n, rows), x)
                    assert np.array_equal(_bits(got), _bits(want)), \
                        f"{path}, {threads} threads, q8_prefetch={d}, inline={inline}"


@settings(max_examples=8, deadline=None, derandomize=True)
@given(qtype=st.sampled_from([Q.F16, Q.BF16]), rows=st.integers(1, 300), n=st.sampled_from([16, 48, 256, 2048, 8192]),
       threads=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_half_matvec_rows_are_the_row_kernel_for_any_distance(qtype, rows, n, threads, seed):
    """F16/BF16 one-token products: n up to 4096 runs the one-row-at-a-time form, 8192 the
    8-row groups (activation over 16 KiB); n=16 and 48 leave only the tail loop or one step."""
    w = random_weights(qtype, n, rows, seed)
    x = activation(n, seed + 1, "normal")
    with _kept_core_state():
        core.set_threads(threads)
        for path in core.simd_paths():
            core.set_simd_path(path)
            core._decode_switches(half_prefetch=HALF_DEFAULT)
            want = _one_row_at_a_time(qtype, w, n, rows, x)
            for d in DISTANCES:
                core._decode_switches(half_prefetch=d)
                got = core.matvec(int(qtype), w, (n, rows), x)
                assert np.array_equal(_bits(got), _bits(want)), f"{path}, {threads} threads, half_prefetch={d}"


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_linear_group_members_equal_linear_for_any_distance(threads, restore):
    """LinearGroup's one-token dispatch runs ~64 KiB units of its Q8_0 members with the switch's
    distance (inside the kernel or per row) and its F16 members with the half distance; each member
    must stay its own linear."""
    rng = np.random.default_rng(threads)
    n = 512
    types, rows = [Q.Q8_0, Q.Q4_K, Q.Q8_0, Q.F16, Q.Q8_0], [600, 17, 1, 9, 333]
    members = [(random_weights(t, n, r, 10 + i), int(t), n, r) for i, (t, r) in enumerate(zip(types, rows))]
    x = rng.standard_normal((1, n)).astype(np.float32)
    for path in core.simd_paths():
        h = core.OpHarness("cpu", path, threads)
        core._decode_switches(q8_prefetch=DEFAULT, half_prefetch=HALF_DEFAULT)
        want = [h.linear(w, t, nn, r, x) for w, t, nn, r in members]
        for d in DISTANCES:
            for dh, inline in ((0, True), (2048, False), (HALF_DEFAULT, True)):
                core._decode_switches(q8_prefetch=d, half_prefetch=dh, q8_prefetch_inline=inline)
                got = h.linear_group(members, x)
                for i, (g, e) in enumerate(zip(got, want)):
                    assert np.array_equal(_bits(g), _bits(e)), f"{path}, member {i}, prefetch {d} / {dh} / {inline}"


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_decode_bits_do_not_depend_on_the_distance(threads, restore):
    core._decode_switches(q8_prefetch=DEFAULT, half_prefetch=HALF_DEFAULT)
    want = decode_digest("tiny", threads, seed=3)
    for d, dh, inline in ((0, 0, True), (3072, 2048, False), (DEFAULT, HALF_DEFAULT, False)):
        core._decode_switches(q8_prefetch=d, half_prefetch=dh, q8_prefetch_inline=inline)
        assert decode_digest("tiny", threads, seed=3) == want, f"prefetch {d} / {dh} / inline {inline}"
