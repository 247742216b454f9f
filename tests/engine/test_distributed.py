"""ds4.distributed.PipelineEngine on a local Ray instance (2 CPUs, no dashboard): stages on Ray
actors reproduce the single-process engine bit for bit, write its payloads byte for byte, overlap
their prefill chunks, and report a killed stage within a bounded time, after which a new pipeline
resumes from a saved payload or the disk KV cache.

Exact equality, as in test_stages.py (the same stage code; Ray only carries float32 arrays, and
test_stages shows a one-ulp change at a boundary is visible). About 40 s, most of it Ray starting.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'ds4[distributed]')")

import ds4  # noqa: E402
import ds4.testing  # noqa: E402
from ds4.distributed import PipelineEngine  # noqa: E402
from ds4.errors import CacheFormatError, PipelineError  # noqa: E402
from ds4.kvcache import KVCache  # noqa: E402

from _lockstep import lockstep  # noqa: E402

KILL_REPORT_SECONDS = 30   # a dead stage must be reported well before this (Ray notices in ~1 s)


def _tokens(n: int, seed: int, vocab: int = 512) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def one(tiny_path):
    return ds4.Engine(tiny_path, threads=1)


@pytest.mark.parametrize("stages", [2, 4])
def test_ray_stages_equal_one_engine(local_ray, tiny_path, one, stages: int) -> None:
    with PipelineEngine(tiny_path, stages=stages, threads=1) as eng:
        assert [i["layers"] for i in eng.stage_info] == eng.ranges
        assert len({i["pid"] for i in eng.stage_info}) == stages      # one process per stage
        base = _tokens(150, 1)
        a, b = one.session(ctx=256), eng.session(ctx=256)
        lockstep(a, b, [base, base + _tokens(20, 2), base[:40] + _tokens(30, 3)], decode=3)
        # payloads both ways, snapshots, rewind
        c = eng.session(ctx=256)
        c.load_payload(a.save_payload())
        assert c.tokens == a.tokens and np.array_equal(c.logits, a.logits)
        snap = c.snapshot()
        c.eval(7)
        c.restore(snap)
        a.rewind(50)
        c.rewind(50)
        assert np.array_equal(a.logits, c.logits) and c.save_payload() == a.save_payload()
        with pytest.raises(CacheFormatError):   # a stage's own error passes through unchanged
            c.load_payload(a.save_payload()[:-1])


def test_prefill_chunks_overlap_across_stages(local_ray, tiny_path, one) -> None:
    # Four 16-token chunks through two stages, one thread each on a 2-CPU Ray: stage 0 must start
    # a later chunk before stage 1 has finished an earlier one (prefill is pipelined).
    with PipelineEngine(tiny_path, stages=2, threads=1, prefill_chunk=16) as eng:
        s = eng.session(ctx=128)
        toks = _tokens(64, 4)
        s.sync(toks)
        ref = one.session(ctx=128)
        ref.sync(toks)
        assert np.array_equal(s.logits, ref.logits)
        first, second = (ray.get(a.trace.remote()) for a in eng._actors)
        assert [t[1] for t in first] == [0, 16, 32, 48] == [t[1] for t in second]
        overlapped = [k for k in range(1, 4) if first[k][3] < second[k - 1][4]]
        assert overlapped, (first, second)
        # A stage that does not answer within the deadline is reported, not waited for; the
        # session replays on next use once the stages answer again.
        eng.timeout = 1e-3
        t0 = time.monotonic()
        with pytest.raises(PipelineError, match="did not answer within"):
            s.sync(toks + _tokens(40, 6))
        assert time.monotonic() - t0 < KILL_REPORT_SECONDS
        eng.timeout = 60
        ref.sync(toks + _tokens(40, 6))
        s.sync(toks + _tokens(40, 6))
        assert np.array_equal(s.logits, ref.logits) and s.save_payload() == ref.save_payload()


def test_killed_stage_is_reported_and_a_new_pipeline_resumes(local_ray, tiny_path, one, tmp_path) -> None:
    kv = KVCache(tmp_path / "kv", min_tokens=32, boundary_align=16, boundary_trim=8, fsync=False)
    prompt = "the quick brown fox jumps over the lazy dog " * 6
    greedy = dict(max_tokens=8, temperature=0.0, ctx=512, stream=False)
    want = one.generate(prompt=prompt, **greedy)

    eng = PipelineEngine(tiny_path, stages=2, threads=1, timeout=60)
    cold = eng.generate(prompt=prompt, kv_cache=kv, **greedy)
    assert cold.tokens == want.tokens and cold.cache_source == ""
    s = eng.session(ctx=256)
    toks = _tokens(90, 5)
    s.sync(toks)
    s.save(tmp_path / "conv.kv")
    os.kill(eng.stage_info[1]["pid"], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(PipelineError, match=r"stage 1 layers \[2, 4\) DOWN"):
        s.eval(3)
    assert time.monotonic() - t0 < KILL_REPORT_SECONDS
    eng.close()

    with PipelineEngine(tiny_path, stages=2, threads=1) as again:
        resumed = again.load_session(tmp_path / "conv.kv")
        ref = one.session(ctx=256)
        ref.sync(toks)
        assert resumed.tokens == toks and np.array_equal(resumed.logits, ref.logits)
        resumed.eval(3)
        ref.eval(3)
        assert np.array_equal(resumed.logits, ref.logits)
        hit = again.generate(prompt=prompt, kv_cache=kv, **greedy)
        assert hit.cache_source == "disk" and hit.usage.cached_tokens > 0 and hit.tokens == want.tokens


def test_placement_that_cannot_fit_fails_fast(local_ray, tiny_path) -> None:
    with pytest.raises(PipelineError, match="could not place"):
        PipelineEngine(tiny_path, stages=2, cpus_per_stage=2, placement_timeout=3)


def test_serve_flags_open_a_pipeline(local_ray, tiny_path, one) -> None:
    from ds4.cli import build_parser
    from ds4.commands.serve import _open_engine
    from ds4.errors import InvalidArgumentError

    args = build_parser().parse_args(["serve", "--pipeline-stages", "2", "-t", "1"])
    eng = _open_engine(args, tiny_path)
    try:
        assert isinstance(eng, PipelineEngine) and eng.ranges == [(0, 2), (2, 4)]
        got = eng.generate(prompt="Hello", max_tokens=6, temperature=0.0, ctx=128, stream=False)
        assert got.tokens == one.generate(prompt="Hello", max_tokens=6, temperature=0.0, ctx=128, stream=False).tokens
    finally:
        eng.close()
    with pytest.raises(InvalidArgumentError, match="--ray-address needs"):
        _open_engine(build_parser().parse_args(["serve", "--ray-address", "auto"]), tiny_path)


def test_first_stage_killed_is_reported(local_ray, tiny_path) -> None:
    # The last stage then fails on its input (an object ref from a dead actor): still a
    # PipelineError naming stage 0, within the bound.
    with PipelineEngine(tiny_path, stages=2, threads=1, timeout=60) as eng:
        s = eng.session(ctx=64)
        s.sync([1, 2, 3])
        os.kill(eng.stage_info[0]["pid"], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(PipelineError, match=r"stage 0 layers \[0, 2\) DOWN"):
            s.eval(4)
        assert time.monotonic() - t0 < KILL_REPORT_SECONDS
