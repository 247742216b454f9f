"""The disk KV cache: session checkpoints keyed by the rendered text they cover.

A :class:`KVCache` is a directory of ``<sha1>.kv`` files, byte-compatible with upstream ds4's
``--kv-disk-dir`` (format in :mod:`ds4.kvcache_format`, docs/runtime.md §7). Each file holds a session
payload (the exact token history and KV state after those tokens) and is named by the SHA-1 of the
*cache text* (the concatenated bytes of those tokens). Given a new rendered prompt, the cache finds
the file whose text is the longest byte prefix of the prompt, restores the session from it and
tokenizes only the text after it, so only the suffix is evaluated.

Integration (what ``generate`` / the CLI / the server do)::

    cache = ds4.KVCache("~/.cache/ds4/kv", max_bytes=4096 * ds4.kvcache.MiB)
    session = engine.session(ctx=32768)

    prepared = cache.prepare(session, rendered_text, engine)   # live reuse, evict store, disk hit
    cache.sync(session, prepared, engine)                      # sync + cold / continued stores
    for each generated token:
        cache.maybe_store_continued(session, engine)           # before each decode step
        ... session.eval(token) ...
    cache.shutdown(session, engine)                            # on clean exit

``prepare`` returns a :class:`PreparedPrompt` whose ``tokens`` is the full token list to sync
(``cached_tokens`` of which are already live in the session). ``engine`` may be an Engine (its
``tokenizer``, ``info.routed_bits`` and ``info.shape`` are used) or just a tokenizer with
``quant_bits=`` / ``shape=`` keywords; ``prompt`` may also be a token list (then only files whose
token history is an exact prefix are used, and the tokens are kept as given).

Layout: this module holds the reuse and store policy (:class:`KVCache`); the files themselves
(scan, read and verify, eviction score) are :mod:`ds4.kvcache_store`; the flags are
:mod:`ds4.kvcache_cli` (also reachable here). CLI wiring: ``ds4.kvcache.add_arguments(parser)`` adds ``--kv-cache-dir DIR`` (enables the cache),
``--kv-cache-mb N`` (``max_bytes = N * MiB``; 0 means the 4096 MiB default, as upstream) and the
``--kv-cache-*`` knobs; ``ds4.kvcache.from_args(args)`` returns the KVCache or None.

Policy, as upstream's server (docs/runtime.md §7.3-7.6):

* **cold**: a prompt with no cache hit and ``min_tokens <= len <= cold_max_tokens`` is stored at its
  chat anchor (just before the last ``<｜User｜>`` preceding the first ``<｜Assistant｜>``) if that is
  at least ``min_tokens``, else at :meth:`KVCache.store_len` (length minus ``boundary_trim``, aligned
  down to ``boundary_align``).
* **continued**: whenever the live length is a positive multiple of
  ``ceil(continued_interval / boundary_align) * boundary_align`` beyond the last store.
* **evict**: the live state is stored before a prompt that cannot reuse it replaces it.
* **shutdown**: :meth:`KVCache.shutdown` stores the live state.
* **lookup**: longest byte prefix among files with ``tokens >= min_tokens`` and ``ctx <= session
  ctx`` (and the same quant bits if ``reject_different_quant``); a file restoring more than
  ``cold_max_tokens`` tokens is consumed (deleted) on load, any other hit bumps its hit count and
  last-used time in place.
* **space**: after every store (and at open) files are deleted while the directory exceeds
  ``max_bytes``, lowest score first, where ``score = (effective_hits + 1) * tokens / file_size``
  and ``effective_hits = hits * 2 ** (-age / 6 h)`` (age since last use; below 0.01 counts as 0):
  a file earns its space by tokens per byte, and hits count double-ish but fade with a 6-hour
  half-life. Ties go to the older last use; the file just stored is protected unless it alone
  exceeds the budget. Unreadable ``*.kv`` files are deleted first.

Reliability: files are written to ``<name>.kv.tmp.<pid>.<random>``, fsynced and renamed, so a
crash never leaves a partial ``*.kv``; stale temp files of dead writers are removed when the
directory is scanned. Every load checks the header, sizes, SHA-1 of the text, the payload header
against the model and context, and the token count; failures are logged (``logging`` logger
``ds4.kvcache``) and the file is skipped (and deleted when it is corrupt rather than merely
incompatible). Store failures (directory gone, disk full) are logged and never raise.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from . import kvcache_format as fmt
from .errors import CacheFormatError, Ds4Error, Ds4IOError, InvalidArgumentError
from .kvcache_store import (  # noqa: F401  (re-exported: the storage layer's names)
    DEFAULT_MAX_BYTES,
    HIT_HALF_LIFE_SECONDS,
    MIN_EFFECTIVE_HITS,
    CacheEntry,
    CacheFile,
    InvalidCacheFile,
    MiB,
    _CorruptFile,
    _Model,
    eviction_score,
    probe_file,
    read_cache_file,
    scan_directory,
)
from .payload import PAYLOAD_HEADER_BYTES, read_payload_header, read_payload_info

__all__ = [
    "MiB",
    "HIT_HALF_LIFE_SECONDS",
    "MIN_EFFECTIVE_HITS",
    "KVCache",
    "CacheEntry",
    "InvalidCacheFile",
    "CacheFile",
    "PreparedPrompt",
    "eviction_score",
    "read_cache_file",
    "scan_directory",
    "add_arguments",
    "from_args",
]

log = logging.getLogger("ds4.kvcache")

USER_MARKER = "<｜User｜>".encode()
ASSISTANT_MARKER = "<｜Assistant｜>".encode()


@dataclass(frozen=True)
class PreparedPrompt:
    """What :meth:`KVCache.prepare` decided for one prompt.

    ``tokens`` is the full prompt to sync; its first ``cached_tokens`` are already live in the
    session. ``source`` is ``"memory"`` (live state reused), ``"disk"`` (restored from ``entry``),
    or ``"cold"`` (nothing reused). ``cold_len`` > 0 asks :meth:`KVCache.sync` to store a cold
    checkpoint at that length. ``tool_map`` holds tool-id -> DSML pairs read from a KTM trailer.
    """

    tokens: list[int]
    cached_tokens: int
    source: str
    cold_len: int = 0
    entry: CacheEntry | None = None
    consumed: bool = False
    load_ms: float = 0.0
    tool_map: dict[str, bytes] = field(default_factory=dict)


def _token_bytes(tokenizer: Any, tokens: Sequence[int]) -> bytes:
    """The cache text of ``tokens``: every token's raw bytes concatenated (docs/runtime.md §7.2)."""
    decode_bytes = getattr(tokenizer, "decode_bytes", None)
    if decode_bytes is not None:
        return bytes(decode_bytes(tokens))
    return b"".join(tokenizer.token_to_bytes(int(t)) for t in tokens)


