"""The disk KV cache's files: what a directory scan sees, reading and verifying one file, and the
score that decides which files to delete when the directory is over budget.

This is the storage layer under :class:`ds4.kvcache.KVCache` (which holds the reuse and store
policy the server and ``generate`` follow) and the ``ds4 cache`` commands. File format:
:mod:`ds4.kvcache_format`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import kvcache_format as fmt
from .errors import CacheFormatError
from .payload import PayloadHeader, check_payload_fits, read_payload_header, read_payload_info

__all__ = [
    "MiB",
    "DEFAULT_MAX_BYTES",
    "HIT_HALF_LIFE_SECONDS",
    "MIN_EFFECTIVE_HITS",
    "CacheEntry",
    "InvalidCacheFile",
    "CacheFile",
    "eviction_score",
    "read_cache_file",
    "scan_directory",
    "probe_file",
]

log = logging.getLogger("ds4.kvcache")

MiB = 1024 * 1024
DEFAULT_MAX_BYTES = 4096 * MiB
HIT_HALF_LIFE_SECONDS = 6 * 60 * 60
MIN_EFFECTIVE_HITS = 0.01
STALE_TEMP_SECONDS = 3600


@dataclass(frozen=True)
class CacheEntry:
    """One valid-looking ``.kv`` file as seen by a directory scan (header + size checks only)."""

    sha: str
    path: Path
    header: fmt.KVCHeader
    file_size: int

    tokens = property(lambda self: self.header.tokens)
    hits = property(lambda self: self.header.hits)
    ctx = property(lambda self: self.header.ctx)
    quant_bits = property(lambda self: self.header.quant_bits)
    ext_flags = property(lambda self: self.header.ext_flags)
    created_at = property(lambda self: self.header.created_at)
    last_used = property(lambda self: self.header.last_used)
    payload_bytes = property(lambda self: self.header.payload_bytes)
    text_bytes = property(lambda self: self.header.text_bytes)
    reason = property(lambda self: self.header.reason_name)
    key_kind = property(lambda self: fmt.key_kind(self.header.ext_flags))


@dataclass(frozen=True)
class InvalidCacheFile:
    """A ``<sha>.kv`` file that is not an entry (bad header, truncated); it still uses space."""

    path: Path
    file_size: int
    error: str


@dataclass(frozen=True)
class CacheFile:
    """A fully read and verified cache file."""

    entry: CacheEntry
    text: bytes
    payload: bytes
    payload_header: PayloadHeader
    tool_map: dict[str, bytes]



class _CorruptFile(CacheFormatError):
    """Integrity failure (not mere incompatibility): the file can never load and is deleted."""


@dataclass(frozen=True)
class _Model:
    tokenizer: Any
    quant_bits: int | None
    shape: Any


# ---------------------------------------------------------------- module-level helpers

def eviction_score(entry: CacheEntry, now: float, *, protected: bool = False) -> float:
    """Upstream's keep-worthiness of a file (higher is kept longer); see the module docstring."""
    if protected:
        return math.inf
    if entry.file_size <= 0:
        return 0.0
    hits = float(entry.hits)
    used_at = entry.last_used or entry.created_at
    if used_at == 0:
        hits = 0.0
    elif now > used_at:
        hits *= 2.0 ** (-(now - used_at) / HIT_HALF_LIFE_SECONDS)
        if hits < MIN_EFFECTIVE_HITS:
            hits = 0.0
    return (hits + 1.0) * entry.tokens / entry.file_size


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def scan_directory(
    directory: Path, *, clean_temp: bool = True, stale_seconds: float = STALE_TEMP_SECONDS
) -> tuple[list[CacheEntry], list[InvalidCacheFile]]:
    """All ``*.kv`` files of ``directory`` split into entries and invalid files.

    Temp files of writers that died (or idle for ``stale_seconds``) are removed when
    ``clean_temp``. A missing directory scans as empty.
    """
    entries: list[CacheEntry] = []
    invalid: list[InvalidCacheFile] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return entries, invalid
    except OSError as e:
        log.warning("kv cache cannot list %s: %s", directory, e.strerror)
        return entries, invalid
    now = time.time()
    for name in names:
        path = directory / name
        sha = fmt.sha_from_name(name)
        if sha is None:
            pid = fmt.is_temp_name(name)
            if pid is not None and clean_temp and pid != os.getpid():
                _maybe_remove_temp(path, pid, now, stale_seconds)
            continue
        try:
            found = probe_file(path, sha)
        except FileNotFoundError:
            continue  # removed by another process between listdir and open
        except OSError as e:
            log.warning("kv cache cannot read %s: %s", path, e.strerror)
            continue
        if isinstance(found, InvalidCacheFile):
            _warn_once(path, found.file_size, f"kv cache ignoring invalid file {path}: {found.error}")
            invalid.append(found)
            continue
        entries.append(found)
    return entries, invalid


