"""Byte layout of a disk KV cache file (``<sha1>.kv``), byte-compatible with upstream ds4.

docs/runtime.md §7.1. A file is::

    [48-byte KVC header][u32 text_bytes][cache text][DSV4 session payload][optional KTM trailer]

and is named by the lowercase SHA-1 hex of the cache text plus ``.kv``. The header (little-endian):

    off size field
      0    3 magic "KVC"
      3    1 version (1)
      4    1 routed-expert quant bits (2 or 4)
      5    1 save reason (0 unknown, 1 cold, 2 continued, 3 evict, 4 shutdown, 5/6 agent)
      6    1 extension flags (bit0 KTM trailer, bit1 responses-visible, bit2 thinking-visible)
      7    1 reserved
      8    4 cached token count (non-zero)
     12    4 hit count
     16    4 ctx size of the writing session
     20    4 reserved
     24    8 creation Unix time (s)
     32    8 last-used Unix time (s)
     40    8 payload byte count

This module only encodes and decodes bytes and files; policy (what to store, lookup, eviction)
lives in :mod:`ds4.kvcache`.

    >>> h = KVCHeader(quant_bits=2, reason=REASON_COLD, ext_flags=0, tokens=600, hits=0,
    ...               ctx=4096, created_at=1, last_used=1, payload_bytes=1000)
    >>> KVCHeader.unpack(h.pack()) == h, len(h.pack())
    (True, 48)
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, Iterable, Mapping

from ._atomic import temp_path, write_atomic
from .errors import CacheFormatError

__all__ = [
    "KVC_MAGIC",
    "KVC_VERSION",
    "KVC_HEADER_BYTES",
    "KVC_PREFIX_BYTES",
    "KTM_MAGIC",
    "KTM_VERSION",
    "EXT_TOOL_MAP",
    "EXT_RESPONSES_VISIBLE",
    "EXT_THINKING_VISIBLE",
    "REASON_UNKNOWN",
    "REASON_COLD",
    "REASON_CONTINUED",
    "REASON_EVICT",
    "REASON_SHUTDOWN",
    "REASON_AGENT_SYSTEM",
    "REASON_AGENT_SESSION",
    "REASON_NAMES",
    "reason_code",
    "reason_name",
    "key_kind",
    "KVCHeader",
    "sha1_hex",
    "sha_from_name",
    "name_for_sha",
    "is_temp_name",
    "temp_path_for",
    "encode_tool_map",
    "decode_tool_map",
    "select_tool_map",
    "write_file_atomic",
    "read_header_file",
    "touch_header",
]

KVC_MAGIC = b"KVC"
KVC_VERSION = 1
KVC_HEADER_BYTES = 48
KVC_PREFIX_BYTES = KVC_HEADER_BYTES + 4  # header + u32 text_bytes: where the text starts

KTM_MAGIC = b"KTM"
KTM_VERSION = 1
KTM_HEADER_BYTES = 8
KTM_MAX_ID_BYTES = 256
KTM_MAX_DSML_BYTES = 512 * 1024 * 1024
KTM_DEFAULT_MAX_IDS = 100000  # upstream --tool-memory-max-ids; a trailer may hold 4x that

EXT_TOOL_MAP = 1 << 0
EXT_RESPONSES_VISIBLE = 1 << 1
EXT_THINKING_VISIBLE = 1 << 2

REASON_UNKNOWN = 0
REASON_COLD = 1
REASON_CONTINUED = 2
REASON_EVICT = 3
REASON_SHUTDOWN = 4
REASON_AGENT_SYSTEM = 5
REASON_AGENT_SESSION = 6
REASON_NAMES = ("unknown", "cold", "continued", "evict", "shutdown", "agent-system", "agent-session")

_HEADER_STRUCT = struct.Struct("<3sBBBBBIIIIQQQ")
assert _HEADER_STRUCT.size == KVC_HEADER_BYTES
_SHA_NAME = re.compile(r"^([0-9a-fA-F]{40})\.kv$")
_TEMP_NAME = re.compile(r"^[0-9a-fA-F]{40}\.kv\.tmp\.(\d+)(?:\.[0-9a-zA-Z]+)?$")


def reason_code(reason: str | int | None) -> int:
    """Numeric reason for a name ("cold", ...); unknown names give 0 like upstream."""
    if isinstance(reason, int):
        return reason if 0 <= reason < len(REASON_NAMES) else REASON_UNKNOWN
    try:
        return REASON_NAMES.index(reason) if reason else REASON_UNKNOWN
    except ValueError:
        return REASON_UNKNOWN


def reason_name(code: int) -> str:
    return REASON_NAMES[code] if 0 <= code < len(REASON_NAMES) else REASON_NAMES[0]


def key_kind(ext_flags: int) -> str:
    """What the cache text is: the token text, or a remembered client-visible transcript."""
    if ext_flags & EXT_RESPONSES_VISIBLE:
        return "responses-visible"
    if ext_flags & EXT_THINKING_VISIBLE:
        return "thinking-visible"
    return "token-text"


@dataclass(frozen=True)
class KVCHeader:
    """The fixed 48-byte header of a ``.kv`` file plus the u32 text length that follows it."""

    quant_bits: int
    reason: int
    ext_flags: int
    tokens: int
    hits: int
    ctx: int
    created_at: int
    last_used: int
    payload_bytes: int
    text_bytes: int = 0

    def pack(self) -> bytes:
        """The 48 header bytes (without the text length)."""
        return _HEADER_STRUCT.pack(
            KVC_MAGIC, KVC_VERSION, self.quant_bits, self.reason, self.ext_flags, 0,
            self.tokens, self.hits, self.ctx, 0, self.created_at, self.last_used, self.payload_bytes,
        )

    def pack_prefix(self) -> bytes:
        """Header + u32 text_bytes: the first 52 bytes of the file."""
        return self.pack() + struct.pack("<I", self.text_bytes)

    @classmethod
    def unpack(cls, data: bytes, text_bytes: int = 0) -> "KVCHeader":
        """Decode and validate 48 header bytes (upstream ``ds4_kvstore_read_header`` rules)."""
        if len(data) < KVC_HEADER_BYTES:
            raise CacheFormatError(f"truncated KV cache header: {len(data)} of {KVC_HEADER_BYTES} bytes")
        (magic, version, quant, reason, ext, _r0, tokens, hits, ctx, _r1, created, used,
         payload) = _HEADER_STRUCT.unpack_from(data, 0)
        if magic != KVC_MAGIC:
            raise CacheFormatError(f"not a KV cache file: magic {magic!r}, expected {KVC_MAGIC!r}")
        if version != KVC_VERSION:
            raise CacheFormatError(f"unsupported KV cache file version {version}, expected {KVC_VERSION}")
        if quant not in (2, 4):
            raise CacheFormatError(f"KV cache header has quant bits {quant}, expected 2 or 4")
        if tokens == 0:
            raise CacheFormatError("KV cache header has a cached token count of 0")
        # Upstream reads reasons it does not know as 0 instead of rejecting the file.
        reason = reason if reason < len(REASON_NAMES) else REASON_UNKNOWN
        return cls(quant, reason, ext, tokens, hits, ctx, created, used, payload, text_bytes)

    @classmethod
    def unpack_prefix(cls, data: bytes) -> "KVCHeader":
        if len(data) < KVC_PREFIX_BYTES:
            raise CacheFormatError(f"truncated KV cache header: {len(data)} of {KVC_PREFIX_BYTES} bytes")
        (text_bytes,) = struct.unpack_from("<I", data, KVC_HEADER_BYTES)
        return cls.unpack(data, text_bytes)

    @property
    def reason_name(self) -> str:
        return reason_name(self.reason)

    @property
    def payload_offset(self) -> int:
        return KVC_PREFIX_BYTES + self.text_bytes

    @property
    def min_file_size(self) -> int:
        """A file shorter than this is not an entry (the payload would be cut)."""
        return KVC_PREFIX_BYTES + self.text_bytes + self.payload_bytes

    def with_use(self, hits: int, last_used: int) -> "KVCHeader":
        """The header after one more use. The u32 hit counter saturates instead of overflowing
        (a file claiming 2**32-1 hits must still be usable)."""
        return replace(self, hits=min(max(int(hits), 0), 0xFFFFFFFF),
                       last_used=min(max(int(last_used), 0), 0xFFFFFFFFFFFFFFFF))


def sha1_hex(data: bytes) -> str:
    """Lowercase SHA-1 hex of ``data``: the cache file's name stem."""
    return hashlib.sha1(data).hexdigest()


