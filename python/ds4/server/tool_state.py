"""Tool-call state shared between requests: the exact sampled DSML block of every call id the
server handed out (:class:`ToolMemory`, for byte-exact replay, docs/server.md), and the ids of the
live session's last calls per API (:class:`LiveBindings`, for continuing the live KV when a request
only answers those calls)."""

from __future__ import annotations

import collections
import logging
import threading
from typing import Callable

__all__ = ["ToolMemory", "LiveBindings"]

log = logging.getLogger("ds4.server")


class ToolMemory:
    """Tool-call id -> the exact sampled DSML block (§8.6), LRU-bounded by id count.

    ``fallback(ids) -> {id: dsml bytes}`` is asked for ids not in memory (the disk cache's KTM
    trailers), so exact replay survives a restart. ``max_ids=0`` disables replay entirely."""

    def __init__(self, max_ids: int = 100000, fallback: Callable[[list[str]], dict] | None = None,
                 max_bytes: int = 512 * 1024 * 1024) -> None:
        self.max_ids = max_ids
        self.max_bytes = max_bytes
        self.fallback = fallback
        self._map: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._blocks: dict[str, int] = {}  # distinct block -> how many ids use it (bytes count once)
        self._bytes = 0
        self._lock = threading.Lock()

    def _drop_oldest(self) -> None:
        _, block = self._map.popitem(last=False)
        self._unref(block)

    def _unref(self, block: str) -> None:
        n = self._blocks[block] - 1
        if n:
            self._blocks[block] = n
        else:
            del self._blocks[block]
            self._bytes -= len(block)

    def __len__(self) -> int:
        return len(self._map)

    def snapshot(self) -> dict[str, bytes]:
        """All id -> DSML pairs as bytes (for a cache file's KTM trailer)."""
        with self._lock:
            return {k: v.encode("utf-8") for k, v in self._map.items()}

    def remember_pairs(self, pairs: dict) -> None:
        by_block: dict[str, list[str]] = {}
        for k, v in pairs.items():
            by_block.setdefault(v.decode("utf-8", "replace") if isinstance(v, bytes) else v, []).append(k)
        for block, ids in by_block.items():
            self.remember(ids, block)

    def remember(self, ids: list[str], raw_dsml: str) -> None:
        if self.max_ids <= 0:
            return
        with self._lock:
            for i in ids:
                old = self._map.get(i)
                if old is not None:
                    self._unref(old)
                self._map[i] = raw_dsml
                self._map.move_to_end(i)
                if raw_dsml not in self._blocks:
                    self._blocks[raw_dsml] = 0
                    self._bytes += len(raw_dsml)
                self._blocks[raw_dsml] += 1
            while self._map and (len(self._map) > self.max_ids or self._bytes > self.max_bytes):
                self._drop_oldest()

    def has(self, i: str) -> bool:
        with self._lock:
            return i in self._map

    def lookup(self, ids: list[str]) -> str | None:
        """The block shared by all ``ids`` (all known, all the same block), else None."""
        if not ids or self.max_ids <= 0:
            return None
        if self.fallback is not None:
            with self._lock:
                missing = [i for i in ids if i not in self._map]
            if missing:
                try:
                    self.remember_pairs(self.fallback(missing))
                except Exception as e:  # a disk problem only costs exact replay
                    log.warning("ds4-server: tool memory restore failed: %s", e)
        with self._lock:
            blocks = {self._map.get(i) for i in ids}
            for i in ids:
                if i in self._map:
                    self._map.move_to_end(i)
        if len(blocks) != 1 or None in blocks:
            return None
        return blocks.pop()


class LiveBindings:
    """Tool-call ids of the live session's last turn, per protocol, at the live position (§9.7):
    a later request answering exactly those calls continues the live KV. Read by client threads
    while parsing, written by the worker, hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[str, tuple[frozenset[str], int]] = {}

    def remember(self, api: str, ids, pos: int) -> None:
        with self._lock:
            self._ids[api] = (frozenset(ids), pos)

    def clear(self, api: str) -> None:
        with self._lock:
            self._ids.pop(api, None)

    def has(self, api: str, call_id: str) -> bool:
        with self._lock:
            b = self._ids.get(api)
            return b is not None and call_id in b[0]

    def matches(self, api: str, ids, pos: int) -> bool:
        with self._lock:
            b = self._ids.get(api)
            return b is not None and b[1] == pos and b[0] == frozenset(ids)
