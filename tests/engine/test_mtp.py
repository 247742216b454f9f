"""MTP draft block (docs/model.md §3.12) against ds4.reference.

The reference MTP step is fed the engine's own final hidden state, so the comparison isolates the
MTP block's numerics (one dense layer + head); the main model's own noise is covered elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest

import ds4
import ds4.testing
from ds4.errors import InvalidArgumentError, UnsupportedModelError
from ds4.reference import ReferenceModel

from _compare import compare_rows


@pytest.fixture(scope="module")
def mtp_pair(tmp_path_factory: pytest.TempPathFactory):
    path = ds4.testing.write_model(tmp_path_factory.mktemp("mtp") / "m.gguf", "tiny", mtp=True, seed=2)
    return ds4.Engine(path, threads=2), ReferenceModel(path)


def test_mtp_logits_match_reference(mtp_pair) -> None:
    eng, ref = mtp_pair
    assert eng.has_mtp
    toks = np.random.default_rng(1).integers(0, 512, 140).tolist()   # MTP window wraps at 128
    s = eng.session(ctx=256)
    st = ref.new_state(256)
    ours, theirs = [], []
    for i, t in enumerate(toks):
        s.eval(t)
        ours.append(s.mtp_logits())
        assert np.array_equal(ours[-1], s.mtp_logits())   # once per position: no second window row
        theirs.append(ref.mtp_step(st, s._s.last_hidden().copy(), t, i)[0])
    stats = compare_rows(np.array(ours), np.array(theirs))
    # One layer + head from identical inputs: measured 0.003 mean, KL 2e-5; 10x margin.
    assert stats.mean_abs <= 0.03 and stats.mean_kl <= 2e-4 and stats.argmax_agree >= 0.97, stats


def test_mtp_errors(mtp_pair, tiny_engine) -> None:
    eng, _ = mtp_pair
    s = eng.session(ctx=64)
    with pytest.raises(InvalidArgumentError):
        s.mtp_logits()
    s.eval(4)
    blob = s.save_payload()
    s.load_payload(blob)
    with pytest.raises(InvalidArgumentError):
        s.mtp_logits()   # the hidden state is not part of a payload
    s.eval(5)
    assert s.mtp_logits().shape == (512,)
    with pytest.raises(UnsupportedModelError):
        tiny_engine.session(ctx=16).mtp_logits()


def test_mtp_from_a_separate_file(tmp_path) -> None:
    # The MTP block shipped as its own GGUF (mtp_path) gives the same drafts as an embedded one.
    import gguf

    full = ds4.testing.write_model(tmp_path / "full.gguf", "tiny", mtp=True, seed=4)
    base = ds4.testing.write_model(tmp_path / "base.gguf", "tiny", mtp=False, seed=4)
    reader = gguf.GGUFReader(str(full))
    w = gguf.GGUFWriter(str(tmp_path / "mtp.gguf"), "deepseek4")
    for t in reader.tensors:
        if t.name.startswith("mtp.0."):
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    embedded = ds4.Engine(full, threads=1)
    separate = ds4.Engine(base, threads=1, mtp_path=tmp_path / "mtp.gguf")
    assert separate.has_mtp
    toks = [5, 9, 200, 7]
    a, b = embedded.session(ctx=32), separate.session(ctx=32)
    for t in toks:
        a.eval(t)
        b.eval(t)
        assert np.array_equal(a.mtp_logits(), b.mtp_logits())