def sha_from_name(name: str) -> str | None:
    """The lowercased SHA of a ``<40 hex>.kv`` name (either case accepted), else None."""
    m = _SHA_NAME.match(name)
    return m.group(1).lower() if m else None


def name_for_sha(sha: str) -> str:
    return f"{sha}.kv"


def is_temp_name(name: str) -> int | None:
    """The writer's pid if ``name`` is one of our in-progress temp files, else None."""
    m = _TEMP_NAME.match(name)
    return int(m.group(1)) if m else None


# temp name and atomic write: shared with other writers in ds4._atomic (the temp name
# ``<name>.tmp.<pid>.<random>`` is what _TEMP_NAME recognises)
temp_path_for = temp_path
write_file_atomic = write_atomic


# ---------------------------------------------------------------- KTM tool-id map trailer

def encode_tool_map(items: Iterable[tuple[str | bytes, bytes]]) -> bytes:
    """The KTM trailer for ``(tool id, exact DSML bytes)`` pairs; empty bytes if there are none."""
    body = []
    count = 0
    for tool_id, dsml in items:
        tid = tool_id.encode() if isinstance(tool_id, str) else bytes(tool_id)
        if not 1 <= len(tid) <= KTM_MAX_ID_BYTES or not 1 <= len(dsml) <= KTM_MAX_DSML_BYTES:
            continue  # upstream's loader would stop at such an entry; never write one
        body.append(struct.pack("<II", len(tid), len(dsml)) + tid + bytes(dsml))
        count += 1
    if count == 0:
        return b""
    return KTM_MAGIC + bytes([KTM_VERSION]) + struct.pack("<I", count) + b"".join(body)


