"""bench/_llama_gguf.py (the peer bench's conversion for llama.cpp): each fix is applied when the
file needs it, nothing else changes, and the output never appears half-written."""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

import ds4.testing as T

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from _llama_gguf import GATING_KEY, ORIG_CTX_KEY, ROPE_TYPE_KEY, convert_for_llama, llama_fixes  # noqa: E402

U64 = gguf.GGUFValueType.UINT64


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """A tiny file with all the problems upstream files have: a UINT64 original context length
    and an exp_probs_b bias on a hash-routed layer (tiny routes layers 0-2 by hash)."""
    plan = T.model_plan("tiny")
    plan.set_meta(ORIG_CTX_KEY, 65536, U64)
    bias = plan.tensor("blk.3.exp_probs_b.bias")
    plan.tensors.append(T.TensorPlan("blk.0.exp_probs_b.bias", bias.dims, bias.type, bias.role))
    return T.write_plan(tmp_path_factory.mktemp("b") / "broken.gguf", plan)


def test_fixes_applied_and_tensors_copied(broken, tmp_path):
    src = gguf.GGUFReader(broken)
    assert src.get_field(ORIG_CTX_KEY).types[0] == U64  # the fixture really is broken
    fixes = convert_for_llama(broken, tmp_path / "out.gguf")
    assert len(fixes) == 4, fixes
    out = gguf.GGUFReader(tmp_path / "out.gguf")
    f = out.get_field(ORIG_CTX_KEY)
    assert f.types == [gguf.GGUFValueType.UINT32] and f.contents() == 65536
    g = out.get_field(GATING_KEY)
    assert g.types == [gguf.GGUFValueType.UINT32] and g.contents() == 4
    assert out.get_field(ROPE_TYPE_KEY).contents() == "yarn"
    names = {t.name for t in out.tensors}
    assert "blk.0.exp_probs_b.bias" not in names and "blk.3.exp_probs_b.bias" in names
    # Every other tensor is copied byte for byte with its type and dims, every other key kept.
    src_t = {t.name: t for t in src.tensors}
    assert names == set(src_t) - {"blk.0.exp_probs_b.bias"}
    for t in out.tensors:
        s = src_t[t.name]
        assert t.tensor_type == s.tensor_type and list(t.shape) == list(s.shape), t.name
        assert np.array_equal(np.asarray(t.data).view(np.uint8), np.asarray(s.data).view(np.uint8)), t.name
    for key, field in src.fields.items():
        if key.startswith("GGUF.") or key == ORIG_CTX_KEY:
            continue
        assert out.get_field(key) is not None, key
        if field.types[0] != gguf.GGUFValueType.ARRAY:
            assert out.get_field(key).contents() == field.contents(), key
    assert llama_fixes(out) == []  # a converted file needs nothing more


def test_clean_file_gets_only_the_added_keys(tmp_path):
    path = T.write_model(tmp_path / "tiny.gguf", "tiny")
    fixes = convert_for_llama(path, tmp_path / "out.gguf")
    assert [f.split()[0] for f in fixes] == [GATING_KEY, ROPE_TYPE_KEY]


def test_failed_conversion_leaves_nothing(tmp_path):
    bad = tmp_path / "not-ds4.gguf"
    w = gguf.GGUFWriter(bad, "llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with pytest.raises(ValueError, match="expected 'deepseek4'"):
        convert_for_llama(bad, tmp_path / "out.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-ds4.gguf"]


def test_failure_while_writing_removes_the_temp_file(tmp_path, monkeypatch):
    path = T.write_model(tmp_path / "tiny.gguf", "tiny")

    def fail(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", fail)
    with pytest.raises(OSError, match="disk full"):
        convert_for_llama(path, tmp_path / "out.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]
