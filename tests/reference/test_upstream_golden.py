"""The reference against logits of upstream antirez/ds4 itself (CPU backend, strict -O2 build).

``data/upstream_*.npz`` hold upstream's teacher-forced decode logits on ``ds4.testing`` models
(tiny: Flash schedule, 40 tokens; tiny-pro: Pro schedule, positions around the first ratio-128
rows of layers 0-1), produced with upstream's shape constants patched to the preset
(docs/validation.md). Each file records the sha256 of the model it belongs to: if the
synthetic writer changes its output, this test fails and the golden data must be regenerated
from upstream (docs/validation.md).

The tiny models are chaotic: Q8_0 activation ties flip on 1-ulp input changes and move logits by
~0.1 (upstream's own strict and fast-math builds differ from each other by as much as the
reference differs from either), and such a flip at one position can move a later router choice
(tiny-pro position 6: mean abs 0.53, a layer-3 expert swap). So a position whose mean abs
difference exceeds 0.1 counts as a discrete flip and at most 10% of positions may be flips. On the
others docs/model.md §9's limits hold (mean abs <= 0.05, p99 <= 0.5, mean KL <= 0.006; measured on tiny
0.029 / 0.22 / 0.0015), and the argmax agrees wherever upstream's top-2 margin exceeds 0.1 (the
measured disagreements all sit at margins below 0.025).
"""

import hashlib
from pathlib import Path

import numpy as np
import pytest

import ds4.testing
from ds4.reference import ReferenceModel

DATA = Path(__file__).parent / "data"


def _centered(x):
    return x - x.mean(axis=1, keepdims=True)


def _log_softmax(x):
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("fname", ["upstream_tiny_q2_s0.npz", "upstream_tiny_pro_q2_s2.npz"])
def test_reference_matches_upstream_logits(model_dir, fname):
    gold = np.load(DATA / fname)
    name, seed = str(gold["preset"]), int(gold["seed"])
    path = ds4.testing.write_model(model_dir / f"golden-{name}-s{seed}.gguf", name, experts="q2", seed=seed)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(gold["model_sha256"]), (
        f"ds4.testing now writes a different {name} model: regenerate the golden logits "
        "(docs/validation.md)")
    m = ReferenceModel(path)
    st_ = m.new_state(256)
    ours = np.stack([m.decode(st_, int(t)) for t in gold["tokens"]])[gold["positions"]].astype(np.float64)
    up = gold["decode_logits"].astype(np.float64)
    d = np.abs(_centered(up) - _centered(ours))
    flip = d.mean(axis=1) > 0.1
    assert flip.sum() <= 0.1 * len(up)
    up, ours, d = up[~flip], ours[~flip], d[~flip]
    assert d.mean() <= 0.05 and np.percentile(d, 99) <= 0.5
    lp_up, lp_ours = _log_softmax(up), _log_softmax(ours)
    kl = (np.exp(lp_up) * (lp_up - lp_ours)).sum(axis=1)
    assert kl.mean() <= 0.006
    top2 = np.sort(up, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 0.1
    assert clear.sum() >= 0.6 * len(up)  # most positions are not near-ties
    assert np.array_equal(up[clear].argmax(axis=1), ours[clear].argmax(axis=1))
