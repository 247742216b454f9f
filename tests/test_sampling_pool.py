"""The sampler on an engine's worker threads (csrc/sampling/sampling_pool.*, docs/sampling.md
"Seventh round"): the same picks, RNG states and probabilities as on the calling thread."""

from __future__ import annotations

import numpy as np
import pytest

import ds4
import ds4.testing
from ds4 import _core
from ds4.errors import InvalidArgumentError
from ds4.sampling import Rng, probabilities, sample

from test_sampling import _vocab_logits

# Settings whose whole-vocabulary passes split over a pool (the total; probabilities()' weights and sum),
# plus top-k, which never splits.
SETTINGS = [(1.0, 0, 1.0, 0.0), (100.0, 0, 1.0, 0.0), (1.0, 0, 0.9, 0.0), (1.0, 0, 0.9, 0.05), (0.7, 0, 1.0, 0.0),
            (1.0, 40, 1.0, 0.05)]


@pytest.fixture(scope="module")
def engine():
    return ds4.Engine(ds4.testing.cached_model("tiny"), threads=2, sampler_threads=2)


def test_engine_option_and_default(engine):
    assert engine.sampler_threads == 2 and engine._sampler_pool_of is engine._model
    # the default: the engine's pool only when SAMPLER_POOL_BY_DEFAULT, and only for vocabularies
    # that the passes split (2^15 and more)
    small = ds4.Engine(ds4.testing.cached_model("tiny"), threads=2)
    assert small.shape.n_vocab < (1 << 15) and small.sampler_threads == 1 and small._sampler_pool_of is False
    one = ds4.Engine(ds4.testing.cached_model("tiny"), threads=2, sampler_threads=1)
    assert one._sampler_pool_of is False
    with pytest.raises(InvalidArgumentError):
        ds4.Engine(ds4.testing.cached_model("tiny"), threads=2, sampler_threads=0)
    with pytest.raises(InvalidArgumentError):
        _core.sample(np.zeros(4, np.float32), 1.0, 0, 1.0, 0.0, 1, True)


@pytest.mark.parametrize("kind", ["flat", "peaked", "nonfinite", "heavy"])
def test_engine_pool_picks_what_one_thread_picks(engine, kind):
    # 129,280 logits: the total and probabilities() split over the engine's two workers
    # (pool_of = its model), against the calling thread alone (pool_of = False). An error of one
    # unit in the pool-only path (total_parallel, chunk 300) fails flat, peaked and nonfinite (tried).
    logits = _vocab_logits(1400 + len(kind), 129_280, kind)
    for t, k, p, mp in SETTINGS:
        a = Rng(7)
        got = [sample(logits, t, k, p, mp, a, engine=engine) for _ in range(4)]
        state, want = Rng(7).state, []
        for _ in range(4):
            tok, state = _core.sample(logits, t, k, p, mp, state, False)
            want.append(int(tok))
        assert got == want and a.state == state, (kind, t, k, p, mp)
        pa = probabilities(logits, t, k, p, mp, engine=engine)
        pb = _core.sample_probabilities(logits, t, k, p, mp, False)
        assert np.array_equal(pa.view(np.uint32), pb.view(np.uint32)), (kind, t, k, p, mp)


def test_session_sample_uses_the_engine(engine):
    s = engine.session(ctx=64)
    s.sync([1, 2, 3])
    a, b = Rng(3), Rng(3)
    assert s.sample(temperature=1.0, min_p=0.0, rng=a) == sample(s.logits, 1.0, 0, 1.0, 0.0, b)
    assert a.state == b.state
