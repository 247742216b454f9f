"""The reference-match tolerances (_compare.py) can fail: each bound, on its own, rejects the
engine's real rows once they are perturbed as a bug would perturb them (N(0, 0.4) noise added to
every logit, or every logit scaled by 1.3), while the unperturbed rows pass.

The rows are real: 64 teacher-forced tokens of the tiny model, engine vs ds4.reference.
"""

from __future__ import annotations

import numpy as np
import pytest

import ds4
import ds4.testing
from ds4.reference import ReferenceModel

from _compare import (ROW_MEDIAN, ROW_SPIKE, ROW_TYPICAL, TOL_ARGMAX, TOL_MEAN_ABS, TOL_MEAN_KL, TOL_P99_ABS,
                      compare_rows, decisive_rows, row_means, rows_ok)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    path = ds4.testing.write_model(tmp_path_factory.mktemp("b") / "tiny.gguf", "tiny", seed=1)
    eng, ref = ds4.Engine(path, threads=2), ReferenceModel(path)
    tokens = np.random.default_rng(7).integers(0, eng.shape.n_vocab, 64).tolist()
    s, st_ = eng.session(ctx=128), ref.new_state(128)
    ours, theirs = [], []
    for t in tokens:
        s.eval(t)
        ours.append(s.logits.astype(np.float64))
        theirs.append(ref.decode(st_, t))
    return np.array(ours), np.array(theirs)


PERTURB = {
    "noise 0.4": lambda x: x + np.random.default_rng(0).normal(0.0, 0.4, x.shape),
    "scale 1.3": lambda x: x * 1.3,
}


def test_unperturbed_rows_pass(rows) -> None:
    ours, theirs = rows
    assert compare_rows(ours, theirs).ok()
    assert rows_ok(row_means(ours[:4], theirs[:4]))


@pytest.mark.parametrize("how", sorted(PERTURB))
def test_each_aggregate_bound_catches_the_perturbation(rows, how: str) -> None:
    ours, theirs = rows
    st = compare_rows(PERTURB[how](ours), theirs)
    assert not st.ok()
    # each bound on its own, not just their conjunction
    assert st.mean_abs > 2 * TOL_MEAN_ABS, st
    assert st.p99_abs > TOL_P99_ABS, st
    assert st.mean_kl > 2 * TOL_MEAN_KL, st
    if how == "noise 0.4":
        assert st.argmax_agree < TOL_ARGMAX, st   # argmax cannot see scaling; the bounds above do


@pytest.mark.parametrize("how", sorted(PERTURB))
def test_row_rule_catches_the_perturbation_on_four_rows(rows, how: str) -> None:
    # the rule test_prefill_last_logits applies to its four single-row prefills
    ours, theirs = rows
    for i in range(0, 64, 4):
        r = row_means(PERTURB[how](ours[i:i + 4]), theirs[i:i + 4])
        assert not rows_ok(r) and np.median(r) > ROW_MEDIAN and (r > ROW_TYPICAL).all(), r
    assert ROW_SPIKE > 0.64   # the worst real spike row measured (see _compare.py)


def test_decisive_check_selects_rows_and_catches_a_wrong_token(rows) -> None:
    ours, theirs = rows
    decisive = decisive_rows(theirs)
    assert decisive.sum() >= 1   # 1 of these 64 rows (7 of the 160 in test_reference_match)
    assert (ours.argmax(1) == theirs.argmax(1))[decisive].all()
    # a bug that picks the runner-up on a decisive row (e.g. an off-by-one in the output head)
    bad = ours.copy()
    i = int(np.flatnonzero(decisive)[0])
    top2 = np.argsort(bad[i])[-2:]
    bad[i, top2] = bad[i, top2[::-1]]
    assert not (bad.argmax(1) == theirs.argmax(1))[decisive].all()
