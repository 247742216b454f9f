"""The specific hostile values from issue 17, one test each: header values that used to hang,
allocate without bound, leak a foreign exception or load as nonsense. Each must now raise a
ds4.errors.Ds4Error naming the file, before anything large is allocated or looped over.
(Random mutations of the same files are in tests/test_fuzz.py.)"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

import ds4
import ds4.testing as T
from ds4.errors import CacheFormatError, Ds4Error, ModelFormatError
from ds4.gguf_header import GGUFValueType as V

P = "deepseek4."


@pytest.fixture(scope="module")
def vocab512():
    return T.tiny_vocab(512)


@pytest.mark.parametrize("key,value,vtype,match", [
    ("hyper_connection.sinkhorn_iterations", 2**31 - 1, V.UINT32, r"sinkhorn_iters=2147483647 is outside 1\.\.1000"),
    ("block_count", 2**31, V.UINT32, r"expected at least 2147483648"),
    ("attention.indexer.top_k", 2**32 - 1, V.UINT32, r"indexer_top_k=4294967295 is outside"),
    ("attention.sliding_window", 2**31 + 5, V.UINT32, r"n_swa=2147483653 is outside"),
    ("rope.freq_base", math.inf, V.FLOAT32, r"rope_freq_base=inf is outside"),
    ("rope.freq_base", math.nan, V.FLOAT32, r"rope_freq_base=nan is outside"),
    ("attention.layer_norm_rms_epsilon", math.nan, V.FLOAT32, r"rms_eps=nan"),
    ("attention.layer_norm_rms_epsilon", 0.0, V.FLOAT32, r"rms_eps=0\.0 is outside"),
    ("hyper_connection.epsilon", -1e-6, V.FLOAT64, r"hc_eps=-1e-06 is outside"),
    ("expert_weights_scale", math.inf, V.FLOAT32, r"expert_weights_scale=inf"),
    ("rope.scaling.factor", math.nan, V.FLOAT32, r"rope_scale_factor=nan"),
    ("rope.scaling.yarn_beta_fast", 0.0, V.FLOAT32, r"yarn_beta_fast=0\.0"),
    ("attention.compress_rope_freq_base", -5.0, V.FLOAT32, r"compress_rope_freq_base=-5\.0"),
    # a float's bit pattern stored under an integer type reads as a huge integer
    ("rope.freq_base", struct.unpack("<I", struct.pack("<f", 10000.0))[0], V.UINT32, r"rope_freq_base=1176256512"),
    ("attention.layer_norm_rms_epsilon", struct.unpack("<I", struct.pack("<f", 1e-6))[0], V.UINT32, r"rms_eps=\d+\.0 is outside"),
])
def test_metadata_out_of_range_is_refused(tmp_path, vocab512, key, value, vtype, match) -> None:
    plan = T.model_plan("tiny", vocab=vocab512)
    plan.set_meta(P + key, value, vtype)
    p = T.write_plan(tmp_path / "m.gguf", plan, header_only=True)
    for load in (ds4.inspect, ds4.Engine):
        with pytest.raises(ModelFormatError, match=match) as e:
            load(p)
        assert str(e.value).startswith(str(p))


def test_swiglu_clamp_nan_is_refused(tmp_path, vocab512) -> None:
    plan = T.model_plan("tiny", vocab=vocab512)
    plan.set_meta(P + "swiglu_clamp_exp", [math.nan] * 4, V.ARRAY, V.FLOAT32)
    p = T.write_plan(tmp_path / "m.gguf", plan, header_only=True)
    with pytest.raises(ModelFormatError, match="swiglu"):
        ds4.inspect(p)


# ---------------------------------------------------------------- session payload files

@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return ds4.Engine(T.write_model(tmp_path_factory.mktemp("m") / "tiny.gguf", "tiny", seed=0), threads=1)


@pytest.fixture(scope="module")
def payload(engine) -> bytes:
    s = engine.session(ctx=64)
    s.sync([1, 2, 3, 4, 5])
    return s.save_payload()


def _with_field(blob: bytes, index: int, value: int) -> bytes:
    b = bytearray(blob)
    struct.pack_into("<I", b, 4 * index, value)
    return bytes(b)


@pytest.mark.parametrize("index,value,match", [
    # the writer's ctx: once allocated a 2**31-token session before anything was checked
    (2, 2**31 - 1, "inconsistent: ctx 2147483647 implies prefill chunk tag 2048"),
    (2, 2**32 - 1, "inconsistent: ctx 4294967295"),
    (7, 2**32 - 1, "truncated session payload: the header claims 4294967295 tokens"),
    (8, 2**32 - 1, "4294967295 layers"),
    (11, 2**31, "vocab"),
    (12, 2**32 - 1, "raw ring"),
])
def test_payload_header_fields_are_bounded(tmp_path, engine, payload, index, value, match) -> None:
    p = tmp_path / "s.dsv4"
    p.write_bytes(_with_field(payload, index, value))
    with pytest.raises(CacheFormatError, match=match) as e:
        engine.load_session(p)
    assert str(e.value).startswith(str(p))


def test_payload_from_another_model_shape_says_so(tmp_path, engine) -> None:
    other = ds4.Engine(T.write_model(tmp_path / "pro.gguf", "tiny-pro", seed=0), threads=1)
    s = other.session(ctx=64)
    s.sync([1, 2, 3, 4, 5])
    p = tmp_path / "pro.dsv4"
    s.save(p)
    with pytest.raises(CacheFormatError, match="other compress ratios") as e:
        engine.load_session(p)
    assert str(e.value).startswith(str(p)) and "truncated session payload" not in str(e.value)


# ---------------------------------------------------------------- .kv files and `ds4 cache`

def _kv_file(tmp_path: Path, **header) -> Path:
    from ds4.kvcache_format import KVCHeader, sha1_hex
    from ds4.payload import synthetic_payload

    text = b"hello world"
    pl = synthetic_payload(n_layer=4, head_dim=256, indexer_head_dim=128, n_vocab=512,
                           ratios=(0, 0, 4, 128), ctx=64, tokens=[1, 2, 3])
    fields = dict(quant_bits=2, reason=1, ext_flags=0, tokens=3, hits=0, ctx=64, created_at=1,
                  last_used=1, payload_bytes=len(pl), text_bytes=len(text))
    fields.update(header)
    h = KVCHeader(**fields)
    d = tmp_path / "cache"
    d.mkdir(exist_ok=True)
    p = d / f"{sha1_hex(text)}.kv"
    p.write_bytes(h.pack_prefix() + text + pl)
    return p


@pytest.mark.parametrize("header", [
    dict(created_at=2**64 - 1, last_used=2**64 - 1),
    dict(created_at=2**63, last_used=0),
    dict(hits=2**32 - 1),
])
def test_cache_show_and_ls_survive_extreme_header_values(tmp_path, capsys, header) -> None:
    from ds4.cli import main

    p = _kv_file(tmp_path, **header)
    for argv in (["cache", "ls", str(p.parent)], ["cache", "show", str(p)], ["cache", "show", str(p.parent)],
                 ["cache", "ls", str(p.parent), "--json"], ["cache", "show", str(p), "--json"]):
        rc = main(argv)
        out = capsys.readouterr()
        assert rc in (0, 1) and "Traceback" not in out.err, (argv, out.err)
    json.loads(main(["cache", "ls", str(p.parent), "--json"]) and "" or capsys.readouterr().out)


@pytest.mark.parametrize("header,match", [
    (dict(text_bytes=2**32 - 1), "truncated"),
    (dict(payload_bytes=2**63), "truncated"),
])
def test_cache_show_bounds_lengths_by_the_file(tmp_path, capsys, header, match) -> None:
    from ds4.cli import main

    p = _kv_file(tmp_path, **header)
    assert main(["cache", "show", str(p)]) == 1
    assert match in capsys.readouterr().out


def test_cache_show_with_absurd_layer_count(tmp_path, capsys) -> None:
    from ds4.cli import main
    from ds4.kvcache_format import KVC_PREFIX_BYTES

    p = _kv_file(tmp_path)
    b = bytearray(p.read_bytes())
    text_len = struct.unpack_from("<I", b, 48)[0]
    struct.pack_into("<I", b, KVC_PREFIX_BYTES + text_len + 4 * 8, 2**32 - 1)
    p.write_bytes(bytes(b))
    assert main(["cache", "show", str(p)]) == 1
    assert "4294967295 layers" in capsys.readouterr().out


def test_saturated_hit_counter_still_loads(tmp_path) -> None:
    from ds4.kvcache_format import KVCHeader, touch_header

    p = _kv_file(tmp_path, hits=2**32 - 1)
    assert touch_header(p, 2**32, 5)   # hits + 1 from the loader: saturates, no struct.error
    h = KVCHeader.unpack_prefix(p.read_bytes()[:52])
    assert h.hits == 2**32 - 1 and h.last_used == 5


def test_errors_are_ds4_errors() -> None:
    assert issubclass(CacheFormatError, Ds4Error) and issubclass(ModelFormatError, Ds4Error)
