"""ds4._core.stream_read, the read-bandwidth probe of bench/kernels.py and bench/llama_peer.py: it
must read every byte exactly once whatever the split over threads, or the bandwidth it reports is
wrong. Its checksum is the wrapping sum of the little-endian u64 words of each 256 KiB chunk plus
that chunk's tail bytes (fewer than 64) added one by one; the expected value is computed here in
numpy from that definition."""

from __future__ import annotations

import numpy as np
import pytest

import ds4._core as core

CHUNK = 256 * 1024


def expected_checksum(buf: np.ndarray) -> int:
    total = 0
    for c0 in range(0, buf.size, CHUNK):
        part = buf[c0:c0 + CHUNK]
        whole = part.size // 64 * 64
        total += int(part[:whole].view("<u8").sum(dtype=np.uint64)) + int(part[whole:].sum(dtype=np.uint64))
    return total % 2**64


@pytest.mark.parametrize("size", [0, 1, 63, 64, 65, 4096 + 7, CHUNK - 1, CHUNK, 3 * CHUNK + 100])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_stream_read_reads_every_byte_once(size, threads):
    buf = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    old = core.threads()
    core.set_threads(threads)
    try:
        got = core.stream_read(buf)
    finally:
        core.set_threads(old)
    assert got == expected_checksum(buf)


def test_stream_read_notices_one_changed_byte():
    """The check above is able to fail: one byte +1 anywhere (here the last byte of a middle
    chunk's tail and the first byte of a word) changes the checksum."""
    buf = np.random.default_rng(7).integers(0, 255, 2 * CHUNK + 70, dtype=np.uint8)
    want = core.stream_read(buf)
    for pos in (CHUNK + 8, 2 * CHUNK + 69):
        b = buf.copy()
        b[pos] += 1
        assert core.stream_read(b) != want


def test_stream_read_takes_non_contiguous_views():
    """A strided view is read as its own elements (copied to a contiguous buffer first)."""
    base = np.random.default_rng(3).integers(0, 256, 1000, dtype=np.uint8)
    assert core.stream_read(base[::2]) == expected_checksum(np.ascontiguousarray(base[::2]))
