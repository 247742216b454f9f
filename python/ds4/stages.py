"""Pipeline stages: one model split into consecutive layer ranges, chained through the HC state.

A stage is an :class:`~ds4.engine.Engine` opened with ``layers=(l0, l1)``; it binds only that
range's tensors (the first stage also embeds, the last also runs the output head and the MTP
block). What crosses a stage boundary is the hyper-connection state of each token: ``n_hc * n_embd``
floats. Chained stages compute exactly what one engine computes, bit for bit, and their payload
parts join into the same DSV4 payload byte for byte (:func:`ds4.payload.merge_payloads`)::

    >>> import ds4, ds4.testing
    >>> path = ds4.testing.default_model_path()
    >>> pipe = ds4.stages.Pipeline(path, stages=2, threads=1)
    >>> pipe.ranges
    [(0, 2), (2, 4)]
    >>> s = pipe.session(ctx=128); s.sync([5, 6, 7])
    >>> one = ds4.Engine(path, threads=1).session(ctx=128); one.sync([5, 6, 7])
    >>> bool((s.logits == one.logits).all()), s.save_payload() == one.save_payload()
    (True, True)

:class:`Pipeline` runs every stage in this process (a test and reference of the split);
:class:`ds4.distributed.PipelineEngine` runs each on its own Ray actor. Both drive stages through
:class:`StagedTimeline`, which gives them the whole :class:`~ds4.session.Session` API.
"""

from __future__ import annotations

import collections
import itertools
import os
import resource
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from .errors import CancelledError, ContextOverflowError, InvalidArgumentError, UnsupportedModelError
from .payload import PAYLOAD_HEADER_BYTES, merge_payloads, read_payload_header, split_payload

__all__ = ["split_layers", "StageHost", "StageLink", "StagedTimeline", "Pipeline"]

ProgressFn = Callable[[int, int], None]