def probe_file(path: Path, sha: str) -> "CacheEntry | InvalidCacheFile":
    """One file's header and size checks: an entry, or why it is not one. Reads 52 bytes; every
    length in the header is bounded by the file's real size here, before anything reads the text
    or payload (docs/robustness.md). OSError (the file vanished, no permission) propagates."""
    with open(path, "rb") as fp:
        size = os.fstat(fp.fileno()).st_size
        prefix = fp.read(fmt.KVC_PREFIX_BYTES)
    try:
        header = fmt.KVCHeader.unpack_prefix(prefix)
        if size < header.min_file_size:
            raise CacheFormatError(
                f"truncated: {size} bytes, header implies at least {header.min_file_size}"
            )
    except CacheFormatError as e:
        return InvalidCacheFile(path, size, str(e))
    return CacheEntry(sha, path, header, size)


_warned: set[tuple[str, int, int]] = set()


def _warn_once(path: Path, size: int, message: str) -> None:
    """Every scan meets the same invalid file again: say it once per file version per process."""
    try:
        key = (str(path), size, path.stat().st_mtime_ns)
    except OSError:
        key = (str(path), size, 0)
    if key not in _warned:
        _warned.add(key)
        log.warning("%s", message)


def _maybe_remove_temp(path: Path, pid: int, now: float, stale_seconds: float) -> None:
    try:
        age = now - path.stat().st_mtime
    except OSError:
        return
    if not _pid_alive(pid) or age > stale_seconds:
        try:
            path.unlink()
            log.info("kv cache removed stale temp file %s", path)
        except OSError:
            pass


def read_cache_file(
    entry: CacheEntry,
    *,
    prompt: bytes | None = None,
    shape: Any = None,
    ctx: int | None = None,
) -> CacheFile:
    """Read ``entry`` in full and verify it (docs/runtime.md §7.5 step 4 plus payload checks).

    Verifies the header again, that the text hashes to the file name, that the text is a byte
    prefix of ``prompt`` (if given), the payload header (magic/version, token count = header
    count, ctx = header ctx, layout against ``shape`` if given, fits a ``ctx`` session if given).
    Raises :class:`~ds4.errors.CacheFormatError`.
    """
    path = entry.path
    try:
        with open(path, "rb") as fp:
            size = os.fstat(fp.fileno()).st_size
            header = fmt.read_header_file(fp)
            if size < header.min_file_size:
                raise _CorruptFile(f"{path}: truncated: {size} bytes, header implies {header.min_file_size}")
            if prompt is not None and header.text_bytes > len(prompt):
                raise CacheFormatError(f"{path}: cached text is longer than prompt")
            text = fp.read(header.text_bytes)
            if len(text) != header.text_bytes:
                raise _CorruptFile(f"{path}: truncated cached text")
            if fmt.sha1_hex(text) != entry.sha:
                raise _CorruptFile(f"{path}: cached text hash mismatch")
            if prompt is not None and not prompt.startswith(text):
                raise CacheFormatError(f"{path}: cached text prefix mismatch")
            payload = fp.read(header.payload_bytes)
            if len(payload) != header.payload_bytes:
                raise _CorruptFile(f"{path}: truncated session payload")
            trailer = fp.read() if header.ext_flags & fmt.EXT_TOOL_MAP else b""
    except FileNotFoundError as e:
        raise CacheFormatError(f"{path}: file vanished: {e.strerror}") from e
    except OSError as e:
        raise CacheFormatError(f"{path}: cannot read: {e.strerror}") from e
    except CacheFormatError as e:
        if str(e).startswith(str(path)):
            raise
        raise _CorruptFile(f"{path}: {e}") from e
    try:
        ph = read_payload_header(payload)
    except CacheFormatError as e:
        raise _CorruptFile(f"{path}: {e}") from e
    if ph.tokens != header.tokens or ph.ctx != header.ctx:
        raise _CorruptFile(
            f"{path}: payload holds {ph.tokens} tokens at ctx {ph.ctx}, header says "
            f"{header.tokens} tokens at ctx {header.ctx}"
        )
    if shape is not None:
        dims = (ph.n_layer, ph.head_dim, ph.indexer_head_dim, ph.n_vocab)
        want = (shape.n_layer, shape.head_dim, shape.indexer_head_dim, shape.n_vocab)
        if dims != want:
            raise CacheFormatError(
                f"{path}: KV checkpoint was written for a different DS4 layout: "
                f"layers/head dim/indexer dim/vocab {dims}, model has {want}"
            )
        try:
            read_payload_info(payload, shape.compress_ratios)
        except CacheFormatError as e:
            raise _CorruptFile(f"{path}: {e}") from e
    if ctx is not None:
        try:
            check_payload_fits(ph, ctx)
        except CacheFormatError as e:
            raise CacheFormatError(f"{path}: {e}") from e
    tool_map = fmt.decode_tool_map(trailer) if trailer else {}
    return CacheFile(CacheEntry(entry.sha, path, header, size), text, payload, ph, tool_map)
