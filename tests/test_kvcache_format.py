"""Upstream byte layout of ``.kv`` files (docs/runtime.md §7.1), pinned from the spec's tables.

Expected bytes are written out with struct.pack / literals following the offset table, so a change
in ds4.kvcache_format's field order or widths fails here.
"""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given, strategies as st

import kvcache_fakes as fk
from ds4 import kvcache_format as fmt
from ds4.errors import CacheFormatError
from ds4.kvcache import KVCache


def spec_header(quant=4, reason=2, ext=1, tokens=600, hits=7, ctx=4096, created=1_700_000_000,
                used=1_700_000_500, payload=123456789) -> bytes:
    """48 bytes per the §7.1 table: offset 0 'KVC', 3 version, 4 quant, 5 reason, 6 ext, 7 reserved,
    8 tokens, 12 hits, 16 ctx, 20 reserved, 24 created, 32 last used, 40 payload bytes."""
    b = bytearray(48)
    b[0:3] = b"KVC"
    b[3] = 1
    b[4] = quant
    b[5] = reason
    b[6] = ext
    b[7] = 0
    b[8:12] = struct.pack("<I", tokens)
    b[12:16] = struct.pack("<I", hits)
    b[16:20] = struct.pack("<I", ctx)
    b[20:24] = bytes(4)
    b[24:32] = struct.pack("<Q", created)
    b[32:40] = struct.pack("<Q", used)
    b[40:48] = struct.pack("<Q", payload)
    return bytes(b)


def test_header_bytes_match_spec_table():
    h = fmt.KVCHeader(quant_bits=4, reason=2, ext_flags=1, tokens=600, hits=7, ctx=4096,
                      created_at=1_700_000_000, last_used=1_700_000_500, payload_bytes=123456789)
    assert h.pack() == spec_header()
    assert fmt.KVCHeader.unpack(spec_header()) == h
    assert fmt.KVC_HEADER_BYTES == 48 and fmt.KVC_PREFIX_BYTES == 52


def test_reason_and_flag_codes_from_spec():
    assert [fmt.reason_code(n) for n in ("unknown", "cold", "continued", "evict", "shutdown",
                                         "agent-system", "agent-session")] == [0, 1, 2, 3, 4, 5, 6]
    assert fmt.reason_code("no-such-reason") == 0
    assert (fmt.EXT_TOOL_MAP, fmt.EXT_RESPONSES_VISIBLE, fmt.EXT_THINKING_VISIBLE) == (1, 2, 4)
    assert fmt.key_kind(2) == "responses-visible" and fmt.key_kind(4) == "thinking-visible"
    assert fmt.key_kind(0) == fmt.key_kind(1) == "token-text"


def test_unknown_reason_reads_as_zero():
    assert fmt.KVCHeader.unpack(spec_header(reason=9)).reason == 0


@pytest.mark.parametrize(
    "patch, message",
    [({0: ord("X")}, "not a KV cache file"), ({3: 2}, "unsupported KV cache file version"),
     ({4: 3}, "quant bits 3"), ({4: 8}, "quant bits 8")],
)
def test_invalid_headers_rejected(patch, message):
    b = bytearray(spec_header())
    for off, v in patch.items():
        b[off] = v
    with pytest.raises(CacheFormatError, match=message):
        fmt.KVCHeader.unpack(bytes(b))


def test_zero_tokens_rejected():
    with pytest.raises(CacheFormatError, match="token count of 0"):
        fmt.KVCHeader.unpack(spec_header(tokens=0))


def test_sha_names():
    sha = hashlib.sha1(b"hello").hexdigest()
    assert fmt.sha1_hex(b"hello") == sha
    assert fmt.sha_from_name(sha + ".kv") == sha
    assert fmt.sha_from_name(sha.upper() + ".kv") == sha      # scan accepts upper case
    assert fmt.sha_from_name(sha + ".kv.tmp.123.abc") is None
    assert fmt.sha_from_name(sha[:-1] + ".kv") is None
    assert fmt.sha_from_name(sha + ".KV") is None
    assert fmt.is_temp_name(sha + ".kv.tmp.123.a1b2") == 123
    assert fmt.is_temp_name(sha + ".kv.tmp.77") == 77          # upstream's own temp names
    assert fmt.is_temp_name(sha + ".kv") is None