def split_layers(n_layer: int, stages: int | Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """Layer ranges for ``stages``: a count (contiguous ranges, sizes differing by at most one, the
    larger first) or explicit ``[(l0, l1), ...]`` that must tile ``[0, n_layer)`` in order."""
    if isinstance(stages, int):
        if not 1 <= stages <= n_layer:
            raise InvalidArgumentError(f"stages={stages}: a model of {n_layer} layers splits into 1..{n_layer} stages")
        base, extra = divmod(n_layer, stages)
        bounds = [0]
        for k in range(stages):
            bounds.append(bounds[-1] + base + (1 if k < extra else 0))
        return list(zip(bounds[:-1], bounds[1:]))
    ranges = [(int(r[0]), int(r[1])) for r in stages]
    at = 0
    for l0, l1 in ranges:
        if l0 != at or l1 <= l0:
            raise InvalidArgumentError(f"stage ranges {ranges} do not tile [0, {n_layer}) in order")
        at = l1
    if at != n_layer or not ranges:
        raise InvalidArgumentError(f"stage ranges {ranges} do not tile [0, {n_layer}) in order")
    return ranges


class StageHost:
    """One stage engine and the stage sessions opened on it, addressed by id.

    Everything a call takes or returns is a plain value (ints, bytes, float32 arrays), so a host can
    live in another process: :mod:`ds4.distributed` makes it a Ray actor unchanged.
    """

    def __init__(self, path: str | os.PathLike[str], layers: tuple[int, int], threads: int | None = None,
                 prefill_chunk: int | None = None, mtp_path: str | os.PathLike[str] | None = None) -> None:
        from .engine import Engine
        self.engine = Engine(path, threads=threads, prefill_chunk=prefill_chunk, mtp_path=mtp_path,
                             layers=tuple(layers))
        self._sessions: dict[int, Any] = {}
        self._trace: collections.deque[tuple[int, int, int, float, float]] = collections.deque(maxlen=4096)

    def describe(self) -> dict[str, Any]:
        e = self.engine
        return {"layers": e.layers, "threads": e.threads, "has_mtp": e.has_mtp, "pid": os.getpid(),
                "host": socket.gethostname(), "decode_weight_bytes": int(e._model.decode_weight_bytes),
                "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}

    def open(self, sid: int, ctx: int) -> None:
        from . import _core
        self._sessions[sid] = _core.StageSession(self.engine._model, int(ctx))

    def close(self, sid: int) -> None:
        self._sessions.pop(sid, None)

    def forward(self, sid: int, tokens: np.ndarray, pos0: int, hc_in: np.ndarray | None, prefill: bool) -> np.ndarray:
        t0 = time.monotonic()
        out = self._sessions[sid].forward(tokens, pos0, hc_in, prefill)
        self._trace.append((sid, pos0, len(tokens), t0, time.monotonic()))
        return out

    def trace(self, clear: bool = True) -> list[tuple[int, int, int, float, float]]:
        """The last forward calls as ``(sid, pos0, n_tokens, start, end)`` in ``time.monotonic()``
        seconds (one clock for every process of a machine): what the benchmark and the overlap
        test read to see when each stage worked."""
        out = list(self._trace)
        if clear:
            self._trace.clear()
        return out

    def call(self, sid: int, method: str, *args: Any) -> Any:
        """A stage-session method other than forward (reset, save_payload, load_payload, ...)."""
        if method not in _SESSION_CALLS:
            raise InvalidArgumentError(f"stage sessions have no method {method!r}")
        attr = getattr(self._sessions[sid], method)
        return attr(*args) if callable(attr) else attr


_SESSION_CALLS = frozenset({"reset", "save_payload", "load_payload", "mtp_logits", "kv_bytes", "pos"})


class StageLink(Protocol):
    """How a timeline reaches one stage: ``submit`` starts a call and returns a handle, ``fetch``
    waits for handles. Handles from one stage may be passed as ``hc_in`` to the next stage's
    forward (in-process they are the arrays, on Ray they are object refs)."""

    def submit_forward(self, tokens: np.ndarray, pos0: int, hc_in: Any, prefill: bool) -> Any: ...

    def submit(self, method: str, *args: Any) -> Any: ...

    def fetch(self, handles: list[Any]) -> list[Any]: ...


class LocalLink:
    """A stage in this process: calls run when submitted; handles are the results."""

    def __init__(self, host: StageHost, sid: int) -> None:
        self.host, self.sid = host, sid

    def submit_forward(self, tokens: np.ndarray, pos0: int, hc_in: Any, prefill: bool) -> Any:
        return self.host.forward(self.sid, tokens, pos0, hc_in, prefill)

    def submit(self, method: str, *args: Any) -> Any:
        return self.host.call(self.sid, method, *args)

    def fetch(self, handles: list[Any]) -> list[Any]:
        return handles

    def close(self) -> None:
        self.host.close(self.sid)


class StagedTimeline:
    """The timeline of a :class:`~ds4.session.Session` run on a chain of stages.

    It offers the methods of the compiled session (``ds4._core.Session``) with the same semantics:
    ``sync`` reuses a prefix and otherwise rebuilds, ``rewind`` rebuilds lazily, a failure inside a
    chunk leaves the timeline to be replayed on next use, payloads are the single engine's bytes.
    Prefill chunks are submitted to every stage at once, so with stages in separate processes stage
    k works on chunk i+1 while stage k+1 works on chunk i; ``window`` bounds the chunks in flight.
    """

    def __init__(self, links: Sequence[StageLink], ranges: Sequence[tuple[int, int]], ratios: Sequence[int],
                 n_vocab: int, ctx: int, chunk_for: Callable[[int], int], has_mtp: bool,
                 window: int | None = None) -> None:
        self._links = list(links)
        self._ranges = list(ranges)
        self._ratios = list(ratios)
        self._ctx = int(ctx)
        self._chunk_for = chunk_for
        self._has_mtp = has_mtp
        self._window = window or len(self._links) + 1
        self._tokens: list[int] = []
        self._logits = np.zeros(n_vocab, dtype=np.float32)
        self._view = self._logits.view()
        self._view.flags.writeable = False
        self._has_logits = False
        self._stale = False
        self._cancel = threading.Event()
        self._vocab = n_vocab

    # ---- the compiled session's interface -----------------------------------------------------
    @property
    def pos(self) -> int:
        return len(self._tokens)

    @property
    def ctx(self) -> int:
        return self._ctx

    @property
    def tokens(self) -> list[int]:
        return list(self._tokens)

    @property
    def has_logits(self) -> bool:
        return self._has_logits

    def logits_view(self) -> np.ndarray:
        self._materialize()
        return self._view

    def argmax(self) -> int:
        self._materialize()
        if not self._has_logits:
            raise InvalidArgumentError("the session has no logits yet: evaluate a token first")
        return int(np.argmax(self._logits))

    def eval(self, token: int) -> None:
        self._check_tokens([token])
        if self.pos + 1 >= self._ctx:
            raise ContextOverflowError(f"context is full: {self.pos} tokens in a ctx of {self._ctx} (one slot stays free)")
        self._materialize()
        self._extend([int(token)], None, rebuild=False, prefill=False)

    def sync(self, tokens: Sequence[int], progress: ProgressFn | None = None) -> None:
        toks = [int(t) for t in tokens]
        n = len(toks)
        if n == 0:
            raise InvalidArgumentError("sync needs at least one token")
        if n >= self._ctx:
            raise ContextOverflowError(f"prompt of {n} tokens does not fit a context of {self._ctx} (at most ctx-1 tokens)")
        self._check_tokens(toks)
        self._cancel.clear()
        common = self.common_prefix(toks)
        if not self._stale and self.pos > 0 and common == self.pos:
            if n > self.pos:
                self._extend(toks[self.pos:], progress, rebuild=False, prefill=True)
            return
        self._extend(toks, progress, rebuild=True, prefill=True)

    def cancel(self) -> None:
        self._cancel.set()

    def rewind(self, pos: int) -> None:
        if not 0 <= pos <= self.pos:
            raise InvalidArgumentError(f"rewind position {pos} is outside [0, {self.pos}]")
        if pos == self.pos:
            return
        del self._tokens[pos:]
        self._stale = True
        self._has_logits = False

    def reset(self) -> None:
        self._fetch_all([link.submit("reset") for link in self._links])
        self._tokens.clear()
        self._logits[:] = 0.0
        self._has_logits = False
        self._stale = False

    def common_prefix(self, tokens: Sequence[int]) -> int:
        n = 0
        for a, b in zip(self._tokens, tokens):
            if a != int(b):
                break
            n += 1
        return n

    def save_payload(self) -> bytes:
        self._materialize()
        parts = self._fetch_all([link.submit("save_payload") for link in self._links])
        return merge_payloads(parts, self._ratios, self._ranges)

    def payload_size(self) -> int:
        return len(self.save_payload())

    def load_payload(self, data: bytes | bytearray | memoryview) -> None:
        parts = split_payload(bytes(data), self._ratios, self._ranges)   # validates before any stage changes
        # The first stage checks everything the others would (the header fields they share), so
        # a payload it accepts fits them all; should one still refuse, the old timeline is replayed.
        self._fetch_all([self._links[0].submit("load_payload", parts[0])])
        try:
            self._fetch_all([link.submit("load_payload", p) for link, p in zip(self._links[1:], parts[1:])])
        except BaseException:
            self._stale = True
            self._has_logits = False
            raise
        h = read_payload_header(data)
        off = PAYLOAD_HEADER_BYTES + 4 * h.tokens
        self._tokens = np.frombuffer(bytes(data[PAYLOAD_HEADER_BYTES:off]), dtype="<u4").astype(np.int64).tolist()
        self._logits[:] = np.frombuffer(bytes(data[off:off + 4 * h.n_vocab]), dtype="<f4")
        self._has_logits = bool(self._tokens)
        self._stale = False

    @property
    def kv_bytes(self) -> int:
        return int(sum(self._fetch_all([link.submit("kv_bytes") for link in self._links])))

    def mtp_logits(self) -> np.ndarray:
        if not self._has_mtp:
            raise UnsupportedModelError("this engine has no MTP block loaded")
        self._materialize()
        return np.asarray(self._fetch_all([self._links[-1].submit("mtp_logits")])[0])

    def last_hidden(self) -> np.ndarray:
        raise UnsupportedModelError("a pipeline keeps the final hidden state on its last stage")

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:   # interpreter shutdown, or a remote stage already gone
            pass

    def close(self) -> None:
        """Free the stage sessions (their KV state); the timeline is unusable afterwards."""
        for link in self._links:
            close = getattr(link, "close", None)
            if close is not None:
                close()

    # ---- internals ----------------------------------------------------------------------------
    def _fetch_all(self, handles: list[Any]) -> list[Any]:
        return self._links[0].fetch(handles) if handles else []

    def _check_tokens(self, toks: Sequence[int]) -> None:
        for i, t in enumerate(toks):
            if not 0 <= int(t) < self._vocab:
                raise InvalidArgumentError(f"token id {t} at index {i} is outside the vocabulary [0, {self._vocab})")

    def _materialize(self) -> None:
        if not self._stale:
            return
        toks = list(self._tokens)
        self._has_logits = False
        if toks:
            self._extend(toks, None, rebuild=True, prefill=True)
        else:
            self.reset()

    def _submit_chunk(self, chunk: list[int], pos0: int, prefill: bool) -> Any:
        arr = np.asarray(chunk, dtype=np.int32)
        handle = None
        for link in self._links:
            handle = link.submit_forward(arr, pos0, handle, prefill)
        return handle

    def _extend(self, toks: list[int], progress: ProgressFn | None, rebuild: bool, prefill: bool) -> None:
        if rebuild:
            self._fetch_all([link.submit("reset") for link in self._links])
            self._tokens.clear()
            self._has_logits = False
            self._stale = False
        n, base = len(toks), self.pos
        chunk = max(1, int(self._chunk_for(n)))
        bounds = [(a, min(a + chunk, n)) for a in range(0, n, chunk)]
        pending: collections.deque[tuple[int, int, Any]] = collections.deque()
        nxt = 0
        consistent = False   # set once an exception leaves every stage at the same, completed chunk
        try:
            while nxt < len(bounds) or pending:
                while nxt < len(bounds) and len(pending) < self._window:
                    a, b = bounds[nxt]
                    pending.append((a, b, self._submit_chunk(toks[a:b], base + a, prefill)))
                    nxt += 1
                self._complete(pending.popleft(), toks)
                done = self.pos - base
                try:
                    if progress is not None:
                        progress(done, n)
                    if self._cancel.is_set():
                        self._cancel.clear()
                        raise CancelledError(f"prefill cancelled after {done} of {n} tokens")
                except BaseException:
                    # Chunks already sent still land: wait for them so every stage and the token
                    # list agree again (the timeline ends at the last chunk that completed).
                    while pending:
                        self._complete(pending.popleft(), toks)
                    consistent = True
                    raise
        except BaseException:
            if not consistent:
                # A stage failed inside a chunk: replay the timeline on next use (as Session does).
                self._stale = True
                self._has_logits = False
            raise

    def _complete(self, item: tuple[int, int, Any], toks: list[int]) -> None:
        a, b, handle = item
        logits = self._links[-1].fetch([handle])[0]
        self._tokens.extend(toks[a:b])
        self._logits[:] = logits
        self._has_logits = True


class PipelineBase:
    """What :class:`Pipeline` and :class:`ds4.distributed.PipelineEngine` share: the engine-like
    surface (``session``, ``load_session``, ``generate``, ``tokenizer``, ``info``, ``shape``) over a
    list of stage links. Subclasses provide ``_links(sid, ctx)``."""

    path: Path
    ranges: list[tuple[int, int]]

    def _init_common(self, path: str | os.PathLike[str], stages: int | Sequence[Sequence[int]],
                     prefill_chunk: int | None, mtp_path: str | os.PathLike[str] | None) -> None:
        from .inspection import inspect
        if prefill_chunk is not None and int(prefill_chunk) < 1:
            raise InvalidArgumentError(f"prefill_chunk must be at least 1, got {prefill_chunk}")
        self.path = Path(path)
        self.info = inspect(self.path)
        self.info.check_supported()
        assert self.info.shape is not None
        self.shape = self.info.shape
        self.ranges = split_layers(self.shape.n_layer, stages)
        self.prefill_chunk = int(prefill_chunk or 0)
        self.has_mtp = mtp_path is not None or bool(self.info.has_mtp)
        self.mtp_path = Path(mtp_path) if mtp_path is not None else None
        self._tokenizer = None
        self._sid = itertools.count(1)

    @property
    def routed_bits(self) -> int:
        """4 when the routed experts are Q4_K, else 2 (IQ2_XXS + Q2_K)."""
        return int(self.info.routed_bits)

    @property
    def n_stages(self) -> int:
        return len(self.ranges)

    def chunk_for(self, n: int) -> int:
        """Tokens per prefill chunk for a prompt of n: ``prefill_chunk`` when set, else small
        enough that every stage has work while the chunks flow (about 2 chunks per stage, at
        least 64 tokens each, at most 4096 as a single engine)."""
        if self.prefill_chunk > 0:
            return min(self.prefill_chunk, n)
        per = -(-n // (2 * self.n_stages)) if self.n_stages > 1 else n
        return max(1, min(n, 4096, max(64, per)))

    def session(self, ctx: int = 32768) -> Any:
        from .session import Session
        return Session(self, ctx)

    def _core_session(self, ctx: int) -> StagedTimeline:
        sid = next(self._sid)
        return StagedTimeline(self._links(sid, int(ctx)), self.ranges, self.shape.compress_ratios, self.shape.n_vocab,
                              int(ctx), self.chunk_for, self.has_mtp)

    def _links(self, sid: int, ctx: int) -> list[Any]:
        raise NotImplementedError

    from .engine import Engine as _Engine
    load_session = _Engine.load_session
    check_payload = _Engine.check_payload
    generate = _Engine.generate
    tokenizer = _Engine.tokenizer
    del _Engine


class Pipeline(PipelineBase):
    """All stages of a model in this process, chained: the same results and payloads as one
    :class:`~ds4.engine.Engine`, and the same :class:`~ds4.session.Session` API. Each stage has its
    own thread pool of ``threads`` threads; stages run one after the other."""

    def __init__(self, path: str | os.PathLike[str], stages: int | Sequence[Sequence[int]] = 2,
                 threads: int | None = None, prefill_chunk: int | None = None,
                 mtp_path: str | os.PathLike[str] | None = None) -> None:
        self._init_common(path, stages, prefill_chunk, mtp_path)
        self.hosts = [StageHost(self.path, r, threads=threads, prefill_chunk=prefill_chunk, mtp_path=mtp_path)
                      for r in self.ranges]
        self.threads = self.hosts[0].engine.threads

    def _links(self, sid: int, ctx: int) -> list[LocalLink]:
        for h in self.hosts:
            h.open(sid, ctx)
        return [LocalLink(h, sid) for h in self.hosts]

    def __repr__(self) -> str:
        return f"Pipeline({str(self.path)!r}, stages={self.ranges})"
