"""A decode's bits as two digests, for tests that switch a timing knob and expect nothing to change."""
from __future__ import annotations

import hashlib

import numpy as np

import ds4
import ds4.testing


def decode_digest(model: str, threads: int, seed: int) -> tuple[str, str]:
    """sha256 of every step's logits over 8 decode steps after a 6-token prompt (random ids from
    ``seed``), and of the final session payload."""
    eng = ds4.Engine(ds4.testing.cached_model(model), threads=threads)
    s = eng.session(ctx=64)
    rng = np.random.default_rng(seed)
    s.sync(rng.integers(0, eng.shape.n_vocab, 6).tolist())
    h = hashlib.sha256()
    for t in rng.integers(0, eng.shape.n_vocab, 8).tolist():
        s.eval(int(t))
        h.update(np.ascontiguousarray(s.logits).tobytes())
    return h.hexdigest(), hashlib.sha256(s.save_payload()).hexdigest()