def _encode_suffix(tokenizer: Any, suffix: bytes) -> list[int] | None:
    """Rendered-chat tokenization of the text after a cached prefix, or None if it cannot be
    decoded (the prefix ended inside a UTF-8 character: such a prefix cannot be reused)."""
    if not suffix:
        return []
    try:
        text = suffix.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return list(tokenizer.encode_rendered(text))


class KVCache:
    """A disk KV cache directory with upstream's defaults (docs/runtime.md §7.7).

    ``max_bytes`` is the space budget (0 means the 4096 MiB default). ``min_tokens``: nothing
    shorter is stored or loaded. ``cold_max_tokens``: longest prompt stored cold (0 disables cold
    stores); loads of longer files consume them. ``continued_interval``: store every this many
    tokens, rounded up to ``boundary_align`` (0 disables). ``boundary_trim`` / ``boundary_align``:
    see :meth:`store_len`. ``reject_different_quant``: do not reuse files written by a model with
    other routed-expert quant bits. The directory is created (mode 0700) if missing; a directory
    that cannot be created or written raises :class:`~ds4.errors.Ds4IOError`.
    """

    def __init__(
        self,
        dir: str | os.PathLike[str],
        max_bytes: int = DEFAULT_MAX_BYTES,
        min_tokens: int = 512,
        cold_max_tokens: int = 30000,
        continued_interval: int = 10000,
        boundary_trim: int = 32,
        boundary_align: int = 2048,
        reject_different_quant: bool = False,
        *,
        fsync: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        checks = [
            ("max_bytes", max_bytes, lambda v: v >= 0, ">= 0"),
            ("min_tokens", min_tokens, lambda v: v > 0, "> 0"),
            ("cold_max_tokens", cold_max_tokens, lambda v: v == 0 or v >= min_tokens, "0 or >= min_tokens"),
            ("continued_interval", continued_interval, lambda v: v >= 0, ">= 0"),
            ("boundary_trim", boundary_trim, lambda v: v >= 0, ">= 0"),
            ("boundary_align", boundary_align, lambda v: v >= 0, ">= 0"),
        ]
        for name, value, ok, want in checks:
            if not isinstance(value, int) or isinstance(value, bool) or not ok(value):
                raise InvalidArgumentError(f"KVCache {name}={value!r}, expected an integer {want}")
        self.dir = Path(os.path.expanduser(os.fspath(dir)))
        self.max_bytes = max_bytes or DEFAULT_MAX_BYTES
        self.min_tokens = min_tokens
        self.cold_max_tokens = cold_max_tokens
        self.continued_interval = continued_interval
        self.boundary_trim = boundary_trim
        self.boundary_align = boundary_align
        self.reject_different_quant = reject_different_quant
        self._fsync = fsync
        self._clock = clock
        self.last_store_tokens = 0  # high-water mark of cold/continued stores (§7.3)
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise Ds4IOError(f"cannot create KV cache directory {self.dir}: {e.strerror}") from e
        if not self.dir.is_dir():
            raise Ds4IOError(f"KV cache directory {self.dir} is not a directory")
        if not os.access(self.dir, os.W_OK | os.X_OK):
            raise Ds4IOError(f"KV cache directory {self.dir} is not writable")
        self.evict()
        log.info(
            "KV disk cache %s (budget=%d MiB, cross-quant=%s, min=%d, cold_max=%d, continued=%d, "
            "trim=%d, align=%d, hit_half_life=%ds)", self.dir, self.max_bytes // MiB,
            "reject" if reject_different_quant else "accept", min_tokens, cold_max_tokens,
            continued_interval, boundary_trim, boundary_align, HIT_HALF_LIFE_SECONDS,
        )

    def __repr__(self) -> str:
        return f"KVCache({str(self.dir)!r}, max_bytes={self.max_bytes})"

    # ------------------------------------------------------------ boundary helpers (§7.3)

    def store_len(self, tokens: int) -> int:
        """Where to cut a prompt of ``tokens`` for a cold store: drop ``boundary_trim`` tokens
        (BPE may merge across the end) and align down to ``boundary_align`` (the prefill chunk, so
        compressor rows finalize as in a cold prompt); unchanged if that falls below min_tokens."""
        if tokens > self.min_tokens + self.boundary_trim:
            stable = tokens - self.boundary_trim
            if self.boundary_align > 0:
                stable -= stable % self.boundary_align
            if stable >= self.min_tokens:
                return stable
        return tokens

    def chat_anchor(self, tokens: Sequence[int], tokenizer: Any) -> int:
        """Position of the last ``<｜User｜>`` before the first ``<｜Assistant｜>``, or -1 if it is
        below min_tokens: the stored prefix then covers the system prompt and tool schemas that
        other conversations share."""
        user, assistant = _marker_ids(tokenizer)
        if user is None or assistant is None:
            return -1
        last_user = -1
        for i, t in enumerate(tokens):
            if t == assistant:
                break
            if t == user:
                last_user = i
        return last_user if last_user >= self.min_tokens else -1

    def continued_step(self) -> int:
        """Continued-store spacing: the interval rounded up to the alignment (10000 -> 10240)."""
        step = self.continued_interval
        if step <= 0:
            return 0
        align = self.boundary_align
        if align > 0:
            step = max(align, -(-step // align) * align)
        return step

    def continued_target(self, live_tokens: int) -> int:
        """``live_tokens`` if a continued store is due there, else 0."""
        step = self.continued_step()
        if step <= 0 or live_tokens < self.min_tokens or live_tokens % step:
            return 0
        return live_tokens if live_tokens > self.last_store_tokens else 0

    def note_store(self, tokens: int) -> None:
        self.last_store_tokens = max(self.last_store_tokens, tokens)

    # ------------------------------------------------------------ directory view

    def scan(self) -> tuple[list[CacheEntry], list[InvalidCacheFile]]:
        """Entries and invalid files now in the directory (removes stale temp files)."""
        return scan_directory(self.dir)

    def entries(self) -> list[CacheEntry]:
        """Valid-looking entries, most recently used first."""
        entries, _ = self.scan()
        return sorted(entries, key=lambda e: (e.last_used, e.created_at), reverse=True)

    def total_bytes(self) -> int:
        entries, invalid = self.scan()
        return sum(e.file_size for e in entries) + sum(f.file_size for f in invalid)

    def candidates(
        self, prompt: bytes | str, ctx: int | None = None, quant_bits: int | None = None
    ) -> list[CacheEntry]:
        """Entries whose text hashes like a prefix of ``prompt``, best first (§7.5 steps 1-3):
        longest text, then most tokens. Only the header is trusted here; load verifies."""
        text = prompt.encode() if isinstance(prompt, str) else bytes(prompt)
        entries, _ = self.scan()
        ok = []
        for e in entries:
            if e.text_bytes > len(text) or e.tokens < self.min_tokens:
                continue
            if ctx is not None and e.ctx > ctx:
                continue
            if self.reject_different_quant and quant_bits is not None and e.quant_bits != quant_bits:
                continue
            ok.append(e)
        ok.sort(key=lambda e: (e.text_bytes, e.tokens), reverse=True)
        digests: dict[int, str] = {}
        out = []
        for e in ok:
            if e.text_bytes not in digests:
                digests[e.text_bytes] = fmt.sha1_hex(text[: e.text_bytes])
            if digests[e.text_bytes] == e.sha:
                out.append(e)
        return out

    def lookup(
        self, prompt: bytes | str, ctx: int | None = None, quant_bits: int | None = None
    ) -> CacheEntry | None:
        """The best candidate for ``prompt`` (see :meth:`candidates`), or None."""
        found = self.candidates(prompt, ctx, quant_bits)
        return found[0] if found else None

    def read(self, entry: CacheEntry | str | os.PathLike[str], **kw: Any) -> CacheFile:
        """Read and verify one file (an entry, a path, or a sha); see :func:`read_cache_file`."""
        return read_cache_file(self._entry_of(entry), **kw)

    def remove(self, entry: CacheEntry | str | os.PathLike[str]) -> bool:
        """Delete one file; False if it was already gone."""
        path = entry.path if isinstance(entry, CacheEntry) else self._path_of(entry)
        try:
            path.unlink()
            return True
        except FileNotFoundError:
            return False

    def _path_of(self, ref: str | os.PathLike[str]) -> Path:
        s = os.fspath(ref)
        return Path(s) if (os.sep in s or s.endswith(".kv")) else self.dir / fmt.name_for_sha(s.lower())

    def _entry_of(self, ref: CacheEntry | str | os.PathLike[str]) -> CacheEntry:
        if isinstance(ref, CacheEntry):
            return ref
        path = self._path_of(ref)
        sha = fmt.sha_from_name(path.name)
        if sha is None:
            raise CacheFormatError(f"{path}: not a cache file name (expected <40 hex>.kv)")
        try:
            with open(path, "rb") as fp:
                size = os.fstat(fp.fileno()).st_size
                header = fmt.read_header_file(fp)
        except FileNotFoundError as e:
            raise CacheFormatError(f"{path}: no such cache file") from e
        except OSError as e:
            raise CacheFormatError(f"{path}: cannot read: {e.strerror}") from e
        except CacheFormatError as e:
            raise CacheFormatError(f"{path}: {e}") from e
        return CacheEntry(sha, path, header, size)

    def tool_maps(self, wanted: Iterable[str] | None = None) -> dict[str, bytes]:
        """Tool-id -> exact DSML pairs from every file with a KTM trailer (only ``wanted`` ids if
        given), so exact tool-call replay survives restarts whichever file wins the lookup."""
        want = None if wanted is None else set(wanted)
        out: dict[str, bytes] = {}
        entries, _ = self.scan()
        for e in entries:
            if not e.ext_flags & fmt.EXT_TOOL_MAP:
                continue
            try:
                with open(e.path, "rb") as fp:
                    fp.seek(e.header.min_file_size)
                    pairs = fmt.decode_tool_map(fp.read())
            except OSError:
                continue
            out.update({k: v for k, v in pairs.items() if want is None or k in want})
        return out

    # ------------------------------------------------------------ eviction (§7.6)

    def evict(self, protect: str | None = None) -> list[Path]:
        """Delete files while the directory exceeds ``max_bytes``; returns the deleted paths.

        Invalid files go first, then the lowest :func:`eviction_score` (ties: older last use).
        ``protect`` (a sha, the file just stored) is kept unless it alone exceeds the budget.
        """
        entries, invalid = self.scan()
        now = self._clock()
        total = sum(e.file_size for e in entries) + sum(f.file_size for f in invalid)
        if protect is not None:
            mine = next((e for e in entries if e.sha == protect), None)
            if mine is not None and mine.file_size > self.max_bytes:
                protect = None
        removed: list[Path] = []
        victims: list[tuple[float, int, Path, int, str]] = [
            (-1.0, 0, f.path, f.file_size, "invalid") for f in invalid
        ]
        victims += [
            (eviction_score(e, now, protected=e.sha == protect), e.last_used, e.path, e.file_size,
             f"tokens={e.tokens} hits={e.hits}")
            for e in entries
        ]
        victims.sort(key=lambda v: (v[0], v[1]))
        for score, _used, path, size, what in victims:
            if total <= self.max_bytes:
                break
            try:
                path.unlink()
            except FileNotFoundError:
                pass  # another process evicted it first: its bytes are gone all the same
            except OSError as e:
                log.warning("kv cache cannot evict %s: %s", path, e.strerror)
                break
            else:
                removed.append(path)
                log.info("kv cache evicted reason=disk-cache-full %s size=%.2f MiB score=%.3g file=%s",
                         what, size / MiB, score, path)
            total -= size
        return removed

    # ------------------------------------------------------------ store (§7.3)

    def store(
        self,
        session: Any,
        reason: str,
        model: Any = None,
        *,
        text: bytes | str | None = None,
        ext_flags: int = 0,
        tool_map: Mapping[str, bytes] | None = None,
        quant_bits: int | None = None,
        shape: Any = None,
    ) -> CacheEntry | None:
        """Store the session's live state as a ``reason`` checkpoint; None if skipped or failed.

        ``text`` overrides the cache key (a client-visible transcript; set ``ext_flags`` to
        ``EXT_RESPONSES_VISIBLE`` or ``EXT_THINKING_VISIBLE``). ``tool_map`` pairs whose DSML occurs
        in the text are written as a KTM trailer. Never raises for I/O problems: they are logged.
        """
        m = self._model(session, model, quant_bits, shape)
        tokens = list(session.tokens)
        n = len(tokens)
        if n < self.min_tokens:
            log.debug("kv cache skipped tokens=%d reason=%s: below min_tokens=%d", n, reason, self.min_tokens)
            return None
        if m.quant_bits not in (2, 4):
            log.warning("kv cache skipped tokens=%d reason=%s: routed quant bits %r are not 2 or 4",
                        n, reason, m.quant_bits)
            return None
        if text is None:
            key = _token_bytes(m.tokenizer, tokens)
            ext = 0
        else:
            key = text.encode() if isinstance(text, str) else bytes(text)
            ext = ext_flags & (fmt.EXT_RESPONSES_VISIBLE | fmt.EXT_THINKING_VISIBLE)
        if len(key) > 0xFFFFFFFF:
            log.warning("kv cache skipped tokens=%d reason=%s: rendered text is too large", n, reason)
            return None
        try:
            payload = bytes(session.save_payload())
            ph = read_payload_header(payload)
            if ph.tokens != n:
                raise CacheFormatError(f"payload holds {ph.tokens} tokens, session has {n}")
            if m.shape is not None:
                read_payload_info(payload, m.shape.compress_ratios, head_dim=m.shape.head_dim,
                                  indexer_head_dim=m.shape.indexer_head_dim, n_vocab=m.shape.n_vocab)
        except (Ds4Error, ValueError) as e:
            log.warning("kv cache store failed (%s): cannot serialize session: %s", reason, e)
            return None
        trailer = fmt.encode_tool_map(fmt.select_tool_map(key, tool_map))
        if trailer:
            ext |= fmt.EXT_TOOL_MAP
        file_size = fmt.KVC_PREFIX_BYTES + len(key) + len(payload) + len(trailer)
        required = file_size + -(-file_size // 100)  # 1 % headroom, as upstream
        if required > self.max_bytes:
            log.info("kv cache skipped tokens=%d reason=%s: file size %.2f MiB (%.2f MiB with safety) "
                     "exceeds budget %.2f MiB", n, reason, file_size / MiB, required / MiB, self.max_bytes / MiB)
            return None
        sha = fmt.sha1_hex(key)
        path = self.dir / fmt.name_for_sha(sha)
        now = int(self._clock())
        existing = self._existing_compatible(path, sha, key, m.quant_bits, session.ctx)
        if existing is not None:
            if trailer:
                self._rewrite_trailer(existing, trailer, now)
            log.info("kv cache kept existing file tokens=%d reason=%s file=%s", n, reason, path)
            return existing
        if not self._has_free_space(file_size):
            log.warning("kv cache skipped tokens=%d reason=%s: not enough free disk space in %s for %.2f MiB",
                        n, reason, self.dir, file_size / MiB)
            return None
        header = fmt.KVCHeader(m.quant_bits, fmt.reason_code(reason), ext, n, 0, int(session.ctx),
                               now, now, len(payload), len(key))
        t0 = time.perf_counter()
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            fmt.write_file_atomic(path, [header.pack_prefix(), key, payload, trailer], fsync=self._fsync)
        except OSError as e:
            log.warning("kv cache store failed (%s): %s: %s", reason, path, e.strerror or e)
            return None
        log.info("kv cache stored tokens=%d reason=%s key=%s size=%.2f MiB save=%.1f ms", n, reason,
                 fmt.key_kind(ext), file_size / MiB, (time.perf_counter() - t0) * 1e3)
        self.evict(protect=sha)
        return CacheEntry(sha, path, header, file_size)

    def _has_free_space(self, nbytes: int) -> bool:
        try:
            st = os.statvfs(self.dir)
        except OSError:
            return True  # unknown: let the write itself fail cleanly if it must
        return st.f_bavail * st.f_frsize >= nbytes

    def _existing_compatible(
        self, path: Path, sha: str, key: bytes, quant_bits: int, ctx: int
    ) -> CacheEntry | None:
        """An existing file for the same key that a store may keep (§7.3 step 4); an
        incompatible one is deleted so the new checkpoint replaces it."""
        if not path.exists():
            return None
        try:
            entry = self._entry_of(path)
            ok = ((not self.reject_different_quant or entry.quant_bits == quant_bits)
                  and entry.ctx <= ctx and entry.file_size >= entry.header.min_file_size)
            if ok:
                with open(path, "rb") as fp:
                    fp.seek(fmt.KVC_PREFIX_BYTES)
                    ok = fp.read(entry.text_bytes) == key
        except (CacheFormatError, OSError):
            ok = False
        if ok:
            return entry
        try:
            path.unlink()
            log.info("kv cache replaced incompatible file %s", path)
        except OSError:
            pass
        return None

    def _rewrite_trailer(self, entry: CacheEntry, trailer: bytes, now: int) -> None:
        """Replace a kept file's KTM trailer in place: the payload region is never touched, and a
        reader that races with this sees at worst a short trailer, which loads as no mappings."""
        end = entry.header.min_file_size
        try:
            with open(entry.path, "r+b") as fp:
                fp.truncate(end)
                fp.seek(end)
                fp.write(trailer)
                fp.flush()
                header = fmt.KVCHeader.unpack_prefix(os.pread(fp.fileno(), fmt.KVC_PREFIX_BYTES, 0))
                new = fmt.KVCHeader(header.quant_bits, header.reason, header.ext_flags | fmt.EXT_TOOL_MAP,
                                    header.tokens, header.hits, header.ctx, header.created_at, now,
                                    header.payload_bytes, header.text_bytes)
                os.pwrite(fp.fileno(), new.pack(), 0)
        except (OSError, CacheFormatError) as e:
            log.warning("kv cache cannot rewrite tool map of %s: %s", entry.path, e)

    def maybe_store_continued(self, session: Any, model: Any = None, **kw: Any) -> CacheEntry | None:
        """Store a ``continued`` checkpoint if the live length is a continued target."""
        target = self.continued_target(len(session.tokens))
        if not target:
            return None
        entry = self.store(session, "continued", model, **kw)
        if entry is not None:
            self.note_store(target)
        return entry

    on_progress = maybe_store_continued

    def shutdown(self, session: Any, model: Any = None, **kw: Any) -> CacheEntry | None:
        """Store the live state as a ``shutdown`` checkpoint (clean exit)."""
        if len(session.tokens) < self.min_tokens:
            return None
        return self.store(session, "shutdown", model, **kw)

    # ------------------------------------------------------------ prepare / load / sync

    def prepare(
        self,
        session: Any,
        prompt: str | bytes | Sequence[int],
        model: Any = None,
        *,
        quant_bits: int | None = None,
        shape: Any = None,
        reuse_live: bool = True,
        full_tokens: Callable[[], Sequence[int]] | None = None,
    ) -> PreparedPrompt:
        """Decide how to reach ``prompt`` in ``session`` (docs/runtime.md §9.7 steps 7-9).

        ``prompt`` is rendered chat text (``str`` or UTF-8 ``bytes``), or a token list.

        1. live reuse: the session's token text is a byte prefix of the prompt (token mode: its
           tokens are a prefix of the prompt tokens);
        2. otherwise store the live state (``evict``) and try the disk, longest prefix first,
           skipping unreadable or incompatible files with a warning;
        3. otherwise tokenize the whole prompt and plan a ``cold`` store.

        Text mode tokenizes only the text after a reused prefix, as upstream does (BPE may merge
        across the boundary, so the request's own tokenization is not sliced). Token mode keeps the
        given tokens exactly and only accepts files whose token history is a prefix of them.

        ``full_tokens`` (text mode): on a miss, the whole prompt's tokens come from this call
        instead of ``encode_rendered(prompt)``, so a caller whose own tokenization of the same text
        differs (the CLI encodes chat parts one by one) runs exactly what it runs without a cache,
        and a hit never pays for a full tokenization.
        """
        m = self._model(session, model, quant_bits, shape)
        exact: list[int] | None = None
        if isinstance(prompt, (str, bytes, bytearray, memoryview)):
            data = prompt.encode() if isinstance(prompt, str) else bytes(prompt)
        else:
            exact = [int(t) for t in prompt]
            data = _token_bytes(m.tokenizer, exact)
        live = list(session.tokens)
        if reuse_live and live:
            if exact is not None:
                if exact[: len(live)] == live:
                    return PreparedPrompt(exact, len(live), "memory")
            else:
                live_text = _token_bytes(m.tokenizer, live)
                if data.startswith(live_text):
                    suffix = _encode_suffix(m.tokenizer, data[len(live_text):])
                    if suffix is not None:
                        return PreparedPrompt(live + suffix, len(live), "memory")
        self.last_store_tokens = 0
        if len(live) >= self.min_tokens:
            self.store(session, "evict", m.tokenizer, quant_bits=m.quant_bits, shape=m.shape)
        hit = self._load_best(session, data, m, exact)
        if hit is not None:
            return hit
        if exact is not None:
            tokens = exact
        elif full_tokens is not None:
            tokens = [int(t) for t in full_tokens()]
        else:
            try:
                full_text = prompt if isinstance(prompt, str) else data.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InvalidArgumentError(f"rendered prompt is not valid UTF-8 at byte {e.start}") from e
            tokens = list(m.tokenizer.encode_rendered(full_text))
        cold_len = 0
        if self.cold_max_tokens > 0 and self.min_tokens <= len(tokens) <= self.cold_max_tokens:
            anchor = self.chat_anchor(tokens, m.tokenizer)
            cold_len = anchor if anchor >= self.min_tokens else self.store_len(len(tokens))
        return PreparedPrompt(tokens, 0, "cold", cold_len=cold_len)

    def _load_best(
        self, session: Any, prompt: bytes, m: _Model, exact: list[int] | None = None
    ) -> PreparedPrompt | None:
        for entry in self.candidates(prompt, session.ctx, m.quant_bits):
            t0 = time.perf_counter()
            try:
                cf = read_cache_file(entry, prompt=prompt, shape=m.shape, ctx=session.ctx)
            except _CorruptFile as e:
                log.warning("kv cache discarded corrupt file: %s", e)
                self.remove(entry)
                continue
            except CacheFormatError as e:
                log.warning("kv cache load failed: %s", e)
                continue
            if exact is not None:
                n = cf.payload_header.tokens
                if len(cf.payload) < PAYLOAD_HEADER_BYTES + 4 * n:
                    log.warning("kv cache discarded corrupt file %s: payload shorter than its tokens", entry.path)
                    self.remove(entry)
                    continue
                stored = struct.unpack_from(f"<{n}I", cf.payload, PAYLOAD_HEADER_BYTES)
                if len(exact) < n or list(stored) != exact[:n]:
                    log.debug("kv cache skipped %s: its tokens are not a prefix of the prompt tokens", entry.path)
                    continue
                suffix: list[int] | None = exact[n:]
            else:
                suffix = _encode_suffix(m.tokenizer, prompt[len(cf.text):])
            if suffix is None:
                log.info("kv cache skipped %s: its text ends inside a UTF-8 character", entry.path)
                continue
            try:
                session.load_payload(cf.payload)
            except (Ds4Error, ValueError) as e:
                log.warning("kv cache load failed %s: %s", entry.path, e)
                continue
            loaded = list(session.tokens)
            if len(loaded) != cf.entry.tokens:
                log.warning("kv cache discarded corrupt text-prefix payload %s: restored %d tokens, "
                            "header says %d", entry.path, len(loaded), cf.entry.tokens)
                self.remove(entry)
                drop = getattr(session, "invalidate", None) or getattr(session, "reset", None)
                if drop is not None:
                    drop()
                continue
            load_ms = (time.perf_counter() - t0) * 1e3
            self.last_store_tokens = len(loaded)
            consumed = 0 < self.cold_max_tokens < len(loaded)
            if consumed:
                self.remove(entry)
            else:
                fmt.touch_header(entry.path, cf.entry.hits + 1, int(self._clock()))
            log.info("kv cache hit text tokens=%d text=%d quant=%d key=%s load=%.1f ms%s file=%s",
                     len(loaded), len(cf.text), cf.entry.quant_bits, cf.entry.key_kind, load_ms,
                     " consumed" if consumed else "", entry.path)
            return PreparedPrompt(loaded + suffix, len(loaded), "disk", entry=cf.entry,
                                  consumed=consumed, load_ms=load_ms, tool_map=cf.tool_map)
        return None

    def sync(
        self,
        session: Any,
        prepared: PreparedPrompt,
        model: Any = None,
        *,
        split_continued: bool = True,
        **kw: Any,
    ) -> None:
        """Sync ``session`` to ``prepared.tokens``, pausing at the cold point to store a ``cold``
        checkpoint, then store a ``continued`` one if the end is a target. The graph only moves
        forward: each pause is a prefix of the prompt, so the next sync extends it.

        With ``split_continued`` (default) it also pauses at every continued target inside the
        prompt, as upstream's chunked GPU prefill does. ds4's engine extends a session with the
        same batched prefill as a cold start, so the pauses cost nothing; turn it off for an engine
        whose extend path is token by token (upstream's CPU backend).
        """
        tokens = prepared.tokens
        n = len(tokens)
        stops = set()
        if prepared.cold_len > 0:
            stops.add(prepared.cold_len)
        step = self.continued_step()
        if split_continued and step > 0:
            first = (prepared.cached_tokens // step + 1) * step
            stops.update(range(first, n + 1, step))
        for stop in sorted(s for s in stops if s <= n):
            session.sync(tokens[:stop])
            if stop == prepared.cold_len:
                self._store_cold(session, model, **kw)
            self.maybe_store_continued(session, model, **kw)
        if len(session.tokens) != n or list(session.tokens) != tokens:
            session.sync(tokens)
        self.maybe_store_continued(session, model, **kw)

    def _store_cold(self, session: Any, model: Any, **kw: Any) -> None:
        n = len(session.tokens)
        # A continued store at the cold frontier would duplicate it: suppress it, re-enable on failure.
        old = self.last_store_tokens
        suppressed = self.continued_target(n) == n
        if suppressed:
            self.note_store(n)
        if self.store(session, "cold", model, **kw) is not None:
            self.note_store(n)
        elif suppressed and self.last_store_tokens == n:
            self.last_store_tokens = old

    # ------------------------------------------------------------ model resolution

    def _model(self, session: Any, model: Any, quant_bits: int | None, shape: Any) -> _Model:
        engine = model if (model is not None and hasattr(model, "info")) else getattr(session, "engine", None)
        tokenizer = model if (model is not None and hasattr(model, "encode_rendered")) else None
        if tokenizer is None and engine is not None:
            tokenizer = getattr(engine, "tokenizer", None)
        if tokenizer is None:
            raise InvalidArgumentError("KVCache needs an Engine or a tokenizer (token_to_bytes, encode_rendered)")
        for source in (getattr(engine, "info", None), engine):
            if source is None:
                continue
            if quant_bits is None:
                quant_bits = getattr(source, "routed_bits", None)
            if shape is None:
                shape = getattr(source, "shape", None)
        return _Model(tokenizer, quant_bits, shape)


def _marker_ids(tokenizer: Any) -> tuple[int | None, int | None]:
    special = getattr(tokenizer, "special", None)
    if special is not None:
        return getattr(special, "user", None), getattr(special, "assistant", None)
    id_of = getattr(tokenizer, "id_of", None)
    if id_of is not None:
        return id_of(USER_MARKER.decode()), id_of(ASSISTANT_MARKER.decode())
    return None, None


def __getattr__(name: str):  # the CLI wiring lives in ds4.kvcache_cli (which imports this module)
    if name in ("add_arguments", "from_args"):
        from . import kvcache_cli

        return getattr(kvcache_cli, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
