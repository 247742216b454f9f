"""Saved next-token distributions of a perplexity run (``ds4 perplexity --save-logits``), the
base that ``--kl-divergence`` compares another model or backend against.

Layout (little-endian): the 8-byte magic ``DS4LOGP1``, a u32 byte count and a JSON header
(``n_vocab``, ``window``, ``scored``, ``dtype`` and provenance; padded with spaces so records
start on a 64-byte boundary), then one fixed-size record per window: the window's ``window``
token ids (int32) followed by ``scored`` rows of ``n_vocab`` log-probabilities (float16: half
the size of float32, and log-probabilities need no more: a row's rounding error is below 4e-3
nats where p > 1e-4). The file is written as a stream (one window at a time, never all in RAM)
to a temp file renamed into place at the end; readers memory-map it.

    >>> import numpy as np, tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "base.logits"
    >>> with LogitsWriter(p, n_vocab=4, window=3, scored=2, meta={"model": "m"}) as w:
    ...     w.append(np.array([1, 2, 3]), np.log(np.full((2, 4), 0.25)))
    >>> r = LogitsReader(p)
    >>> r.n_windows, r.tokens(0).tolist(), r.rows(0).shape, round(float(r.rows(0)[0, 0]), 3)
    (1, [1, 2, 3], (2, 4), -1.387)
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ._atomic import atomic_stream
from .errors import Ds4IOError, LogitsFileError

__all__ = ["LogitsWriter", "LogitsReader", "MAGIC", "ROW_DTYPE", "quantize_rows"]

MAGIC = b"DS4LOGP1"
FORMAT = "ds4-logprobs-v1"
ROW_DTYPE = np.dtype("<f2")
_ALIGN = 64


def quantize_rows(logprobs: np.ndarray) -> np.ndarray:
    """Log-probability rows as stored (float16). Both sides of a KL comparison go through this, so
    a model compared with its own saved run matches bit for bit."""
    return np.asarray(logprobs).astype(ROW_DTYPE)


class LogitsWriter:
    """Appends windows to a new logits file; the file appears (atomically) on a clean ``close``."""

    def __init__(self, path: str | os.PathLike[str], *, n_vocab: int, window: int, scored: int,
                 meta: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.n_vocab, self.window, self.scored = int(n_vocab), int(window), int(scored)
        header = {"format": FORMAT, "n_vocab": self.n_vocab, "window": self.window, "scored": self.scored,
                  "dtype": "f16", **(meta or {})}
        body = json.dumps(header).encode()
        pad = (-(len(MAGIC) + 4 + len(body))) % _ALIGN
        self._head = MAGIC + struct.pack("<I", len(body) + pad) + body + b" " * pad
        self._cm = None
        self._fp = None
        self.n_windows = 0

    def __enter__(self) -> "LogitsWriter":
        try:
            self._cm = atomic_stream(self.path)
            self._fp = self._cm.__enter__()
            self._fp.write(self._head)
        except OSError as e:
            raise Ds4IOError(f"{self.path}: cannot write logits file: {e.strerror or e}") from None
        return self

    def append(self, tokens: np.ndarray, logprobs: np.ndarray) -> None:
        """One window: its tokens and the log-probability rows of its scored positions."""
        tokens = np.asarray(tokens, "<i4")
        rows = quantize_rows(logprobs)
        if tokens.shape != (self.window,) or rows.shape != (self.scored, self.n_vocab):
            raise LogitsFileError(f"{self.path}: window record of {tokens.shape} tokens / {rows.shape} rows, "
                                  f"expected ({self.window},) / ({self.scored}, {self.n_vocab})")
        try:
            self._fp.write(tokens.tobytes())
            self._fp.write(rows.tobytes())
        except OSError as e:
            raise Ds4IOError(f"{self.path}: cannot write logits file: {e.strerror or e}") from None
        self.n_windows += 1

    def __exit__(self, *exc: Any) -> None:
        try:
            self._cm.__exit__(*exc)
        except OSError as e:
            raise Ds4IOError(f"{self.path}: cannot write logits file: {e.strerror or e}") from None


class LogitsReader:
    """A saved logits file, memory-mapped: ``tokens(i)`` and ``rows(i)`` of window ``i``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                lead = f.read(12)
                if len(lead) < 12 or lead[:8] != MAGIC:
                    raise LogitsFileError(f"{self.path}: not a ds4 logits file (no {MAGIC.decode()} magic)")
                (hlen,) = struct.unpack("<I", lead[8:])
                raw = f.read(hlen)
            size = self.path.stat().st_size
        except OSError as e:
            raise Ds4IOError(f"{self.path}: cannot read logits file: {e.strerror or e}") from None
        try:
            self.header: dict[str, Any] = json.loads(raw.decode())
            self.n_vocab, self.window, self.scored = (int(self.header[k]) for k in ("n_vocab", "window", "scored"))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise LogitsFileError(f"{self.path}: corrupt logits header ({e})") from None
        if self.header.get("dtype") != "f16" or min(self.n_vocab, self.window, self.scored) <= 0 \
                or self.scored > self.window:
            raise LogitsFileError(f"{self.path}: unsupported logits header {self.header}")
        self._off = 12 + hlen
        self._rec = self.window * 4 + self.scored * self.n_vocab * ROW_DTYPE.itemsize
        data = size - self._off
        if data < 0 or data % self._rec:
            raise LogitsFileError(f"{self.path}: truncated: {data} data bytes is not a whole number of "
                                  f"{self._rec}-byte window records")
        self.n_windows = data // self._rec
        self._map = np.memmap(self.path, np.uint8, "r") if self.n_windows else None

    def tokens(self, i: int) -> np.ndarray:
        o = self._off + i * self._rec
        return self._map[o:o + self.window * 4].view("<i4")

    def rows(self, i: int) -> np.ndarray:
        o = self._off + i * self._rec + self.window * 4
        return self._map[o:o + self._rec - self.window * 4].view(ROW_DTYPE).reshape(self.scored, self.n_vocab)
