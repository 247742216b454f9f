"""Atomic file replacement: write to a unique temp file in the same folder, flush, fsync, rename.

A reader sees either the old file or the complete new one, never a partial write; on any error
the temp file is removed and the error propagates. Used by the disk KV cache
(:mod:`ds4.kvcache_format`); the temp name ``<name>.tmp.<pid>.<random>`` is part of the contract
(the cache recognises stale temp files of dead writers by it).
"""

from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

__all__ = ["temp_path", "write_atomic", "atomic_stream"]


def temp_path(path: Path) -> Path:
    """``<path>.tmp.<pid>.<random>``: unique per writer, in the same folder as ``path``."""
    return path.with_name(f"{path.name}.tmp.{os.getpid()}.{secrets.token_hex(6)}")


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


def write_atomic(path: Path, chunks: Iterable[bytes], *, fsync: bool = True) -> int:
    """Write ``chunks`` to ``path`` via a unique temp file + flush + fsync + rename (and an fsync
    of the folder, so the rename survives a crash). Returns the number of bytes written.

    ``fsync=False`` skips both fsyncs (tests, throwaway data): the rename stays atomic for readers.
    """
    written = 0
    with atomic_stream(path, fsync=fsync) as fp:
        for chunk in chunks:
            fp.write(chunk)
            written += len(chunk)
    return written


@contextmanager
def atomic_stream(path: Path, *, fsync: bool = True) -> Iterator[BinaryIO]:
    """A binary file to write ``path`` incrementally (data too large to hold in memory): it is the
    unique temp file, renamed over ``path`` (after flush + fsync) only when the block ends without
    an exception; on any error or interrupt the temp file is removed and ``path`` is untouched."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        with open(tmp, "xb") as fp:
            yield fp
            fp.flush()
            if fsync:
                os.fsync(fp.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if fsync:
        _fsync_dir(path.parent)