def test_ktm_trailer_bytes_match_spec():
    expected = (b"KTM" + bytes([1]) + struct.pack("<I", 2)
                + struct.pack("<II", 4, 3) + b"call" + b"<x>"
                + struct.pack("<II", 2, 5) + b"id" + b"hello")
    assert fmt.encode_tool_map([("call", b"<x>"), ("id", b"hello")]) == expected
    assert fmt.decode_tool_map(expected) == {"call": b"<x>", "id": b"hello"}
    assert fmt.encode_tool_map([]) == b""


@given(cut=st.integers(0, 40))
def test_ktm_decode_is_lenient_on_truncation(cut):
    blob = fmt.encode_tool_map([("call", b"<x>"), ("id", b"hello")])
    got = fmt.decode_tool_map(blob[:cut])
    assert got in ({}, {"call": b"<x>"}, {"call": b"<x>", "id": b"hello"})


@given(data=st.binary(max_size=64))
def test_ktm_decode_never_crashes(data):
    assert isinstance(fmt.decode_tool_map(b"KTM\x01" + data), dict)


def test_select_tool_map_keeps_only_blocks_in_text():
    text = b"...<tool_calls>B</tool_calls> and <tool_calls>A</tool_calls>"
    got = fmt.select_tool_map(text, {"a": b"<tool_calls>A</tool_calls>", "b": b"<tool_calls>B</tool_calls>",
                                     "z": b"<tool_calls>Z</tool_calls>"})
    assert got == [("b", b"<tool_calls>B</tool_calls>"), ("a", b"<tool_calls>A</tool_calls>")]


def test_whole_file_layout(tmp_path):
    """[48 header][u32 text_bytes][text][payload][KTM], named sha1(text).kv."""
    eng = fk.FakeEngine(routed_bits=4)
    s = eng.session(ctx=256)
    prompt = fk.text_of(40, seed=1) + "<tool_calls>T</tool_calls>"
    s.sync(eng.tokenizer.encode_rendered(prompt))
    cache = KVCache(tmp_path, min_tokens=8)
    entry = cache.store(s, "shutdown", eng, tool_map={"t1": b"<tool_calls>T</tool_calls>"})
    assert entry is not None
    text = prompt.encode()
    payload = s.save_payload()
    data = entry.path.read_bytes()
    assert entry.path.name == hashlib.sha1(text).hexdigest() + ".kv"
    assert data[0:3] == b"KVC" and data[3] == 1 and data[4] == 4 and data[5] == 4 and data[6] == 1
    assert data[7] == 0 and data[20:24] == bytes(4)
    assert struct.unpack_from("<III", data, 8) == (len(s.tokens), 0, 256)
    created, used, pbytes = struct.unpack_from("<QQQ", data, 24)
    assert created == used > 1_600_000_000 and pbytes == len(payload)
    assert struct.unpack_from("<I", data, 48) == (len(text),)
    assert data[52 : 52 + len(text)] == text
    assert data[52 + len(text) : 52 + len(text) + len(payload)] == payload
    trailer = data[52 + len(text) + len(payload):]
    assert trailer == b"KTM\x01" + struct.pack("<I", 1) + struct.pack("<II", 2, 26) + b"t1" + b"<tool_calls>T</tool_calls>"


def test_touch_header_changes_only_hits_and_last_used(tmp_path):
    p = tmp_path / "x.kv"
    p.write_bytes(spec_header() + struct.pack("<I", 0) + b"rest")
    assert fmt.touch_header(p, hits=42, now=1_800_000_000)
    data = p.read_bytes()
    assert data == spec_header(hits=42, used=1_800_000_000) + struct.pack("<I", 0) + b"rest"
    assert not fmt.touch_header(tmp_path / "missing.kv", 1, 1)


def test_write_file_atomic_leaves_no_temp_on_error(tmp_path):
    def chunks():
        yield b"abc"
        raise OSError(28, "No space left on device")

    target = tmp_path / ("0" * 40 + ".kv")
    with pytest.raises(OSError):
        fmt.write_file_atomic(target, chunks())
    assert list(tmp_path.iterdir()) == []
    assert fmt.write_file_atomic(target, [b"ab", b"cd"]) == 4
    assert target.read_bytes() == b"abcd" and list(tmp_path.iterdir()) == [target]


def test_atomic_writer_temp_names_are_recognised_as_temp_files(tmp_path):
    # ds4._atomic names the temp file; the cache's stale-temp cleanup must recognise that name.
    import os

    target = tmp_path / fmt.name_for_sha("ab" * 20)
    assert fmt.is_temp_name(fmt.temp_path_for(target).name) == os.getpid()
    assert fmt.is_temp_name(target.name) is None
