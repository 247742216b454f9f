"""Engine logits against the numpy oracle ds4.reference, teacher-forced and greedy.

Tolerances are in _compare.py with their reason (measured error, upstream's own build-to-build
noise) and tests/engine/test_compare_bounds.py shows each catches N(0, 0.4) noise and x1.3
scaling. Every check that selects rows asserts it selected some. Prompt
lengths cross every boundary of the tiny shapes: 1 token, < 128, > 128 (the raw ring wraps and
ratio-128 rows appear), and > 4*top_k (the ratio-4 indexer starts selecting).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ds4
import ds4.testing
from ds4.reference import ReferenceModel

from _compare import TOL_ARGMAX, compare_rows, decisive_rows, row_means, rows_ok


def _teacher_forced(eng: ds4.Engine, ref: ReferenceModel, tokens: list[int], ctx: int = 512):
    s = eng.session(ctx=ctx)
    st_ = ref.new_state(ctx)
    ours, theirs = [], []
    for t in tokens:
        s.eval(t)
        ours.append(s.logits.copy())
        theirs.append(ref.decode(st_, t))
    return np.array(ours), np.array(theirs)


def _check_decisive(ours: np.ndarray, theirs: np.ndarray, at_least: int) -> None:
    decisive = decisive_rows(theirs)
    assert decisive.sum() >= at_least, f"only {decisive.sum()} decisive rows: the check would assert nothing"
    assert (np.atleast_2d(ours).argmax(1) == np.atleast_2d(theirs).argmax(1))[decisive].all(), \
        "argmax differs on a decisive row"


def _check(ours: np.ndarray, theirs: np.ndarray, min_argmax: float = TOL_ARGMAX) -> None:
    stats = compare_rows(ours, theirs)
    assert stats.ok(min_argmax), stats
    # measured: 9-17 of the 160 rows have a margin above NEAR_TIE on these models
    _check_decisive(ours, theirs, at_least=5)


MODELS = [("tiny", "q2"), ("tiny", "q4"), ("tiny-pro", "q2")]


@pytest.fixture(scope="module", params=MODELS, ids=[f"{n}-{e}" for n, e in MODELS])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    name, experts = request.param
    path = ds4.testing.write_model(tmp_path_factory.mktemp(name) / f"{name}-{experts}.gguf", name,
                                   experts=experts, seed=1)
    return ds4.Engine(path, threads=2), ReferenceModel(path)


@pytest.fixture(params=["scalar", "best"])
def simd(request: pytest.FixtureRequest):
    """Run under upstream's literal scalar float orders and under the fastest SIMD path."""
    from ds4 import _core
    before = _core.simd_path()
    _core.set_simd_path("scalar" if request.param == "scalar" else _core.simd_paths()[-1])
    yield request.param
    _core.set_simd_path(before)


def test_teacher_forced_160_tokens(pair, simd) -> None:
    # 160 tokens: ring wrap at 128, ratio-128 row at 127, indexer selection from 4*(top_k+1).
    eng, ref = pair
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, eng.shape.n_vocab, 160).tolist()
    ours, theirs = _teacher_forced(eng, ref, tokens)
    # Near-tie flips are expected (see _compare.py); decisive rows must still agree exactly.
    _check(ours, theirs)


@settings(max_examples=2)   # 4 prefills each, on both sides: ~8 s per model on 2 cores
@given(seed=st.integers(0, 2**31 - 1))
def test_prefill_last_logits(pair, seed: int) -> None:
    # The batched prefill path of both sides, at lengths across every boundary (1 token, < 128,
    # > 128 where the ring wraps). Each prefill gives one row; a single row may be one of the
    # isolated spike rows, so the four rows are judged together (_compare.rows_ok).
    eng, ref = pair
    tokens = np.random.default_rng(seed).integers(0, eng.shape.n_vocab, 131).tolist()
    ours, theirs = [], []
    for n in (1, 5, 37, 131):
        s = eng.session(ctx=256)
        s.sync(tokens[:n])
        ours.append(s.logits.copy())
        theirs.append(ref.prefill(ref.new_state(256), tokens[:n]))
    rows = row_means(np.array(ours), np.array(theirs))
    assert rows_ok(rows), np.round(rows, 3)


