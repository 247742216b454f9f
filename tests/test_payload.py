"""DSV4 session payload reader (ds4.payload) against docs/runtime.md §6.1-6.2, written from the spec.

The reference payload below is assembled field by field with struct.pack from the spec's table,
never with ds4.payload's writer, so the layout is pinned independently of the code under test.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, strategies as st

from ds4.errors import CacheFormatError
from ds4.payload import (
    PAYLOAD_MAGIC,
    PayloadHeader,
    attn_state_bytes,
    check_payload_fits,
    index_state_bytes,
    payload_bytes,
    payload_sections,
    read_payload_header,
    read_payload_info,
    synthetic_payload,
)

# A 3-layer model: dense, ratio 4 (with indexer), ratio 128. D=2, I=1, V=3. T=5 tokens, ctx 16.
RATIOS = (0, 4, 128)
D, I, V, T, CTX = 2, 1, 3, 5, 16


def f32s(value: float, n: int) -> bytes:
    return struct.pack(f"<{n}f", *([value] * n))


def hand_payload() -> tuple[bytes, list[tuple[str, int, float]]]:
    """Payload bytes per §6.1 and (section, offset, marker float) for every float section."""
    raw_cap = raw_window = 16          # CPU: min(128, ctx)
    rows = min(raw_window, T)          # field 12
    comp_cap = CTX // 4 + 2
    header = struct.pack(
        "<13I", 0x34565344, 1, CTX, 16, raw_cap, raw_window, comp_cap, T, 3, D, I, V, rows
    )
    parts = [header, struct.pack("<5I", 10, 11, 12, 13, 14)]
    marks = []
    off = len(header) + 20

    def sect(name: str, value: float, n: int) -> None:
        nonlocal off
        parts.append(f32s(value, n))
        if n:
            marks.append((name, off, value))
        off += 4 * n

    sect("logits", 1.0, V)
    parts.append(struct.pack("<3I", 0, 1, 0))   # n_comp: 5//4 = 1 on the ratio-4 layer
    parts.append(struct.pack("<3I", 0, 1, 0))   # n_index_comp
    off += 24
    sect("layer0.raw", 2.0, rows * D)
    sect("layer1.raw", 3.0, rows * D)
    sect("layer1.comp", 4.0, 1 * D)
    sect("layer1.attn_state_kv", 5.0, (2 * 4) * (2 * D))     # coff*ratio rows x coff*D
    sect("layer1.attn_state_score", 6.0, (2 * 4) * (2 * D))
    sect("layer1.index_comp", 7.0, 1 * I)
    sect("layer1.index_state_kv", 8.0, (2 * 4) * (2 * I))
    sect("layer1.index_state_score", 9.0, (2 * 4) * (2 * I))
    sect("layer2.raw", 10.0, rows * D)
    sect("layer2.comp", 11.0, 0)
    sect("layer2.attn_state_kv", 12.0, 128 * D)
    sect("layer2.attn_state_score", 13.0, 128 * D)
    return b"".join(parts), marks


def test_hand_built_payload_size_and_sections():
    blob, marks = hand_payload()
    # 52 header + 20 tokens + 12 logits + 24 counts, then per layer (sizes in bytes):
    expected = 52 + 20 + 12 + 24 + 40 + (40 + 8 + 128 + 128 + 4 + 64 + 64) + (40 + 0 + 1024 + 1024)
    assert len(blob) == expected == 2672
    info = read_payload_info(blob, RATIOS, head_dim=D, indexer_head_dim=I, n_vocab=V)
    assert info.nbytes == expected
    assert info.n_comp == (0, 1, 0) and info.n_index_comp == (0, 1, 0)
    assert info.header == PayloadHeader(PAYLOAD_MAGIC, 1, CTX, 16, 16, 16, 6, T, 3, D, I, V, 5)
    sections = {name: (off, n) for name, off, n in payload_sections(info)}
    for name, off, value in marks:
        assert sections[name][0] == off, name
        assert struct.unpack_from("<f", blob, off)[0] == value, name
    assert sections["tokens"] == (52, 20)
    assert struct.unpack_from("<5I", blob, sections["tokens"][0]) == (10, 11, 12, 13, 14)
    last = payload_sections(info)[-1]
    assert last[1] + last[2] == len(blob)


def test_header_pack_is_13_little_endian_u32():
    h = PayloadHeader(*range(100, 113))
    assert h.pack() == struct.pack("<13I", *range(100, 113))
    assert PayloadHeader.unpack(h.pack()) == h
    assert struct.pack("<I", PAYLOAD_MAGIC) == b"DSV4"


def test_synthetic_payload_matches_hand_layout():
    blob, _ = hand_payload()
    syn = synthetic_payload(n_layer=3, head_dim=D, indexer_head_dim=I, n_vocab=V, ratios=RATIOS,
                            ctx=CTX, tokens=[10, 11, 12, 13, 14])
    assert len(syn) == len(blob)
    assert syn[:72] == blob[:72]          # header + tokens
    assert syn[84:108] == blob[84:108]    # row counts


def test_flash_frontier_sizes_from_spec():
    # docs/runtime.md §5.1: ratio-4 attention state 32768 B, ratio-128 262144 B, ratio-4 indexer 8192 B.
    assert attn_state_bytes(4, 512) == 32768
    assert attn_state_bytes(128, 512) == 262144
    assert index_state_bytes(4, 128) == 8192


def test_flash_payload_size_formula():
    # §6.1 with Flash values and n_comp = T // ratio; the T-independent part once T >= 128 is
    # logits + 43*128 raw rows + frontiers = 0.49 + 10.75 + 11.64 MiB (spec figures, rounded).
    from ds4.shape import FLASH

    def size(t: int) -> int:
        rows = min(128, t)
        h = PayloadHeader(PAYLOAD_MAGIC, 1, 32768, 2048, 2304, 128, 8194, t, 43, 512, 128, 129280, rows)
        n_comp = [t // r if r else 0 for r in FLASH.compress_ratios]
        n_index = [t // r if r == 4 else 0 for r in FLASH.compress_ratios]
        return payload_bytes(h, n_comp, n_index, FLASH.compress_ratios)

    t = 512
    by_hand = 52 + 4 * t + 4 * 129280 + 8 * 43 + 43 * 128 * 2048
    by_hand += 21 * ((t // 4) * 2048 + 2 * 32768 + (t // 4) * 512 + 2 * 8192)
    by_hand += 20 * ((t // 128) * 2048 + 2 * 262144)
    assert size(t) == by_hand
    assert abs(size(512) / 2**20 - 29.6) < 0.05     # spec: T=512 -> ~29.6 MiB
    assert abs(size(2048) / 2**20 - 49.8) < 0.05    # spec: T=2048 -> ~49.8 MiB
    assert abs(size(10240) / 2**20 - 157) < 0.5     # spec: T=10240 -> ~157 MiB


@pytest.mark.parametrize(
    "field, value, message",
    [(0, 0x12345678, "unsupported session payload version"),
     (1, 2, "unsupported session payload version"),
     (8, 4, "different DS4 layout"),
     (9, 4, "different DS4 layout"),
     (12, 4, "raw ring layout"),
     (4, 0, "raw ring layout")],
)
def test_header_field_corruption_is_rejected(field, value, message):
    blob, _ = hand_payload()
    bad = bytearray(blob)
    struct.pack_into("<I", bad, 4 * field, value)
    with pytest.raises(CacheFormatError, match=message):
        read_payload_info(bytes(bad), RATIOS, head_dim=D, indexer_head_dim=I, n_vocab=V)


def test_row_count_over_capacity_is_rejected():
    blob, _ = hand_payload()
    bad = bytearray(blob)
    struct.pack_into("<I", bad, 52 + 20 + 12 + 4, 7)   # n_comp[1] = 7 > comp cap 6
    with pytest.raises(CacheFormatError, match="invalid compressed row count"):
        read_payload_info(bytes(bad), RATIOS)


def test_trailing_bytes_rejected_unless_not_exact():
    blob, _ = hand_payload()
    with pytest.raises(CacheFormatError, match="trailing payload bytes"):
        read_payload_info(blob + b"\0", RATIOS)
    assert read_payload_info(blob + b"\0", RATIOS, exact=False).nbytes == len(blob)


@given(cut=st.integers(min_value=0, max_value=2671))
def test_every_truncation_raises_cache_format_error(cut):
    blob, _ = hand_payload()
    with pytest.raises(CacheFormatError):
        read_payload_info(blob[:cut], RATIOS)


@given(pos=st.integers(min_value=0, max_value=107), byte=st.integers(0, 255))
def test_corrupted_header_or_counts_never_crash(pos, byte):
    blob, _ = hand_payload()
    bad = bytearray(blob)
    bad[pos] = byte
    try:
        info = read_payload_info(bytes(bad), RATIOS)
    except CacheFormatError:
        return
    assert info.nbytes == len(bad)   # accepted only if still self-consistent


def test_read_header_short():
    with pytest.raises(CacheFormatError, match="truncated"):
        read_payload_header(b"DSV4")


def test_check_payload_fits_rules():
    blob, _ = hand_payload()
    h = read_payload_header(blob)
    check_payload_fits(h, 16)        # same ctx
    check_payload_fits(h, 64)        # larger ctx is fine here (chunk layout is the engine's check)
    with pytest.raises(CacheFormatError, match="does not fit current context"):
        check_payload_fits(h, 8)     # saved ctx 16 > 8
    with pytest.raises(CacheFormatError, match="does not fit current context"):
        check_payload_fits(PayloadHeader(*(list(h.__dict__.values())[:7] + [20] + list(h.__dict__.values())[8:])), 20)
