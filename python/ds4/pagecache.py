"""The model file in the page cache, and whether the engine reads it through 2 MiB pages.

A decode step streams most of the weights once. Mapped through 4 KiB page-table entries, every
4 KiB of weights costs a TLB miss, and on the development machines that held one thread to 7-18
GB/s of weights instead of 17-22 GB/s with 2 MiB entries (docs/pagecache.md; with two threads
streaming, decode waits on the memory's bandwidth instead and ran at the same speed). The engine's map asks
for 2 MiB pages, but the kernel can only map 2 MiB at once where the page cache holds that part of
the file as one 2 MiB folio, which depends on how the file came into the cache (written, read with
``read()``, or faulted in through a map that asked for huge pages). ``probe`` tells; ``recache``
drops the file's cached pages that no process maps and reads it back through such a map.

    >>> from ds4 import pagecache
    >>> s = pagecache.probe("model.gguf")         # doctest: +SKIP
    >>> print(s)                                   # doctest: +SKIP
    model.gguf: 1.25 GB, 100 % in memory, 1 % in 2 MiB pages
    >>> pagecache.recache("model.gguf").huge_fraction   # doctest: +SKIP
    0.999

Both read the whole file (from disk where it is not cached). Linux only does huge file pages (a
kernel with transparent huge pages in ``madvise`` or ``always`` mode and a file system with large
folios, e.g. ext4 or XFS on 6.x); elsewhere ``huge`` is 0 and ``recache`` only reads the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["PageCacheState", "probe", "recache"]


@dataclass(frozen=True)
class PageCacheState:
    path: str
    size: int        # bytes in the file
    resident: int    # bytes of the map in memory after reading it through
    huge: int        # bytes of those mapped by 2 MiB page-table entries

    @property
    def huge_fraction(self) -> float:
        return self.huge / self.size if self.size else 0.0

    @property
    def resident_fraction(self) -> float:
        return min(1.0, self.resident / self.size) if self.size else 0.0

    def to_dict(self) -> dict:
        return {"path": self.path, "size": self.size, "resident": self.resident, "huge": self.huge,
                "huge_fraction": round(self.huge_fraction, 4)}

    def __str__(self) -> str:
        return (f"{os.path.basename(self.path)}: {self.size / 1e9:.2f} GB, "
                f"{100 * self.resident_fraction:.0f} % in memory, {100 * self.huge_fraction:.0f} % in 2 MiB pages")


def _state(path: str | os.PathLike, fn_name: str) -> PageCacheState:
    from . import _core

    p = os.fspath(path)
    size, resident, huge = getattr(_core, fn_name)(p)
    return PageCacheState(p, int(size), int(resident), int(huge))


def probe(path: str | os.PathLike) -> PageCacheState:
    """Map ``path`` as the engine does, read every page, and report how much is in 2 MiB pages.
    Raises ``ds4.errors.Ds4IOError`` naming the file when it cannot be opened or mapped."""
    return _state(path, "page_cache_probe")


def recache(path: str | os.PathLike) -> PageCacheState:
    """Drop the cached pages of ``path`` that no process maps (clean pages only: nothing is
    written, the file is unchanged) and read it back through a map that asks for 2 MiB pages.
    Costs one read of the file from disk. Pages that a running engine maps stay as they are, so
    call it before loading the model. Returns the state afterwards."""
    return _state(path, "page_cache_recache_huge")
