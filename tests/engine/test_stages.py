"""The stage split: engines opened for a layer range, chained through the HC state, must compute
exactly what one engine computes (logits bit for bit at every step, payloads byte for byte).

Exact equality is the right bar: a stage runs the same kernels on the same rows in the same order
as the single engine, and the HC state crosses the boundary as raw float32 bits. The perturbation
test below shows a one-ulp change of the crossing state is visible in the logits, so the equality
checks would catch a stage that dropped, re-rounded or reordered anything at its boundary.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ds4
import ds4.testing
from ds4.errors import CacheFormatError, InvalidArgumentError
from ds4.payload import merge_payloads, split_payload, synthetic_payload
from ds4.stages import LocalLink, Pipeline, StageHost, split_layers

from _lockstep import lockstep as _lockstep


def _tokens(n: int, seed: int, vocab: int = 512) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


@pytest.fixture(scope="module")
def tiny6_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ds4.testing.write_model(tmp_path_factory.mktemp("tiny6") / "t6.gguf", "tiny6", experts="q2", seed=3)


@pytest.mark.parametrize("stages", [2, 4])
def test_chained_stages_equal_one_engine(tiny_path, stages: int) -> None:
    # 150 tokens: the pipeline's default chunking (64-token chunks) crosses the 128-token window
    # and ratio-4 boundaries; the second prompt extends the first, the third diverges (rebuild).
    base = _tokens(150, 1)
    prompts = [base, base + _tokens(20, 2), base[:40] + _tokens(30, 3)]
    one = ds4.Engine(tiny_path, threads=1).session(ctx=256)
    many = Pipeline(tiny_path, stages=stages, threads=1).session(ctx=256)
    _lockstep(one, many, prompts, decode=3)


def test_uneven_explicit_ranges_and_small_chunks(tiny6_path) -> None:
    # Chunks of 7 split ratio-4 windows at every offset; ranges of 1, 3 and 2 layers.
    one = ds4.Engine(tiny6_path, threads=1, prefill_chunk=7).session(ctx=256)
    pipe = Pipeline(tiny6_path, stages=[(0, 1), (1, 4), (4, 6)], threads=1, prefill_chunk=7)
    many = pipe.session(ctx=256)
    seen: list[tuple[int, int]] = []
    toks = _tokens(61, 4)
    many.sync(toks, progress=lambda d, n: seen.append((d, n)))
    one.sync(toks)
    assert seen == [(min(d, 61), 61) for d in range(7, 68, 7)]
    assert np.array_equal(one.logits, many.logits) and many.save_payload() == one.save_payload()
    _lockstep(one, many, [toks + _tokens(9, 5)], decode=2)


def test_payloads_cross_between_pipeline_and_engine(tiny_path) -> None:
    eng = ds4.Engine(tiny_path, threads=1)
    pipe = Pipeline(tiny_path, stages=4, threads=1)
    toks = _tokens(100, 6)
    one = eng.session(ctx=256)
    one.sync(toks)
    # engine -> pipeline: continue decoding from the loaded state
    many = pipe.session(ctx=256)
    many.load_payload(one.save_payload())
    assert many.tokens == toks and np.array_equal(many.logits, one.logits)
    for t in _tokens(5, 7):
        one.eval(t)
        many.eval(t)
        assert np.array_equal(one.logits, many.logits)
    # pipeline -> engine
    other = eng.session(ctx=256)
    other.load_payload(many.save_payload())
    assert other.save_payload() == one.save_payload()
    # snapshots, rewind (a lazy replay through every stage), files
    snap = many.snapshot()
    many.eval(9)
    many.restore(snap)
    assert many.save_payload() == one.save_payload()
    one.rewind(60)
    many.rewind(60)
    assert np.array_equal(one.logits, many.logits) and many.save_payload() == one.save_payload()


def test_empty_timeline_payload(tiny_path) -> None:
    # An empty session writes a payload of no tokens; the pipeline's is the same bytes and loads.
    one = ds4.Engine(tiny_path, threads=1).session(ctx=64)
    many = Pipeline(tiny_path, stages=2, threads=1).session(ctx=64)
    assert many.save_payload() == one.save_payload()
    many.sync([1, 2, 3])
    many.restore(one.snapshot())
    assert many.pos == 0 and many.save_payload() == one.save_payload()


def test_bad_payload_leaves_pipeline_unchanged(tiny_path) -> None:
    s = Pipeline(tiny_path, stages=2, threads=1).session(ctx=128)
    s.sync(_tokens(20, 8))
    before = s.save_payload()
    with pytest.raises(CacheFormatError):
        s.load_payload(before[:-4])
    other = ds4.Engine(tiny_path, threads=1).session(ctx=64)   # payload ctx 128 does not fit 64
    with pytest.raises(CacheFormatError):
        other.load_payload(before)
    small = Pipeline(tiny_path, stages=2, threads=1).session(ctx=64)
    with pytest.raises(CacheFormatError):
        small.load_payload(before)
    assert small.pos == 0
    assert s.save_payload() == before
    with pytest.raises(InvalidArgumentError):
        s.sync([1, 2, 512])   # outside the vocabulary: nothing changes
    assert s.save_payload() == before


def test_mtp_runs_on_the_last_stage(tmp_path) -> None:
    path = ds4.testing.write_model(tmp_path / "m.gguf", "tiny", mtp=True, seed=2)
    one = ds4.Engine(path, threads=1).session(ctx=128)
    many = Pipeline(path, stages=2, threads=1).session(ctx=128)
    for t in _tokens(12, 9):
        one.eval(t)
        many.eval(t)
        assert np.array_equal(one.mtp_logits(), many.mtp_logits())


def test_speculative_decoding_on_a_pipeline_is_refused_clearly(tmp_path) -> None:
    # The stages have no verification pass: generate(speculative=N) and the session's
    # verify/accept/speculate must say so (UnsupportedModelError), not fail with AttributeError.
    from ds4.errors import UnsupportedModelError
    path = ds4.testing.write_model(tmp_path / "m.gguf", "tiny", mtp=True, seed=2)
    pipe = Pipeline(path, stages=2, threads=1)
    with pytest.raises(UnsupportedModelError, match="single-engine|pipeline"):
        pipe.generate(tokens=[1, 2, 3], max_tokens=2, temperature=0, speculative=2, stream=False)
    s = pipe.session(ctx=64)
    assert not s.supports_speculative
    s.sync([1, 2, 3])
    for call in (lambda: s.max_verify, lambda: s.verify([4, 5]), lambda: s.accept(1), lambda: s.speculate(4, [5])):
        with pytest.raises(UnsupportedModelError, match="single-engine"):
            call()
    assert s.pos == 3   # nothing committed by the refused calls
    assert pipe.generate(tokens=[1, 2, 3], max_tokens=2, temperature=0, stream=False).usage.completion_tokens == 2
    assert ds4.Engine(path, threads=1).session(ctx=64).supports_speculative


def test_a_stage_reads_only_its_own_layers(tiny_path, tmp_path) -> None:
    # Scramble every tensor of layers 0-1 in a copy: a stage over layers 2-3 of the copy, chained
    # after a good stage 0-1, still equals the good engine; the full engine on the copy does not.
    info = ds4.inspect(tiny_path)
    data = bytearray(tiny_path.read_bytes())
    rng = np.random.default_rng(0)
    for t in info.tensors.values():
        if t.name.startswith(("blk.0.", "blk.1.")) and "tid2eid" not in t.name:   # ids must stay valid
            data[t.offset:t.offset + t.nbytes] = rng.integers(0, 256, t.nbytes, dtype=np.uint8).tobytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    toks = _tokens(30, 10)
    good = ds4.Engine(tiny_path, threads=1).session(ctx=64)
    good.sync(toks)
    pipe = Pipeline(tiny_path, stages=2, threads=1)
    pipe.hosts[1] = StageHost(bad, (2, 4), threads=1)
    mixed = pipe.session(ctx=64)
    mixed.sync(toks)
    assert np.array_equal(good.logits, mixed.logits)
    broken = ds4.Engine(bad, threads=1).session(ctx=64)
    broken.sync(toks)
    assert not np.array_equal(good.logits, broken.logits)


def test_a_lossy_boundary_changes_the_logits(tiny_path) -> None:
    # The sensitivity behind the exact comparisons in this file: a boundary that nudged every value
    # of the crossing state by one ulp, or sent it as f16 (a tempting wire format), is visible.
    # (A single ulp of a single value may vanish in the next layer's 8-bit activation quantisation.)
    toks = np.asarray(_tokens(10, 11), dtype=np.int32)
    first, last = StageHost(tiny_path, (0, 2), threads=1), StageHost(tiny_path, (2, 4), threads=1)
    first.open(1, 64)
    hc = first.forward(1, toks, 0, None, True)
    lossy = [np.nextafter(hc, np.float32(np.inf)), hc.astype(np.float16).astype(np.float32)]
    outs = []
    for sid, h in enumerate([hc, *lossy]):
        last.open(sid, 64)
        outs.append(last.forward(sid, toks, 0, h, True))
    assert not np.array_equal(outs[0], outs[1]) and not np.array_equal(outs[0], outs[2])


def test_stage_engine_and_stage_session_errors(tiny_path) -> None:
    eng = ds4.Engine(tiny_path, threads=1, layers=(1, 3))
    assert eng.is_stage and eng.layers == (1, 3)
    with pytest.raises(InvalidArgumentError):
        eng.session(ctx=64)
    for bad in [(0, 0), (3, 2), (0, 5), (-1, 2)]:
        with pytest.raises(InvalidArgumentError):
            ds4.Engine(tiny_path, threads=1, layers=bad)
    host = StageHost(tiny_path, (1, 3), threads=1)
    host.open(1, 32)
    link = LocalLink(host, 1)
    hd = eng.shape.n_hc * eng.shape.n_embd
    with pytest.raises(InvalidArgumentError, match="HC state"):
        link.submit_forward(np.array([1, 2], dtype=np.int32), 0, None, False)
    with pytest.raises(InvalidArgumentError, match="position"):
        link.submit_forward(np.array([1], dtype=np.int32), 3, np.zeros(hd, np.float32), False)
    with pytest.raises(InvalidArgumentError, match="HC state holds"):
        link.submit_forward(np.array([1], dtype=np.int32), 0, np.zeros(hd - 1, np.float32), False)
    out = link.submit_forward(np.array([1], dtype=np.int32), 0, np.zeros(hd, np.float32), False)
    assert out.shape == (hd,) and host.call(1, "pos") == 1


def test_split_layers() -> None:
    assert split_layers(8, 3) == [(0, 3), (3, 6), (6, 8)]
    assert split_layers(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert split_layers(4, [(0, 1), (1, 4)]) == [(0, 1), (1, 4)]
    for bad in (0, 5, [(0, 2), (3, 4)], [(0, 2)], [(1, 4)], [(0, 2), (2, 2), (2, 4)]):
        with pytest.raises(InvalidArgumentError):
            split_layers(4, bad)


@given(st.lists(st.integers(1, 3), min_size=1, max_size=4), st.integers(1, 300), st.integers(0, 2**16))
def test_split_and_merge_are_inverse(sizes: list[int], n_tokens: int, seed: int) -> None:
    ratios = [(0, 4, 128)[(seed + i) % 3] for i in range(sum(sizes))]
    bounds = np.cumsum([0] + sizes).tolist()
    ranges = list(zip(bounds[:-1], bounds[1:]))
    blob = synthetic_payload(n_layer=len(ratios), head_dim=8, indexer_head_dim=4, n_vocab=16, ratios=ratios,
                             ctx=512, tokens=[i % 16 for i in range(n_tokens)], seed=seed)
    parts = split_payload(blob, ratios, ranges)
    assert [int.from_bytes(p[32:36], "little") for p in parts] == sizes   # header n_layer
    assert merge_payloads(parts, ratios, ranges) == blob
    if len(parts) > 1:   # stages out of step: different token lists
        bad = bytearray(parts[1])
        bad[52] ^= 1
        with pytest.raises(CacheFormatError, match="out of step"):
            merge_payloads([parts[0], bytes(bad), *parts[2:]], ratios, ranges)


def test_pipeline_engine_without_ray_says_how_to_get_it(tiny_path, monkeypatch) -> None:
    import sys

    from ds4.distributed import PipelineEngine
    from ds4.errors import PipelineError

    monkeypatch.setitem(sys.modules, "ray", None)   # import ray -> ImportError
    with pytest.raises(PipelineError, match=r"pip install 'ds4\[distributed\]'"):
        PipelineEngine(tiny_path, stages=2)