def test_greedy_continuation(pair) -> None:
    # Greedy decoding, 40 steps. Both sides follow the reference's greedy tokens, so a legitimate
    # flip at a near-tie does not end the comparison; wherever the reference's choice is decisive
    # (margin > NEAR_TIE) the engine must pick the same token. The prompt seed is fixed and the
    # count of decisive steps asserted, so the test cannot silently compare nothing.
    eng, ref = pair
    prompt = np.random.default_rng(4).integers(0, eng.shape.n_vocab, 20).tolist()
    s = eng.session(ctx=256)
    s.sync(prompt)
    st_ = ref.new_state(256)
    theirs = ref.prefill(st_, prompt)
    ours_rows, ref_rows = [], []
    for _ in range(40):
        ours_rows.append(s.logits.copy())
        ref_rows.append(theirs)
        t_ref = int(np.argmax(theirs))
        s.eval(t_ref)
        theirs = ref.decode(st_, t_ref)
    _check_decisive(np.array(ours_rows), np.array(ref_rows), at_least=2)


# The simd fixture only selects a kernel path for the whole test, so sharing it is safe.
@settings(max_examples=3, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=ds4.testing.shapes(max_layers=3), seed=st.integers(0, 1000))
def test_drawn_shapes(tmp_path_factory: pytest.TempPathFactory, simd, shape, seed: int) -> None:
    # Drawn shapes include top-1 routing and top_k 2 indexers, where one flipped selection moves a
    # whole row (measured: a 2-layer top-1 shape, engine scalar vs engine AVX-512, one row at 1.07
    # mean |dlogit|, the others ~0.015). So rows are judged one by one: no drift (median row within
    # the fixed-model limit) and flips rare and isolated. Calibration, scalar path, 40 drawn shapes
    # x 40 tokens: worst median row 0.051 and worst 4/40 rows above 0.1 (both top-1 routing).
    path = ds4.testing.write_model(tmp_path_factory.mktemp("drawn") / "m.gguf", shape, seed=seed)
    eng, ref = ds4.Engine(path, threads=1), ReferenceModel(path)
    tokens = np.random.default_rng(seed).integers(0, shape.n_vocab, 24).tolist()
    ours, theirs = _teacher_forced(eng, ref, tokens, ctx=64)
    rows = row_means(ours, theirs)
    assert np.median(rows) <= 0.07 and (rows > 0.1).mean() <= 0.2, np.round(rows, 3)


@pytest.mark.parametrize("n,extend", [(10, 0), (150, 0), (140, 12)])
def test_payload_layout_matches_reference(pair, n: int, extend: int) -> None:
    # Same header and byte layout as the reference's independent DSV4 writer; every array in the
    # same place with the same size, the sentinel-filled frontier rows in the same places, and
    # values within the cache's own rounding noise (FP8 steps can flip, see _compare.py).
    eng, ref = pair
    tokens = np.random.default_rng(n).integers(0, eng.shape.n_vocab, n + extend).tolist()
    s = eng.session(ctx=512)
    s.sync(tokens[:n])
    st_ = ref.new_state(512)
    ref.prefill(st_, tokens[:n])
    for t in tokens[n:]:
        s.eval(t)
        ref.decode(st_, t)
    ours, theirs = s.save_payload(), st_.to_payload()
    assert len(ours) == len(theirs) and ours[:52] == theirs[:52]
    off = 52
    for name, arr in st_.payload_arrays():
        arr = np.asarray(arr)
        mine = np.frombuffer(ours, dtype=arr.dtype, count=arr.size, offset=off).reshape(arr.shape)
        off += arr.nbytes
        if arr.dtype == np.uint32:
            assert np.array_equal(mine, arr), name
        elif name == "logits":
            assert np.array_equal(mine, s.logits)   # the session's own logits, in their place
        else:
            sentinel = arr <= -1e29
            assert np.array_equal(mine <= -1e29, sentinel), name
            if arr.size and not sentinel.all():
                diff = np.abs(mine[~sentinel].astype(np.float64) - arr[~sentinel])
                scale = max(1.0, float(np.abs(arr[~sentinel]).max()))
                assert diff.mean() <= 0.02 * scale, (name, diff.mean(), diff.max())
    assert off == len(ours)