def decode_tool_map(data: bytes, max_ids: int = KTM_DEFAULT_MAX_IDS) -> dict[str, bytes]:
    """Read a KTM trailer leniently, like upstream: a bad header gives {}, a short entry stops."""
    out: dict[str, bytes] = {}
    if len(data) < KTM_HEADER_BYTES or data[:3] != KTM_MAGIC or data[3] != KTM_VERSION:
        return out
    (count,) = struct.unpack_from("<I", data, 4)
    if count > 4 * max_ids:
        return out
    off = KTM_HEADER_BYTES
    for _ in range(count):
        if off + 8 > len(data):
            break
        id_len, dsml_len = struct.unpack_from("<II", data, off)
        if not 1 <= id_len <= KTM_MAX_ID_BYTES or not 1 <= dsml_len <= KTM_MAX_DSML_BYTES:
            break
        off += 8
        if off + id_len + dsml_len > len(data):
            break
        tid = data[off : off + id_len].decode("utf-8", "surrogateescape")
        out[tid] = bytes(data[off + id_len : off + id_len + dsml_len])
        off += id_len + dsml_len
    return out


def select_tool_map(text: bytes, tool_map: Mapping[str, bytes] | None) -> list[tuple[str, bytes]]:
    """The mappings worth persisting with ``text``: those whose DSML block occurs in it.

    Upstream scans the text for tool-call blocks and writes every id remembered for each block;
    keeping the pairs whose exact DSML bytes occur in the text selects the same pairs, ordered by
    where the block first appears.
    """
    if not tool_map:
        return []
    found = []
    for tool_id, dsml in tool_map.items():
        pos = text.find(dsml) if dsml else -1
        if pos >= 0:
            found.append((pos, tool_id, dsml))
    found.sort(key=lambda x: (x[0], x[1]))
    return [(tid, dsml) for _, tid, dsml in found]


# ---------------------------------------------------------------- files

def read_header_file(fp: BinaryIO) -> KVCHeader:
    """Read and validate the 52-byte prefix of an open cache file positioned at 0."""
    return KVCHeader.unpack_prefix(fp.read(KVC_PREFIX_BYTES))


def touch_header(path: Path, hits: int, now: int) -> bool:
    """Rewrite the 48-byte header in place with a new hit count and last-used time.

    Only those two fields change and the write is a single 48-byte pwrite at offset 0, so a
    concurrent reader sees either the old or the new counters. Returns False if the file vanished
    or is no longer a valid cache file.
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        data = os.pread(fd, KVC_PREFIX_BYTES, 0)
        try:
            header = KVCHeader.unpack_prefix(data)
        except CacheFormatError:
            return False
        new = header.with_use(hits, now).pack()
        return os.pwrite(fd, new, 0) == len(new)
    except OSError:
        return False
    finally:
        os.close(fd)
